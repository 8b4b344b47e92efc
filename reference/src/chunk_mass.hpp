// The exact chunk log-mass L(t,c) = LSE_{j in T_c} s(t,j) (paper Eq. 3; SEMANTICS §3), the
// studies' hot path, O(T^2 d) per head. Two implementations of one function:
//
// - fused (double, built for a CPU with AVX-512, i.e. -march=native there): the logits of a
//   chunk's keys are computed for a few queries at a time by a register-blocked kernel that
//   reads the keys from panels prepared once per key matrix (no per-block packing); the chunk's
//   max, exponentials and sum follow while its logits are in L1. Its exponential is
//   exp_nonpositive8 (tiles.hpp), so that at d = 64 the exponentials cost about a fifth of the
//   products.
// - plain (every other type, or no AVX-512): Eigen products over 256 keys, then the same
//   reductions with exp_nonpositive (blocks.hpp).
//
// Both reduce each chunk in key order inside one query's computation, so results do not depend
// on the number of threads; the two differ from each other by rounding only (tested:
// tests/reference/test_fused_kernels.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include <Eigen/Core>

#include "blocks.hpp"

#include "tiles.hpp"

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
#ifdef HILS_FUSED_KERNELS
  return true;
#else
  return false;
#endif
}

}  // namespace hils::detail
