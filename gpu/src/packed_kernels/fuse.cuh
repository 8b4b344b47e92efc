// The hierarchical fusion kernel (launch_fuse_packed in packed_kernels.cu): the union of a
// block's selected chunks (UnionScratch, build_union) loaded once, an intra-chunk softmax per
// (query, chunk) in base e (mask_tile, exponentiate) and the running fusion with the window
// term (PackedFusion, Eq. 10) in fuse_packed_kernel.
#pragma once

#include <cstdint>

#include "launch_params.hpp"
#include "mma_common.cuh"
#include "packed_kernels/common.cuh"

namespace hils::gpu::detail {
namespace {

// Scales logits, masks what the row may not see (-inf), returns per-row max over the tile.
template <class Visible>
__device__ __forceinline__ void mask_tile(float (&s)[8][4], float scale, int64_t key0,
                                          Visible visible, float (&row_max)[2]) {
  const int lane = threadIdx.x % kWarp;
  row_max[0] = row_max[1] = kNegInf;
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = e / 2;
      const int64_t j = key0 + nt * 8 + (lane % 4) * 2 + (e % 2);
      s[nt][e] = visible(i, j) ? s[nt][e] * scale : kNegInf;
      row_max[i] = fmaxf(row_max[i], s[nt][e]);
    }
  row_max[0] = quad_max(row_max[0]);
  row_max[1] = quad_max(row_max[1]);
}

// p = exp(s - m) in place (0 where masked); returns the per-row sums.
__device__ __forceinline__ void exponentiate(float (&s)[8][4], const float (&m)[2],
                                             float (&row_sum)[2]) {
  row_sum[0] = row_sum[1] = 0.0f;
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = e / 2;
      s[nt][e] = exp_diff(s[nt][e], m[i]);
      row_sum[i] += s[nt][e];
    }
  row_sum[0] = quad_sum(row_sum[0]);
  row_sum[1] = quad_sum(row_sum[1]);
}

// Shared scratch of the hierarchical kernel: the block's selections and their union.
struct UnionScratch {
  int32_t* selection;  // [M, K]
  uint32_t* bitmap;    // [words]
  int32_t* chunks;     // [M * K], ascending
  int32_t* count;      // [1]
};

// Builds the ascending union of the M queries' selections (-1 entries ignored).
template <int M>
__device__ void build_union(const LaunchParams& p, const int32_t* selection, int64_t t0,
                            int64_t g, int words, const UnionScratch& sc) {
  const int K = static_cast<int>(p.K);
  for (int w = threadIdx.x; w < words; w += kPackedThreads) sc.bitmap[w] = 0u;
  for (int e = threadIdx.x; e < M * K; e += kPackedThreads) {
    const int64_t t = t0 + e / K;
    sc.selection[e] = t < p.T ? selection[(g * p.T + t) * K + e % K] : -1;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < M * K; e += kPackedThreads) {
    const int32_t c = sc.selection[e];
    if (c >= 0) atomicOr(&sc.bitmap[c / 32], 1u << (c % 32));
  }
  __syncthreads();
  if (threadIdx.x < kWarp) {
    const int lane = threadIdx.x;
    int running = 0;
    for (int base = 0; base < words; base += kWarp) {
      uint32_t word = base + lane < words ? sc.bitmap[base + lane] : 0u;
      const int n = __popc(word);
      int prefix = n;
      for (int off = 1; off < kWarp; off *= 2) {
        const int up = __shfl_up_sync(0xffffffffu, prefix, off);
        if (lane >= off) prefix += up;
      }
      int at = running + prefix - n;
      while (word != 0u) {
        const int bit = __ffs(word) - 1;
        word &= word - 1;
        sc.chunks[at++] = (base + lane) * 32 + bit;
      }
      running += __shfl_sync(0xffffffffu, prefix, kWarp - 1);
    }
    if (lane == 0) *sc.count = running;
  }
  __syncthreads();
}

// Running softmax over fusion logits, two rows per thread, values in C layout.
struct PackedFusion {
  float m[2] = {kNegInf, kNegInf};
  float l[2] = {0.0f, 0.0f};
  float o[8][4] = {};

  // Adds logit a for row i with value weight * x (x in C layout, row i's half).
  __device__ __forceinline__ void add(int i, float a, float value_scale, const float (&x)[8][4]) {
    const float m_new = fmaxf(m[i], a);
    const float alpha = exp_diff(m[i], m_new);
    const float w = exp_diff(a, m_new);
    l[i] = l[i] * alpha + w;
    m[i] = m_new;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e)
        o[nt][2 * i + e] = o[nt][2 * i + e] * alpha + w * value_scale * x[nt][2 * i + e];
  }
};

template <int G>
__global__ void __launch_bounds__(kPackedThreads)
    fuse_packed_kernel(LaunchParams p, const int32_t* selection, const float* selected_score,
                       const float* o_swa, const float* lse_swa, float* o_out, float* lse_out) {
  constexpr int M = kPackedRows / G;
  // Two K/V stages: the next union chunk streams in while this one is computed.
  __shared__ __align__(16) __nv_bfloat16 ks_tile[2][kTileDim][kTilePitch];
  __shared__ __align__(16) __nv_bfloat16 vs_tile[2][kTileDim][kTilePitch];
  extern __shared__ int32_t dyn[];
  const int K = static_cast<int>(p.K);
  const int words = static_cast<int>((p.T / p.S) / 32 + 1);
  const UnionScratch sc{dyn, reinterpret_cast<uint32_t*>(dyn + M * K), dyn + M * K + words,
                        dyn + 2 * M * K + words};
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * M, g = blockIdx.y;
  const ThreadRows<G> rows(t0, g, p.T);
  const auto* q = static_cast<const __nv_bfloat16*>(p.q);
  const auto* k = static_cast<const __nv_bfloat16*>(p.k) + g * p.T * kTileDim;
  const auto* v = static_cast<const __nv_bfloat16*>(p.v) + g * p.T * kTileDim;
  build_union<M>(p, selection, t0, g, words, sc);
  uint32_t qa[4][4];
  load_q_fragments(qa, rows.valid[0] ? q + (rows.h[0] * p.T + rows.t[0]) * kTileDim : nullptr,
                   rows.valid[1] ? q + (rows.h[1] * p.T + rows.t[1]) * kTileDim : nullptr);
  PackedFusion fused;
  int next[2] = {0, 0};  // position in each row's ascending selection
  const int n_union = *sc.count;
  if (n_union > 0) {
    load_tile_async(ks_tile[0], k, static_cast<int64_t>(sc.chunks[0]) * p.S, p.T);
    load_tile_async(vs_tile[0], v, static_cast<int64_t>(sc.chunks[0]) * p.S, p.T);
    cp_async_commit();
  }
  for (int u = 0; u < n_union; ++u) {
    const int32_t c = sc.chunks[u];
    int pick[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int32_t* sel = sc.selection + rows.m[i] * K;
      pick[i] = next[i] < K && sel[next[i]] == c ? next[i]++ : -1;
    }
    // Stage u % 2 has landed and every warp is done with stage (u + 1) % 2.
    cp_async_wait_all();
    __syncthreads();
    if (u + 1 < n_union) {
      const int64_t next_row = static_cast<int64_t>(sc.chunks[u + 1]) * p.S;
      load_tile_async(ks_tile[(u + 1) % 2], k, next_row, p.T);
      load_tile_async(vs_tile[(u + 1) % 2], v, next_row, p.T);
      cp_async_commit();
    }
    const __nv_bfloat16(*k_stage)[kTilePitch] = ks_tile[u % 2];
    const __nv_bfloat16(*v_stage)[kTilePitch] = vs_tile[u % 2];
    // Warps whose rows did not select this chunk skip the tensor-core work.
    if (!__any_sync(0xffffffffu, pick[0] >= 0 || pick[1] >= 0)) continue;
    float s[8][4], tile_max[2], tile_sum[2], oc[8][4] = {};
    qk_tile(s, qa, k_stage);
    mask_tile(s, p.scale, 0,
              [&](int i, int64_t j) { return pick[i] >= 0 && !(p.landmarks && j == p.S - 1); },
              tile_max);
    exponentiate(s, tile_max, tile_sum);
    pv_tile(oc, s, v_stage);
#pragma unroll
    for (int i = 0; i < 2; ++i)
      if (pick[i] >= 0)
        fused.add(i, selected_score[(rows.h[i] * p.T + rows.t[i]) * K + pick[i]],
                  1.0f / tile_sum[i], oc);
  }
  const int lane = threadIdx.x % kWarp;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (!rows.valid[i]) continue;
    const int64_t row = rows.h[i] * p.T + rows.t[i];
    float x[8][4];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      const float2 w = *reinterpret_cast<const float2*>(o_swa + row * kTileDim + nt * 8 + (lane % 4) * 2);
      x[nt][2 * i] = w.x, x[nt][2 * i + 1] = w.y;
    }
    fused.add(i, lse_swa[row], 1.0f, x);
    if (p.softmax1) {
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) x[nt][2 * i] = x[nt][2 * i + 1] = 0.0f;
      fused.add(i, 0.0f, 1.0f, x);
    }
    const float inv = 1.0f / fused.l[i];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
      *reinterpret_cast<float2*>(o_out + row * kTileDim + nt * 8 + (lane % 4) * 2) =
          make_float2(fused.o[nt][2 * i] * inv, fused.o[nt][2 * i + 1] * inv);
    if (lane % 4 == 0) lse_out[row] = fused.m[i] + __logf(fused.l[i]);
  }
}

}  // namespace
}  // namespace hils::gpu::detail
