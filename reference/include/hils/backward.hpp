// Gradients of every mechanism with the selection held fixed (reference/SEMANTICS.md
// §6): streaming, blocked like the forward, the same bits for any thread count.
#pragma once

#include <vector>

#include "hils/attention.hpp"

namespace hils {

// Upstream gradients of the loss with respect to run_mechanism's outputs (all T queries).
template <class Scalar>
struct OutputGradients {
  std::vector<Matrix<Scalar>> d_o;    // Hq x [T x dv]
  std::vector<Vector<Scalar>> d_lse;  // empty (zero) or Hq x [T]
};

// Gradients with respect to run_mechanism's inputs, shaped like them.
template <class Scalar>
struct InputGradients {
  std::vector<Matrix<Scalar>> dq;            // Hq x [T x d] (includes dq~ when q~ = q)
  std::vector<Matrix<Scalar>> dk;            // Hkv x [T x d]
  std::vector<Matrix<Scalar>> dv;            // Hkv x [T x dv]
  std::vector<Matrix<Scalar>> dq_retrieval;  // Hq x [T x d] when inputs.q_retrieval is given
  std::vector<Matrix<Scalar>> dprior;        // like inputs.prior for shared/given priors
};

// Gradients of L = sum do.o + sum dlse.lse over all T queries. `selection` (Hkv x [T x K],
// -1 padded, as in MechanismOutputs) is the one the forward used; it is ignored (may be empty)
// for full and window fusion. `forward` (optional) is run_mechanism's output on the same
// inputs for all T queries, with RunOptions::keep_window for a selecting spec: each row's window
// (or full) softmax output and lse are then read from it instead of recomputed (the same bits,
// about a fifth less work). Throws InvalidArgument for bad shapes, non-finite gradients, a
// forward of the wrong shape, or a selection row naming a chunk outside V(t) or twice.
template <class Scalar>
InputGradients<Scalar> run_mechanism_backward(const MechanismSpec& spec,
                                              const AttentionInputs<Scalar>& inputs,
                                              const std::vector<IndexMatrix>& selection,
                                              const OutputGradients<Scalar>& grads,
                                              const MechanismOutputs<Scalar>* forward = nullptr);

// Backward of summarize (reference/SEMANTICS.md §3) for one query head: given dkey
// [n_chunks x d] and dbias [n_chunks], the gradients with respect to k [T x d] and the resolved
// prior [n_chunks x d].
template <class Scalar>
struct SummaryGradients {
  Matrix<Scalar> dk;
  Matrix<Scalar> dprior;
};
template <class Scalar>
SummaryGradients<Scalar> summarize_backward(const Matrix<Scalar>& k, const Matrix<Scalar>& prior,
                                            KeyRule key_rule, BiasRule bias_rule,
                                            const Geometry& geometry, Scalar scale,
                                            const Matrix<Scalar>& dkey,
                                            const Vector<Scalar>& dbias);

}  // namespace hils
