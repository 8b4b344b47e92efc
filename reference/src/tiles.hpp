// AVX-512 building blocks of the reference's fused kernels (chunk_mass.cpp, blocks.cpp):
// register-tiled logits and the vector exponential. Only built for a CPU with AVX-512
// (-march=native there); elsewhere the plain Eigen paths run.
#pragma once

#if defined(__AVX512F__)
#define HILS_FUSED_KERNELS 1
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

namespace hils::detail {

inline constexpr int kLanes = 8;         // doubles per AVX-512 register
inline constexpr int kTileQueries = 3;   // queries per register tile
inline constexpr int kTileVectors = 8;   // key vectors per register tile: 3 x 8 accumulators of 32

// acc[q][v] = logits of queries q (rows of q_scaled, `d` apart) with the panel's keys
// [8v, 8v + 8) of this tile: sum over the d dimensions in order, one FMA each.
template <int kQ, int kV>
inline void logit_tile(const double* q_scaled, int64_t d, const double* panel, int64_t width,
                double* out, int64_t out_stride) {
  __m512d acc[kQ][kV];
  for (int q = 0; q < kQ; ++q)
    for (int v = 0; v < kV; ++v) acc[q][v] = _mm512_setzero_pd();
  for (int64_t dim = 0; dim < d; ++dim) {
    __m512d query[kQ];
    for (int q = 0; q < kQ; ++q) query[q] = _mm512_set1_pd(q_scaled[q * d + dim]);
    const double* keys = panel + dim * width;
    for (int v = 0; v < kV; ++v) {
      const __m512d key = _mm512_loadu_pd(keys + v * kLanes);
      for (int q = 0; q < kQ; ++q) acc[q][v] = _mm512_fmadd_pd(query[q], key, acc[q][v]);
    }
  }
  for (int q = 0; q < kQ; ++q)
    for (int v = 0; v < kV; ++v) _mm512_storeu_pd(out + q * out_stride + v * kLanes, acc[q][v]);
}

// The logits of kQ queries with the chunk's `width` keys (a multiple of 8) into out[q][width].
template <int kQ>
inline void chunk_logits(const double* q_scaled, int64_t d, const double* panel, int64_t width,
                  double* out) {
  for (int64_t v0 = 0; v0 < width / kLanes; v0 += kTileVectors) {
    const double* keys = panel + v0 * kLanes;
    double* dest = out + v0 * kLanes;
    switch (std::min<int64_t>(kTileVectors, width / kLanes - v0)) {
      case 1: logit_tile<kQ, 1>(q_scaled, d, keys, width, dest, width); break;
      case 2: logit_tile<kQ, 2>(q_scaled, d, keys, width, dest, width); break;
      case 3: logit_tile<kQ, 3>(q_scaled, d, keys, width, dest, width); break;
      case 4: logit_tile<kQ, 4>(q_scaled, d, keys, width, dest, width); break;
      case 5: logit_tile<kQ, 5>(q_scaled, d, keys, width, dest, width); break;
      case 6: logit_tile<kQ, 6>(q_scaled, d, keys, width, dest, width); break;
      case 7: logit_tile<kQ, 7>(q_scaled, d, keys, width, dest, width); break;
      default: logit_tile<kQ, 8>(q_scaled, d, keys, width, dest, width); break;
    }
  }
}

// exp(x) of 8 values x <= 0 (a logit minus its maximum). x = (16 n + j) ln2/16 + r with
// |r| <= ln2/32; exp(x) = 2^n (T_j + T_j q(r) + t_j), where T_j + t_j is 2^(j/16) to ~2^-64
// (head and tail, from exp2l) and q(r) = exp(r) - 1 is its degree-7 Taylor polynomial
// (truncation < 2^-59 relative): ~12 FMAs per 8 values (exp_nonpositive: ~17). Within 1 ulp
// of std::exp over [-708, 0] (tests/reference/test_exp.cpp; ~0.55 ulp from the exact value at
// worst seen). Below -708, and at -inf, exactly 0; NaN stays NaN.
__m512d exp_nonpositive8(__m512d x);

}  // namespace hils::detail

#endif
