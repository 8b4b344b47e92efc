// The exact chunk log-mass L(t,c) = LSE_{j in T_c} s(t,j) (paper Eq. 3; SEMANTICS §3), the
// studies' hot path, O(T^2 d) per head. Two implementations of one function:
//
// - fused (double, built for a CPU with AVX-512, i.e. -march=native there): the logits of a
//   chunk's keys are computed for a few queries at a time by a register-blocked kernel that
//   reads the keys from panels prepared once per key matrix (no per-block packing); the chunk's
//   max, exponentials and sum follow while its logits are in L1. Its exponential is
//   exp_nonpositive8 (table of 2^(j/16) plus a degree-7 polynomial, ~12 FMAs per 8 values
//   instead of ~17), so that at d = 64 the exponentials cost about a fifth of the products.
// - plain (every other type, or no AVX-512): Eigen products over 256 keys, then the same
//   reductions with exp_nonpositive (blocks.hpp).
//
// Both reduce each chunk in key order inside one query's computation, so results do not depend
// on the number of threads; the two differ from each other by rounding only (tested:
// tests/reference/test_chunk_mass.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include <Eigen/Core>

#include "blocks.hpp"

#if defined(__AVX512F__)
#define HILS_FUSED_CHUNK_MASS 1
#include <immintrin.h>
#endif

namespace hils::detail {

// Keys as the chunk log-mass reads them, prepared once per key matrix for all query blocks.
// With the fused kernel (panels non-empty): chunk c's attendable keys transposed, [d x width]
// at panels[c * d * width], width = tokens per chunk rounded up to 8, the padding keys 0.
template <class Scalar>
struct ChunkKeys {
  const Matrix<Scalar>* k = nullptr;
  std::vector<Scalar, Eigen::aligned_allocator<Scalar>> panels;
  int64_t width = 0;
};

// k: [T x d] -> the keys of the n_chunks complete chunks; `fused` false forces the plain path
// (tests compare the two).
template <class Scalar>
ChunkKeys<Scalar> prepare_chunk_keys(const Matrix<Scalar>& k, const Geometry& geometry,
                                     bool fused = true);

// L(t,c) of the block's queries: [n x n_chunks], -inf outside V(t).
template <class Scalar>
Matrix<Scalar> block_chunk_log_mass(const Matrix<Scalar>& q_rows,
                                    const std::vector<int64_t>& queries,
                                    const QueryBlock& block, const ChunkKeys<Scalar>& keys,
                                    const Geometry& geometry, Scalar scale);

// Whether this build has the fused kernel.
constexpr bool fused_chunk_mass_built() {
#ifdef HILS_FUSED_CHUNK_MASS
  return true;
#else
  return false;
#endif
}

#ifdef HILS_FUSED_CHUNK_MASS
// exp(x) of 8 values x <= 0 (a logit minus its chunk's maximum). x = (16 n + j) ln2/16 + r with
// |r| <= ln2/32; exp(x) = 2^n (T_j + T_j q(r) + t_j), where T_j + t_j is 2^(j/16) to ~2^-64
// (head and tail, from exp2l) and q(r) = exp(r) - 1 is its degree-7 Taylor polynomial
// (truncation < 2^-59 relative). Worst error measured against std::exp over [-708, 0]: see
// tests/reference/test_exp.cpp (<= 1 ulp asserted). Below -708, and at -inf, exactly 0; NaN
// stays NaN.
__m512d exp_nonpositive8(__m512d x);
#endif

}  // namespace hils::detail
