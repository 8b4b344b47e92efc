// The window kernels' per-tile steps (window_mma_v9.cuh, window_wgmma_v18.cuh and
// window_wgmma_v19.cuh build on them): mma_v9's base-2 softmax of a tile (exp2_approx,
// raise_to_tile_max, scale_rows, rescale_to_tile_max, exponentiate_tile; v18 runs it too), the
// epilogue that stores o_swa and lse_swa (store_window_rows), each row's window bounds
// (WindowRowBounds, window_row_bounds) and the wgmma kernels' tile mask (WindowTileMask,
// mask_window_tile).
#pragma once

#include <cuda_fp16.h>

#include <climits>
#include <cstdint>

#include "launch_params.hpp"
#include "mma_common.cuh"
#include "packed_kernels/common.cuh"

namespace hils::gpu::detail {
namespace {

__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// The per-tile softmax and the epilogue shared by window_v9_kernel (mma.sync) and the wgmma
// kernels: a warp's 16 rows x 64 keys as s[8][4] in mma.sync's accumulator layout,
// which is also a warp's share of a wgmma m64n64 accumulator. Scores s are in units of the logit
// scale; c2 = scale * log2(e) (base-2 softmax), m the rows' running maxima of s.

// Raises the rows' maxima m to the tile's and rescales their sums l; alpha gets the factor the
// rows' outputs o must be scaled by (scale_rows), neg_max2 gets -m * c2 per row (0 for a row
// that has seen nothing).
__device__ __forceinline__ void raise_to_tile_max(const float (&s)[8][4], float c2, float (&m)[2],
                                                  float (&l)[2], float (&alpha)[2],
                                                  float (&neg_max2)[2]) {
  float tile_max[2] = {kNegInf, kNegInf};
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) tile_max[e / 2] = fmaxf(tile_max[e / 2], s[nt][e]);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float m_new = fmaxf(m[i], quad_max(tile_max[i]));
    neg_max2[i] = m_new == kNegInf ? 0.0f : -m_new * c2;
    alpha[i] = exp2_approx(fmaf(m[i], c2, neg_max2[i]));  // 0 while m = -inf
    m[i] = m_new;
    l[i] *= alpha[i];
  }
}
__device__ __forceinline__ void scale_rows(float (&o)[8][4], const float (&alpha)[2]) {
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[nt][e] *= alpha[e / 2];
}
// Both: the rows' maxima raised to the tile's, their sums and outputs rescaled.
__device__ __forceinline__ void rescale_to_tile_max(const float (&s)[8][4], float c2, float (&m)[2],
                                                    float (&l)[2], float (&o)[8][4],
                                                    float (&neg_max2)[2]) {
  float alpha[2];
  raise_to_tile_max(s, c2, m, l, alpha, neg_max2);
  scale_rows(o, alpha);
}

// s -> the tile's probabilities 2^(s c2 - m c2), added into the rows' sums l; the 8-key groups
// from nt_end on (past the warp's last query) become 0.
__device__ __forceinline__ void exponentiate_tile(float (&s)[8][4], int nt_end, float c2,
                                                  const float (&neg_max2)[2], float (&l)[2]) {
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
    if (nt >= nt_end) {
      s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
      continue;
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s[nt][e] = exp2_approx(fmaf(s[nt][e], c2, neg_max2[e / 2]));  // -inf -> 0
      l[e / 2] += s[nt][e];
    }
  }
}

// The rows' o_swa (o / sum) and lse_swa (m * scale + ln sum; -inf for an empty row); o_swa in
// fp16 (rounded to nearest from the fp32 value) where p.o_swa_rows is f16.
template <int G>
__device__ __forceinline__ void store_window_rows(const ThreadRows<G>& rows, const LaunchParams& p,
                                                  const float (&o)[8][4], const float (&l)[2],
                                                  const float (&m)[2], int lane, float* o_swa,
                                                  float* lse_swa) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float sum = quad_sum(l[i]);
    if (!rows.valid[i]) continue;
    const int64_t row = (rows.h[i] * p.T + rows.t[i]) * kTileDim;
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    if (p.o_swa_rows == RowType::f16) {
      __half* out = reinterpret_cast<__half*>(o_swa) + row;
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        const int col = nt * 8 + (lane % 4) * 2;
        *reinterpret_cast<__half2*>(out + col) = __floats2half2_rn(o[nt][2 * i] * inv, o[nt][2 * i + 1] * inv);
      }
    } else {
      float* out = o_swa + row;
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        const int col = nt * 8 + (lane % 4) * 2;
        *reinterpret_cast<float2*>(out + col) = make_float2(o[nt][2 * i] * inv, o[nt][2 * i + 1] * inv);
      }
    }
    if (lane % 4 == 0)
      lse_swa[rows.h[i] * p.T + rows.t[i]] = sum > 0.0f ? m[i] * p.scale + __logf(sum) : kNegInf;
  }
}

// The window columns of a thread's two rows (of a block of 16-row warps whose rows are the
// slots (query t0 + r / G, head g G + r % G)), relative to `first` (the block's leftmost window
// slot): row i sees [lo[i], hi[i]], a row past T nothing (lo INT_MAX, hi -1); lo_max / hi_min
// bound every valid row of the warp (a tile inside [lo_max, hi_min] is inside every row's window).
struct WindowRowBounds {
  int lo[2], hi[2];
  int lo_max, hi_min;
};
template <int G>
__device__ __forceinline__ WindowRowBounds window_row_bounds(const SlotGeometry& geo, int64_t T,
                                                             int64_t t0, int64_t g, int64_t first) {
  WindowRowBounds b;
  bool valid1;
  {
    const ThreadRows<G> rows(t0, g, T);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      b.lo[i] = rows.valid[i] ? static_cast<int>(geo.window_left(rows.t[i]) - first) : INT_MAX;
      b.hi[i] = rows.valid[i] ? static_cast<int>(rows.t[i] - first) : -1;
    }
    valid1 = rows.valid[1];
  }
  // Rows go down the block in slot order: row 1 valid implies row 0 valid.
  const unsigned all = 0xffffffffu;
  b.lo_max = __reduce_max_sync(all, valid1 ? b.lo[1] : (b.hi[0] >= 0 ? b.lo[0] : INT_MIN));
  b.hi_min = __reduce_min_sync(all, valid1 ? b.hi[0] : (b.hi[0] >= 0 ? b.hi[0] : INT_MAX));
  return b;
}

// A warp's masks of its 16 rows x 64 keys (columns relative to the block's first window slot):
// the rows' windows (a tile inside [lo_max, hi_min] needs only the landmark column);
// complete_col ends the complete chunks (their last slot is a landmark when `landmarks`).
struct WindowTileMask {
  const WindowRowBounds& rows;
  int complete_col;
  bool landmarks;
};
// Masked scores of the tile at key0 become -inf; so do the 8-key groups from nt_end on.
__device__ __forceinline__ void mask_window_tile(float (&s)[8][4], int key0, int nt_end,
                                                 const WindowTileMask& mask, int lane) {
  const bool inside = mask.rows.lo_max <= key0 && mask.rows.hi_min >= key0 + kTileDim - 1;
  const bool landmark_col = mask.landmarks && key0 + kTileDim <= mask.complete_col;
  if (inside) {
    if (landmark_col && lane % 4 == 3) s[7][1] = s[7][3] = kNegInf;
  } else {
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = e / 2, col = key0 + nt * 8 + (lane % 4) * 2 + (e % 2);
        const bool landmark = landmark_col && (col % kTileDim) == kTileDim - 1;
        if (nt >= nt_end || col < mask.rows.lo[i] || col > mask.rows.hi[i] || landmark)
          s[nt][e] = kNegInf;
      }
  }
}

}  // namespace
}  // namespace hils::gpu::detail
