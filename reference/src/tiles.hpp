// AVX-512 building blocks of the reference's fused kernels (chunk_mass.cpp, blocks.cpp,
// fused_backward.cpp): register-tiled logits and weighted sums, transposes, masks and the
// vector exponential. Only built for a CPU with AVX-512 (-march=native there); elsewhere the
// plain Eigen paths run.
#pragma once

#if defined(__AVX512F__)
#define HILS_FUSED_KERNELS 1
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <limits>

#include "hils/geometry.hpp"

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

// Added to every row of a step's logits of keys [k0, k0 + width), padded to `padded`:
// column_mask[j] = -inf at landmark slots and the padding, else 0. Returns whether any is -inf.
inline bool key_column_mask(const Geometry& geometry, int64_t k0, int64_t width, int64_t padded,
                            double* column_mask) {
  bool columns_masked = false;
  for (int64_t j = 0; j < padded; ++j) {
    const bool masked = j >= width || geometry.is_landmark(k0 + j);
    column_mask[j] = masked ? -std::numeric_limits<double>::infinity() : 0.0;
    columns_masked |= masked;
  }
  return columns_masked;
}

// One query's logits of those keys in place: -inf outside [left, right], at landmark slots and
// in the padding (exp gives 0 there).
inline void mask_row(double* row, int64_t k0, int64_t width, int64_t padded, int64_t left,
                     int64_t right, const double* column_mask, bool columns_masked) {
  if (k0 >= left && k0 + width - 1 <= right) {
    if (columns_masked)
      for (int64_t j = 0; j < padded; j += kLanes)
        _mm512_storeu_pd(row + j, _mm512_add_pd(_mm512_loadu_pd(row + j),
                                                _mm512_loadu_pd(column_mask + j)));
  } else {
    for (int64_t j = 0; j < padded; ++j)
      if (k0 + j < left || k0 + j > right) row[j] = -std::numeric_limits<double>::infinity();
      else row[j] += column_mask[j];
  }
}

// acc[q][:] = acc[q][:] + sum_j p[q][j] v[j][:] over `keys` rows of v (dv wide) for kQ query
// rows, kV vectors of 8 output dimensions from `first`: p in key order, one FMA each. With
// kPartial, one vector of the dv - first < 8 dimensions left (masked loads read no memory past
// the row). A masked load in the loop of a full tile made GCC 12 store all 24 accumulators to
// the stack on every key (the kernel ran at a third of logit_tile's rate), hence two kinds.
template <int kQ, int kV, bool kPartial>
inline void weighted_values_tile(const double* p, int64_t p_stride, int64_t keys, const double* v,
                                 int64_t dv, int64_t first, double* acc, int64_t acc_stride) {
  static_assert(!kPartial || kV == 1, "a partial tile is one vector");
  const __mmask8 lanes = kPartial ? static_cast<__mmask8>((1u << (dv - first)) - 1) : 0xff;
  __m512d out[kQ][kV];
  for (int q = 0; q < kQ; ++q)
    for (int c = 0; c < kV; ++c)
      out[q][c] = _mm512_maskz_loadu_pd(lanes, acc + q * acc_stride + first + c * kLanes);
  for (int64_t j = 0; j < keys; ++j) {
    __m512d weight[kQ];
    for (int q = 0; q < kQ; ++q) weight[q] = _mm512_set1_pd(p[q * p_stride + j]);
    const double* row = v + j * dv + first;
    for (int c = 0; c < kV; ++c) {
      const __m512d value = kPartial ? _mm512_maskz_loadu_pd(lanes, row + c * kLanes)
                                     : _mm512_loadu_pd(row + c * kLanes);
      for (int q = 0; q < kQ; ++q) out[q][c] = _mm512_fmadd_pd(weight[q], value, out[q][c]);
    }
  }
  for (int q = 0; q < kQ; ++q)
    for (int c = 0; c < kV; ++c)
      _mm512_mask_storeu_pd(acc + q * acc_stride + first + c * kLanes, lanes, out[q][c]);
}

template <int kQ>
inline void weighted_values(const double* p, int64_t p_stride, int64_t keys, const double* v,
                            int64_t dv, double* acc, int64_t acc_stride) {
  for (int64_t first = 0; first < dv; first += kTileVectors * kLanes) {
    const int64_t full = std::min<int64_t>(kTileVectors, (dv - first) / kLanes);
    switch (full) {
      case 0: break;
      case 1: weighted_values_tile<kQ, 1, false>(p, p_stride, keys, v, dv, first, acc, acc_stride); break;
      case 2: weighted_values_tile<kQ, 2, false>(p, p_stride, keys, v, dv, first, acc, acc_stride); break;
      case 3: weighted_values_tile<kQ, 3, false>(p, p_stride, keys, v, dv, first, acc, acc_stride); break;
      case 4: weighted_values_tile<kQ, 4, false>(p, p_stride, keys, v, dv, first, acc, acc_stride); break;
      case 5: weighted_values_tile<kQ, 5, false>(p, p_stride, keys, v, dv, first, acc, acc_stride); break;
      case 6: weighted_values_tile<kQ, 6, false>(p, p_stride, keys, v, dv, first, acc, acc_stride); break;
      case 7: weighted_values_tile<kQ, 7, false>(p, p_stride, keys, v, dv, first, acc, acc_stride); break;
      default: weighted_values_tile<kQ, 8, false>(p, p_stride, keys, v, dv, first, acc, acc_stride); break;
    }
    if (full < kTileVectors && first + full * kLanes < dv)
      weighted_values_tile<kQ, 1, true>(p, p_stride, keys, v, dv, first + full * kLanes, acc,
                                        acc_stride);
  }
}

// chunk_logits and weighted_values for `count` rows, 1 to kTileQueries.
inline void chunk_logits_rows(int64_t count, const double* q_scaled, int64_t d,
                              const double* panel, int64_t width, double* out) {
  switch (count) {
    case 1: chunk_logits<1>(q_scaled, d, panel, width, out); break;
    case 2: chunk_logits<2>(q_scaled, d, panel, width, out); break;
    default: chunk_logits<3>(q_scaled, d, panel, width, out); break;
  }
}
inline void weighted_values_rows(int64_t count, const double* p, int64_t p_stride, int64_t keys,
                                 const double* v, int64_t dv, double* acc, int64_t acc_stride) {
  switch (count) {
    case 1: weighted_values<1>(p, p_stride, keys, v, dv, acc, acc_stride); break;
    case 2: weighted_values<2>(p, p_stride, keys, v, dv, acc, acc_stride); break;
    default: weighted_values<3>(p, p_stride, keys, v, dv, acc, acc_stride); break;
  }
}

// out[dim * stride + j] = rows[j * row_stride + dim] for j in [0, keys), dim in [0, d): 8 x 8
// blocks through registers (whole cache lines stored; a scalar transpose here cost a third of
// the attention kernel at d = 128), the ragged edges one by one.
void transpose_rows(const double* rows, int64_t row_stride, int64_t keys, int64_t d,
                    double* out, int64_t stride);

// exp(x) of 8 values x <= 0 (a logit minus its maximum). x = (16 n + j) ln2/16 + r with
// |r| <= ln2/32; exp(x) = 2^n (T_j + T_j q(r) + t_j), where T_j + t_j is 2^(j/16) to ~2^-64
// (head and tail, from exp2l) and q(r) = exp(r) - 1 is its degree-7 Taylor polynomial
// (truncation < 2^-59 relative): ~12 FMAs per 8 values (exp_nonpositive: ~17). Within 1 ulp
// of std::exp over [-708, 0] (tests/reference/test_exp.cpp; ~0.55 ulp from the exact value at
// worst seen). Below -708, and at -inf, exactly 0; NaN stays NaN.
__m512d exp_nonpositive8(__m512d x);

}  // namespace hils::detail

#endif
