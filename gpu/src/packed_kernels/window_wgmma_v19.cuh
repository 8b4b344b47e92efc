// Window kernels wgmma_v19 and wgmma_v20 (one template, kBarrierFree; launch_window_v19 in
// packed_kernels.cu): v18's copies and step with fewer instructions per tile. Their shared memory
// (WindowV19Smem), the rows' tile maxima by a tree (tile_row_max), the lazy maximum
// (raise_lazily) and window_wgmma_v19_kernel.
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

// ---- window v19, v20: fewer instructions per tile on v18's copies and step -------------------
// v18's step per tile and warpgroup (S = Q K^T, wait, masks and softmax, O += P V, wait) on its
// TMA copies (two tiles ahead, four stages, one "full" mbarrier per stage), with:
// - v19: the rows' maxima by a tree of fmaxf (v18: a chain of 16 per row), and the maximum that
//   the exponentials subtract raised only when a row's tile maximum passes it by more than 8 in
//   base 2 (FA4's rule): the probabilities stay <= 2^8, and the tiles that raise no maximum of
//   the warp's rows skip the factors and the rescale of o and of the sums (2 MUFU, 2 FFMA, 34
//   FMUL). Other rounding than v18 (another maximum subtracted). The descriptors are put
//   together inside the wgmma asm from 32-bit low words (mma_ss_k_major, mma_rs_n_major).
// - v20 (kBarrierFree): v19 without the block barrier per tile: each stage has an "empty"
//   mbarrier that every thread arrives at when its warpgroup is done with the tile there
//   (skipped tiles too); the thread that issues the copies waits for it before refilling the
//   stage. And the warpgroup's index made warp-uniform (__shfl_sync of lane 0's, as CUTLASS
//   does), so that q's descriptor word can live in a uniform register.
struct WindowV19Smem {
  static constexpr int kStages = 4, kAhead = 2;
  unsigned char q[2][kWgPanelBytes];        // the two warpgroups' 64 q rows
  unsigned char k[kStages][kWgPanelBytes];  // K stages
  unsigned char v[kStages][kWgPanelBytes];  // V stages
  uint64_t full[kStages];                   // stage s's K and V have landed
  uint64_t empty[kStages];                  // every thread is done with stage s (v20)
};
constexpr size_t kWindowV19SmemBytes = sizeof(WindowV19Smem) + wg::kAtomBytes;

// The rows' tile maxima (over the quad) of s by a tree of fmaxf.
__device__ __forceinline__ void tile_row_max(const float (&s)[8][4], float (&tile_max)[2]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float x[8];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) x[nt] = fmaxf(s[nt][2 * i], s[nt][2 * i + 1]);
#pragma unroll
    for (int w = 4; w >= 1; w /= 2)
#pragma unroll
      for (int j = 0; j < w; ++j) x[j] = fmaxf(x[j], x[j + w]);
    tile_max[i] = quad_max(x[0]);
  }
}

// The lazy maximum: m (the maximum the exponentials subtract) is raised to the tile's only when
// some row of the warp passes its raise_at = m + 8 / c2; then the rows' factors rescale o and the
// sums l, and neg_max2 = -m c2 is renewed.
__device__ __forceinline__ void raise_lazily(const float (&tile_max)[2], float c2, float slack,
                                             float (&m)[2], float (&raise_at)[2], float (&l)[2],
                                             float (&o)[8][4], float (&neg_max2)[2]) {
  if (!__any_sync(0xffffffffu, tile_max[0] > raise_at[0] || tile_max[1] > raise_at[1])) return;
  float alpha[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float m_new = fmaxf(m[i], tile_max[i]);
    neg_max2[i] = m_new == kNegInf ? 0.0f : -m_new * c2;
    alpha[i] = exp2_approx(fmaf(m[i], c2, neg_max2[i]));  // 0 while m = -inf
    raise_at[i] = m_new == kNegInf ? kNegInf : m_new + slack;
    m[i] = m_new;
    l[i] *= alpha[i];
  }
  scale_rows(o, alpha);
}

template <int G, bool kBarrierFree>
__global__ void __launch_bounds__(256, 2)
    window_wgmma_v19_kernel(LaunchParams p, float* o_swa, float* lse_swa,
                            const __grid_constant__ CUtensorMap k_map,
                            const __grid_constant__ CUtensorMap v_map) {
  constexpr bool kEmpty = kBarrierFree;
  constexpr int kRows = 128, M = kRows / G;
  constexpr int kStages = WindowV19Smem::kStages, kAhead = WindowV19Smem::kAhead;
  extern __shared__ unsigned char window_wg_raw[];
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(window_wg_raw));
  auto& sm = *reinterpret_cast<WindowV19Smem*>(
      window_wg_raw + (wg::kAtomBytes - base % wg::kAtomBytes) % wg::kAtomBytes);
  const SlotGeometry geo{p.T, p.S, p.W, p.landmarks};
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * M, g = blockIdx.y;
  const int lane = threadIdx.x % kWarp;
  const int group = kBarrierFree
                        ? __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x / 128), 0)
                        : static_cast<int>(threadIdx.x / 128);
  const int64_t first = geo.window_left(t0);
  const int64_t t_last = t0 + M - 1 < p.T - 1 ? t0 + M - 1 : p.T - 1;
  const int n_tiles = static_cast<int>((t_last - first) / kTileDim + 1);
  const int complete_col = static_cast<int>((p.T / kTileDim) * kTileDim - first);
  load_q_panels_async<G>(sm.q, p, t0, g);
  cp_async_commit();
  // The warpgroup's tiles [it_begin, it_end] (v13's); empty when its rows start past T.
  const int64_t wg_t0 = t0 + group * 64 / G, wg_t1 = t0 + (group * 64 + 63) / G;
  const bool wg_rows = wg_t0 < p.T;
  const int it_begin = wg_rows ? static_cast<int>((geo.window_left(wg_t0) - first) / kTileDim) : 0;
  const int it_end = wg_rows ? static_cast<int>(((wg_t1 < p.T ? wg_t1 : p.T - 1) - first) / kTileDim) : -1;
  const WindowRowBounds bounds = window_row_bounds<G>(geo, p.T, t0, g, first);
  const float c2 = p.scale * 1.4426950408889634f;  // logits in base 2
  const float slack = 8.0f / c2;                   // raise m when a tile passes it by 2^8
  const uint32_t smem_k = static_cast<uint32_t>(__cvta_generic_to_shared(sm.k[0]));
  const uint32_t smem_v = static_cast<uint32_t>(__cvta_generic_to_shared(sm.v[0]));
  const uint32_t smem_q = static_cast<uint32_t>(__cvta_generic_to_shared(sm.q[0]));
  // Descriptor low words: q's panel, stage 0's K panel, stage 0's V panel.
  const uint32_t q_lo = static_cast<uint32_t>(wg::desc_k_major(smem_q + group * kWgPanelBytes));
  const uint32_t k0_lo = static_cast<uint32_t>(wg::desc_k_major(smem_k));
  const uint32_t v0_lo = static_cast<uint32_t>(wg::desc_n_major(smem_v, kWgPanelBytes));
  const uint32_t full0 = static_cast<uint32_t>(__cvta_generic_to_shared(&sm.full[0]));
  const uint32_t empty0 = static_cast<uint32_t>(__cvta_generic_to_shared(&sm.empty[0]));
  auto load_tile = [&](int j) {  // thread 0: tile j's K and V into stage j % kStages
    const uint32_t stage = static_cast<uint32_t>(j % kStages), bar = full0 + 8 * stage;
    if (kEmpty && j >= kStages)  // the stage's previous tile, j - kStages, is done everywhere
      mbarrier_wait(empty0 + 8 * stage, static_cast<uint32_t>(j / kStages - 1) & 1u);
    mbarrier_expect_bytes(bar, 2 * kWgPanelBytes);
    tma_load_panel(smem_k + stage * kWgPanelBytes, k_map, static_cast<int>(first) + j * kTileDim,
                   static_cast<int>(g), bar);
    tma_load_panel(smem_v + stage * kWgPanelBytes, v_map, static_cast<int>(first) + j * kTileDim,
                   static_cast<int>(g), bar);
  };
  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(full0 + 8 * s, 1);
      if constexpr (kEmpty) mbarrier_init(empty0 + 8 * s, 256);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  cp_async_wait_all();      // the q rows
  wg::fence_proxy_async();  // cp.async writes -> the tensor cores' reads
  __syncthreads();
  if (threadIdx.x == 0) {
#pragma unroll
    for (int j = 0; j < kAhead; ++j)
      if (j < n_tiles) load_tile(j);
  }
  float m[2] = {kNegInf, kNegInf}, l[2] = {0.0f, 0.0f}, o[8][4] = {};
  float raise_at[2] = {kNegInf, kNegInf}, neg_max2[2] = {0.0f, 0.0f};
  const WindowTileMask mask{bounds, complete_col, p.landmarks};
  uint32_t use = 0;  // this tile's stage offset
  for (int it = 0; it < n_tiles; ++it) {
    const int key0 = it * kTileDim;
    if constexpr (!kEmpty) __syncthreads();  // every warpgroup is done with the stage refilled now
    if (threadIdx.x == 0 && it + kAhead < n_tiles) load_tile(it + kAhead);
    const uint32_t k_lo = k0_lo + use / 16, v_lo = v0_lo + use / 16;
    const uint32_t stage = use / kWgPanelBytes;
    use = use + kWgPanelBytes == kStages * kWgPanelBytes ? 0u : use + kWgPanelBytes;
    // Every thread waits for every tile, skipped ones too: v20's arrivals for tile it must not
    // come before every thread's for tile it - kStages (the stage's previous phase), and tile
    // it lands only after those (the copying thread waits for them). Without this wait a
    // warpgroup without rows (a ragged last block) arrived for every tile at once, completed
    // the stages' phases by itself and left the copying thread waiting (session 14, run 2).
    mbarrier_wait(full0 + 8 * stage, static_cast<uint32_t>(it / kStages) & 1u);
    if (it < it_begin || it > it_end) {  // uniform over the warpgroup
      if constexpr (kEmpty) mbarrier_arrive(empty0 + 8 * stage);
      continue;
    }
    float s[8][4];
    wg::fence_operands(s);
    wg::fence();
    wg::mma_ss_k_major<0>(s, q_lo, k_lo, false);
    wg::mma_ss_k_major<1>(s, q_lo, k_lo, true);
    wg::mma_ss_k_major<2>(s, q_lo, k_lo, true);
    wg::mma_ss_k_major<3>(s, q_lo, k_lo, true);
    wg::commit();
    wg::wait<0>();
    wg::fence_operands(s);
    mask_window_tile(s, key0, 8, mask, lane);
    float tile_max[2];
    tile_row_max(s, tile_max);
    raise_lazily(tile_max, c2, slack, m, raise_at, l, o, neg_max2);
    uint32_t pa[4][4];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[nt][e] = exp2_approx(fmaf(s[nt][e], c2, neg_max2[e / 2]));  // -inf -> 0
        l[e / 2] += s[nt][e];
      }
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      pa[ks][0] = pack_bf16(s[2 * ks][0], s[2 * ks][1]);
      pa[ks][1] = pack_bf16(s[2 * ks][2], s[2 * ks][3]);
      pa[ks][2] = pack_bf16(s[2 * ks + 1][0], s[2 * ks + 1][1]);
      pa[ks][3] = pack_bf16(s[2 * ks + 1][2], s[2 * ks + 1][3]);
    }
    wg::fence_operands(o);
    wg::fence();
    wg::mma_rs_n_major<0>(o, pa[0], v_lo);
    wg::mma_rs_n_major<1>(o, pa[1], v_lo);
    wg::mma_rs_n_major<2>(o, pa[2], v_lo);
    wg::mma_rs_n_major<3>(o, pa[3], v_lo);
    wg::commit();
    wg::wait<0>();
    wg::fence_operands(o);
    if constexpr (kEmpty) mbarrier_arrive(empty0 + 8 * stage);
  }
  store_window_rows<G>(ThreadRows<G>(t0, g, p.T), p, o, l, m, lane, o_swa, lse_swa);
}

}  // namespace
}  // namespace hils::gpu::detail
