// Window kernel wgmma_v18 (WindowKernel::wgmma_v18; launch_window_v18 in packed_kernels.cu):
// mma_v9's block as two warpgroups issuing wgmma, the K/V tiles copied by the tensor memory
// accelerator. Its shared memory (WindowV18Smem), the stage ring (next_stage), O += P V
// (issue_pv) and window_wgmma_v18_kernel.
#pragma once

#include <cuda.h>  // CUtensorMap

#include <cstdint>

#include "launch_params.hpp"
#include "mma_common.cuh"
#include "wgmma_common.cuh"
#include "packed_kernels/common.cuh"
#include "packed_kernels/window_tiles.cuh"
#include "packed_kernels/window_wgmma.cuh"

namespace hils::gpu::detail {
namespace {

// ---- window v18: wgmma with the K/V tiles copied by the tensor memory accelerator ----------------
// mma_v9's block (128 rows = M = 128 / G queries x G heads, 8 warps) as two warpgroups of 64 rows
// (wgmma_v11 on). Per 64-key tile each warpgroup issues S = Q K^T as 4 wgmma m64n64k16 (Q and K
// from 128-byte-swizzled panels in shared memory) and O += P V as 4 more (P from registers in
// mma.sync's A layout, V an N-major panel), each waited at once (v13's step), the descriptors'
// low words worked out once and the k16 steps added to them alone (v13). The softmax is mma_v9's
// (per warp: tiles inside every row's window carry the landmark mask only; base 2). Tiles are
// skipped per warpgroup (a wgmma is issued by all 128 threads of its warpgroup). The copies
// (v18): the tensor memory accelerator (cp.async.bulk.tensor) writes a tile's K and V panels,
// 128-byte swizzled, two tiles ahead (v15), and completes on the stage's mbarrier; rows past T
// are zeros.

// The copies run kAhead = 2 tiles ahead: K and V have kAhead + 2 stages each, a tile's K and V
// panels completing on one mbarrier per stage.
struct WindowV18Smem {
  static constexpr int kAhead = 2, kStages = kAhead + 2;
  unsigned char q[2][kWgPanelBytes];        // the two warpgroups' 64 q rows
  unsigned char k[kStages][kWgPanelBytes];  // K stages
  unsigned char v[kStages][kWgPanelBytes];  // V stages
  uint64_t full[kStages];                   // stage s's K and V have landed
};
constexpr size_t kWindowV18SmemBytes = sizeof(WindowV18Smem) + wg::kAtomBytes;

// The next stage's byte offset after `stage` in a ring of `stages` panels.
template <int stages>
__device__ __forceinline__ uint32_t next_stage(uint32_t stage) {
  return stage + kWgPanelBytes == stages * kWgPanelBytes ? 0u : stage + kWgPanelBytes;
}

// O += P V for one tile (V the N-major panel whose descriptor low word is v_lo), o first scaled by
// the rows' factors alpha; committed, not waited.
__device__ __forceinline__ void issue_pv(float (&o)[8][4], const uint32_t (&pa)[4][4],
                                         const float (&alpha)[2], uint32_t v_lo, uint32_t desc_hi) {
  scale_rows(o, alpha);
  wg::fence_operands(o);
  wg::fence();
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) wg::mma_rs<true>(o, pa[ks], desc_of(v_lo + 128 * ks, desc_hi), true);
  wg::commit();
}

template <int G>
__global__ void __launch_bounds__(256, 2)
    window_wgmma_v18_kernel(LaunchParams p, float* o_swa, float* lse_swa,
                            const __grid_constant__ CUtensorMap k_map,
                            const __grid_constant__ CUtensorMap v_map) {
  constexpr int kRows = 128, M = kRows / G;
  constexpr int kAhead = WindowV18Smem::kAhead, kStages = WindowV18Smem::kStages;
  extern __shared__ unsigned char window_wg_raw[];
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(window_wg_raw));
  auto& sm = *reinterpret_cast<WindowV18Smem*>(window_wg_raw +
                                               (wg::kAtomBytes - base % wg::kAtomBytes) % wg::kAtomBytes);
  const SlotGeometry geo{p.T, p.S, p.W, p.landmarks};
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * M, g = blockIdx.y;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, group = warp / 4;
  const int64_t first = geo.window_left(t0);
  const int64_t t_last = t0 + M - 1 < p.T - 1 ? t0 + M - 1 : p.T - 1;
  const int n_tiles = static_cast<int>((t_last - first) / kTileDim + 1);
  const int complete_col = static_cast<int>((p.T / kTileDim) * kTileDim - first);
  load_q_panels_async<G>(sm.q, p, t0, g);
  // The warpgroup's tiles [it_begin, it_end]: its first query's window start to its last query;
  // empty when its rows start past T.
  const int64_t wg_t0 = t0 + group * 64 / G, wg_t1 = t0 + (group * 64 + 63) / G;
  const bool wg_rows = wg_t0 < p.T;
  const int it_begin = wg_rows ? static_cast<int>((geo.window_left(wg_t0) - first) / kTileDim) : 0;
  const int it_end = wg_rows ? static_cast<int>(((wg_t1 < p.T ? wg_t1 : p.T - 1) - first) / kTileDim) : -2;
  const WindowRowBounds bounds = window_row_bounds<G>(geo, p.T, t0, g, first);
  const float c2 = p.scale * 1.4426950408889634f;  // logits in base 2
  const uint32_t smem_k = static_cast<uint32_t>(__cvta_generic_to_shared(sm.k[0]));
  const uint32_t smem_v = static_cast<uint32_t>(__cvta_generic_to_shared(sm.v[0]));
  const uint64_t q_desc = wg::desc_k_major(sm.q[group]), k0_desc = wg::desc_k_major(smem_k),
                 v0_desc = wg::desc_n_major(smem_v, kWgPanelBytes);
  const uint32_t q_lo = static_cast<uint32_t>(q_desc), k0_lo = static_cast<uint32_t>(k0_desc),
                 v0_lo = static_cast<uint32_t>(v0_desc);
  const uint32_t desc_hi = static_cast<uint32_t>(k0_desc >> 32);
  uint32_t k_use = 0, v_use = 0;
  // Tile j's K and V into stage j % kStages, thread 0 issuing, completing on full[stage].
  const uint32_t full0 = static_cast<uint32_t>(__cvta_generic_to_shared(&sm.full[0]));
  auto load_tile_tma = [&](int j) {
    const uint32_t stage = static_cast<uint32_t>(j % kStages), bar = full0 + 8 * stage;
    mbarrier_expect_bytes(bar, 2 * kWgPanelBytes);
    tma_load_panel(smem_k + stage * kWgPanelBytes, k_map, static_cast<int>(first) + j * kTileDim,
                   static_cast<int>(g), bar);
    tma_load_panel(smem_v + stage * kWgPanelBytes, v_map, static_cast<int>(first) + j * kTileDim,
                   static_cast<int>(g), bar);
  };
  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) mbarrier_init(full0 + 8 * s, 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  if (threadIdx.x == 0) {
#pragma unroll
    for (int j = 0; j < kAhead; ++j)
      if (j < n_tiles) load_tile_tma(j);
  }
  cp_async_commit();  // the q rows
  float m[2] = {kNegInf, kNegInf}, l[2] = {0.0f, 0.0f}, o[8][4] = {}, alpha[2] = {1.0f, 1.0f};
  uint32_t pa[4][4] = {};
  const WindowTileMask mask{bounds, complete_col, p.landmarks};
  for (int it = 0; it < n_tiles; ++it) {
    const int key0 = it * kTileDim;
    if (it == 0) {
      cp_async_wait_all();      // the q rows
      wg::fence_proxy_async();  // cp.async writes -> the tensor cores' reads
    }
    __syncthreads();  // every warpgroup is done with the stage refilled now
    if (threadIdx.x == 0 && it + kAhead < n_tiles) load_tile_tma(it + kAhead);
    mbarrier_wait(full0 + 8 * static_cast<uint32_t>(it % kStages), static_cast<uint32_t>(it / kStages) & 1u);
    const uint32_t k_lo = k0_lo + k_use / 16, v_lo = v0_lo + v_use / 16;
    k_use = next_stage<kStages>(k_use);
    v_use = next_stage<kStages>(v_use);
    if (it < it_begin || it > it_end) continue;  // uniform over the warpgroup
    float s[8][4];
    wg::fence_operands(s);
    wg::fence();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks)
      wg::mma_ss<false>(s, desc_of(q_lo + 2 * ks, desc_hi), desc_of(k_lo + 2 * ks, desc_hi), ks > 0);
    wg::commit();
    wg::wait<0>();
    wg::fence_operands(s);
    mask_window_tile(s, key0, 8, mask, lane);
    float neg_max2[2];
    raise_to_tile_max(s, c2, m, l, alpha, neg_max2);
    exponentiate_tile(s, 8, c2, neg_max2, l);
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      pa[ks][0] = pack_bf16(s[2 * ks][0], s[2 * ks][1]);
      pa[ks][1] = pack_bf16(s[2 * ks][2], s[2 * ks][3]);
      pa[ks][2] = pack_bf16(s[2 * ks + 1][0], s[2 * ks + 1][1]);
      pa[ks][3] = pack_bf16(s[2 * ks + 1][2], s[2 * ks + 1][3]);
    }
    issue_pv(o, pa, alpha, v_lo, desc_hi);
    wg::wait<0>();
    wg::fence_operands(o);
  }
  store_window_rows(ThreadRows<G>(t0, g, p.T), p, o, l, m, lane, o_swa, lse_swa);
}

}  // namespace
}  // namespace hils::gpu::detail
