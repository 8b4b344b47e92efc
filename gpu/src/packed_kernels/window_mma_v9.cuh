// Window kernel mma_v9 (WindowKernel::mma_v9; launch_window_v9 in packed_kernels.cu): mma.sync
// on blocks of 128 rows, K/V tiles double-buffered by cp.async. Its block geometry (kV9Warps,
// kWindowRows, kWindowThreads), its shared memory (WindowSmem) and window_v9_kernel.
#pragma once

#include <cstdint>

#include "launch_params.hpp"
#include "mma_common.cuh"
#include "packed_kernels/common.cuh"
#include "packed_kernels/window_tiles.cuh"

namespace hils::gpu::detail {
namespace {

// ---- window v9: 128 rows per block, masks only where a tile cuts a row's window ----------
// Block = 8 warps x 16 rows = M = 128 / G adjacent queries x the G heads of one KV group, so
// each K/V tile in shared memory serves 128 rows (mma_v4, removed in session 17: 64). Per warp and tile, from the bounds
// of its rows' windows: tiles outside them are skipped, tiles inside them run without the
// element mask (the landmark column only), and in the causal edge tile only the 8-key
// column groups up to the warp's last query are computed. The softmax runs in base 2 with the
// scale folded into one FFMA per score, row sums stay per thread until the end.
// 8 warps (mma_v10's 4, 64 rows per block, were removed in session 17: gpu/NOTES.md "Kernels
// removed in session 17"); 128 registers (16 warps per SM).
constexpr int kV9Warps = 8;

constexpr int kWindowRows = 16 * kV9Warps, kWindowThreads = kWarp * kV9Warps;

// Shared memory of window_v9_kernel: two K/V stages and the block's kWindowRows q rows (the q
// fragments are read per tile by ldmatrix instead of living in 16 registers through the loop).
struct WindowSmem {
  __nv_bfloat16 k[2][kTileDim][kTilePitch];
  __nv_bfloat16 v[2][kTileDim][kTilePitch];
  __nv_bfloat16 q[kWindowRows][kTilePitch];
};

template <int G>
__global__ void __launch_bounds__(kWindowThreads, 16 / kV9Warps)
    window_v9_kernel(LaunchParams p, float* o_swa, float* lse_swa) {
  constexpr int M = kWindowRows / G;
  extern __shared__ __align__(16) unsigned char window_smem[];
  auto& sm = *reinterpret_cast<WindowSmem*>(window_smem);
  auto& ks_tile = sm.k;
  auto& vs_tile = sm.v;
  const SlotGeometry geo{p.T, p.S, p.W, p.landmarks};
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * M, g = blockIdx.y;
  const auto* k = static_cast<const __nv_bfloat16*>(p.k) + g * p.T * kTileDim;
  const auto* v = static_cast<const __nv_bfloat16*>(p.v) + g * p.T * kTileDim;
  // Columns relative to `first` (the block's leftmost window slot, a multiple of S = 64): row i
  // sees [lo_i, hi_i]; a row past T sees nothing. (The rows are derived again for the output:
  // fewer registers live through the loop.)
  const int64_t first = geo.window_left(t0);
  const int64_t t_last = t0 + M - 1 < p.T - 1 ? t0 + M - 1 : p.T - 1;
  const int n_tiles = static_cast<int>((t_last - first) / kTileDim + 1);
  const bool landmarks_complete = p.landmarks;
  const int complete_col = static_cast<int>((p.T / kTileDim) * kTileDim - first);
  // q rows r = (query t0 + r / G, head g G + r % G), zeros past T, with the first K/V tile.
  {
    const auto* q = static_cast<const __nv_bfloat16*>(p.q);
    for (int seg = threadIdx.x; seg < kWindowRows * 8; seg += kWindowThreads) {
      const int r = seg / 8, col = (seg % 8) * 8;
      const int64_t t = t0 + r / G, h = g * G + r % G;
      cp_async16(&sm.q[r][col], q + (t < p.T ? (h * p.T + t) * kTileDim + col : 0), t < p.T);
    }
  }
  const WindowRowBounds bounds = window_row_bounds<G>(geo, p.T, t0, g, first);
  const int(&lo)[2] = bounds.lo;
  const int(&hi)[2] = bounds.hi;
  const int lo_max = bounds.lo_max, hi_min = bounds.hi_min;
  const unsigned all = 0xffffffffu;
  const int lo_min = __reduce_min_sync(all, min(lo[0], lo[1]));
  const int hi_max = __reduce_max_sync(all, max(hi[0], hi[1]));
  const float c2 = p.scale * 1.4426950408889634f;  // logits in base 2
  const int lane = threadIdx.x % kWarp;
  float m[2] = {kNegInf, kNegInf}, l[2] = {0.0f, 0.0f}, o[8][4] = {};
  load_tile_async<kWindowThreads>(ks_tile[0], k, first, p.T);
  load_tile_async<kWindowThreads>(vs_tile[0], v, first, p.T);
  cp_async_commit();
  for (int it = 0; it < n_tiles; ++it) {
    const int key0 = it * kTileDim;
    cp_async_wait_all();
    __syncthreads();
    if (it + 1 < n_tiles) {
      load_tile_async<kWindowThreads>(ks_tile[(it + 1) % 2], k, first + key0 + kTileDim, p.T);
      load_tile_async<kWindowThreads>(vs_tile[(it + 1) % 2], v, first + key0 + kTileDim, p.T);
      cp_async_commit();
    }
    if (key0 > hi_max || key0 + kTileDim - 1 < lo_min) continue;  // no row of the warp sees it
    // 8-key column groups [0, nt_end) hold every column the warp's rows may see.
    const int nt_end = min(8, (hi_max - key0) / 8 + 1);
    const bool inside = lo_max <= key0 && hi_min >= key0 + kTileDim - 1;
    const bool landmark_col = landmarks_complete && key0 + kTileDim <= complete_col;
    const __nv_bfloat16(*kt)[kTilePitch] = ks_tile[it % 2];
    // A fragments of the warp's 16 q rows: matrices (rows 0-7 | 8-15) x (dims 0-7 | 8-15).
    uint32_t qa[4][4];
#pragma unroll
    for (int ks = 0; ks < 4; ++ks)
      ldmatrix_x4(qa[ks], &sm.q[(threadIdx.x / kWarp) * 16 + lane % 16][16 * ks + 8 * (lane / 16)]);
    float s[8][4];
    qk_tile(s, qa, kt, nt_end);
    if (inside) {
      if (landmark_col && lane % 4 == 3) s[7][1] = s[7][3] = kNegInf;
    } else {
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = e / 2, col = key0 + nt * 8 + (lane % 4) * 2 + (e % 2);
          const bool landmark = landmark_col && (col % kTileDim) == kTileDim - 1;
          if (col < lo[i] || col > hi[i] || landmark) s[nt][e] = kNegInf;
        }
    }
    float neg_max2[2];
    rescale_to_tile_max(s, c2, m, l, o, neg_max2);
    exponentiate_tile(s, nt_end, c2, neg_max2, l);
    pv_tile(o, s, vs_tile[it % 2], (nt_end + 1) / 2);
  }
  store_window_rows(ThreadRows<G>(t0, g, p.T), p, o, l, m, lane, o_swa, lse_swa);
}

}  // namespace
}  // namespace hils::gpu::detail
