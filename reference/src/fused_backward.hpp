// The window (or full) softmax's gradients in double with the fused AVX-512 kernels of
// tiles.hpp: one pass at FlashAttention's 10d flops per logit, where backward.cpp's Eigen path
// takes two passes and 14d (README "The reference's speed"). Built only with AVX-512
// (HILS_FUSED_KERNELS); run_mechanism_backward uses it for double there.
//
// Work is cut into tiles of 64 queries (block i) x 64 keys (block j); one tile computes P~ and
// dS once and from them dq of block i and dk, dv of block j. dq of block i adds its tiles in
// descending j, dk and dv of block j in ascending i (the heads of a KV group in order in each
// tile): the same order, hence the same bits, for any thread count, with no atomics on the
// outputs. Threads take units of tiles in waves of i - j and a unit waits only for the two
// units before it that write its rows (fused_backward.cpp). It differs from the Eigen path by
// rounding only (tests/reference/test_fused_kernels.cpp).
#pragma once

#include <vector>

#include "blocks.hpp"
#include "hils/backward.hpp"
#include "tiles.hpp"

namespace hils::detail {

// run_mechanism_backward, with `fused` false taking the Eigen path for the window softmax in
// double too (tests compare the two).
template <class Scalar>
InputGradients<Scalar> mechanism_backward(const MechanismSpec& spec,
                                          const AttentionInputs<Scalar>& inputs,
                                          const std::vector<IndexMatrix>& selection,
                                          const OutputGradients<Scalar>& grads,
                                          const MechanismOutputs<Scalar>* forward, bool fused);

}  // namespace hils::detail

#ifdef HILS_FUSED_KERNELS

namespace hils::detail {

// Per query head h (of KV group h / G, G = heads / KV groups): its rows' softmax as the
// backward describes it (reference/SEMANTICS.md §6): P~(t, j) = exp(s(t, j) - lambda(t)) for
// the keys j of the window A(t) (window_only) or of [0, t], attendable only, and
// dS = P~ (do_t . v_j - delta(t)).
struct SoftmaxGradientInputs {
  const std::vector<Matrix<double>>& q;    // Hq x [T x d]
  const std::vector<Matrix<double>>& d_o;  // Hq x [T x dv]
  const std::vector<Matrix<double>>& k;    // Hkv x [T x d]
  const std::vector<Matrix<double>>& v;    // Hkv x [T x dv]
  const std::vector<const Vector<double>*>& lambda;  // Hq x [T]
  const std::vector<const Vector<double>*>& delta;   // Hq x [T]
  const Geometry& geometry;
  double scale;  // sigma: s(t, j) = sigma q_t . k_j
  bool window_only;
};

// Adds dq_t += sigma sum_j dS k_j into dq[h], and dk_j += sigma sum_t dS q_t, dv_j +=
// sum_t P~ do_t over the group's heads into dk[g], dv[g].
void fused_softmax_backward(const SoftmaxGradientInputs& in, std::vector<Matrix<double>>& dq,
                            std::vector<Matrix<double>>& dk, std::vector<Matrix<double>>& dv);

}  // namespace hils::detail

#endif
