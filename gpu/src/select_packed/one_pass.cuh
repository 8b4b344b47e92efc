// The one-pass kernel of the default group rule (v5, select_one_pass_kernel): per head a running
// log2 Z_hat and the head's K best s2, joined into the query's union list at the head's end
// (gpu/NOTES.md "v5"; its equality with v4 is tested).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "select_packed/common.cuh"
#include "select_packed/lists.cuh"
#include "select_packed/writers.cuh"

namespace hils::gpu::detail {
namespace {

// One pass for the default group rule r(c) = max_h (s_hat_h(c) - log Z_hat_h) (v5). If c is
// among the K best by r and head h* attains r(c), every chunk ranked ahead of c on s_hat_h*
// (same tie rule) is ranked ahead of it on r too, so fewer than K are: c is among h*'s K best by
// s_hat, listed with its exact r. A chunk outside the top K is never over-estimated (its listed
// value is one of its per-head values). So per head: a running log2 Z_hat and the K best s2;
// at the head's end its list joins the union (merge_head_list), which ends as the top K by r.
// Pruning: Z_hat_h only grows, so log2 Z_hat_h >= zr (the sum so far); a candidate with
// s2 - zr below the union's K-th value (minus a rounding allowance) can never enter. The
// values are the two-pass kernel's (same s2, same log2 Z_hat arithmetic).
template <int G>
__global__ void __launch_bounds__(kPackedThreads, 3)
    select_one_pass_kernel(LaunchParams p, const float* key, const __nv_bfloat16* key_bf16,
                           const float* bias, const float* bias2, const float* lse_swa,
                           int32_t* selection, float* selected_score, int first_round) {
  __shared__ __align__(16) __nv_bfloat16 tile[2][kTileDim][kTilePitch];
  __shared__ __align__(16) float bias_tile[2][kTileDim];
  extern __shared__ __align__(16) float dyn[];
  const int K = static_cast<int>(p.K);
  float* cursor = dyn;
  auto take = [&](int64_t count) { float* out = cursor; cursor += count; return out; };
  SelectShared sh;  // value/index: the union lists; log_z unused
  sh.r = take(kQueries * kRPitch);
  sh.log_z = nullptr;
  sh.value = take(kQueries * K);
  sh.index = reinterpret_cast<int32_t*>(take(kQueries * K));
  sh.n_cand = reinterpret_cast<int32_t*>(take(kQueries));
  float* head_value = take(kQueries * K);
  int32_t* head_index = reinterpret_cast<int32_t*>(take(kQueries * K));
  const SlotGeometry geo{p.T, p.S, p.W, p.landmarks};
  const int64_t t0 = block_t0(kQueries, first_round), g = blockIdx.y;
  const int64_t n_chunks = geo.n_chunks();
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int row[2] = {warp * 16 + lane / 4, warp * 16 + lane / 4 + 8};
  const int64_t t[2] = {t0 + row[0], t0 + row[1]};
  for (int e = threadIdx.x; e < kQueries * K; e += kPackedThreads) {
    sh.value[e] = head_value[e] = kNegInf;
    sh.index[e] = head_index[e] = -1;
  }
  for (int q = threadIdx.x; q < kQueries; q += kPackedThreads) {
    sh.n_cand[q] = t0 + q < p.T ? static_cast<int>(geo.candidate_count(t0 + q)) : 0;
  }
  __syncthreads();
  const int n_cand[2] = {sh.n_cand[row[0]], sh.n_cand[row[1]]};
  int warp_min = n_cand[0] < n_cand[1] ? n_cand[0] : n_cand[1];
  for (int off = kWarp / 2; off > 0; off /= 2) warp_min = min(warp_min, __shfl_xor_sync(0xffffffffu, warp_min, off));
  const int64_t t_last = t0 + kQueries - 1 < p.T - 1 ? t0 + kQueries - 1 : p.T - 1;
  const int n_tiles = (sh.n_cand[t_last - t0] + kTileDim - 1) / kTileDim;
  const float scale2 = p.scale * kLog2e;
  // A candidate is dropped only when s2 - zr falls this far (base 2) below the union's K-th
  // value: the allowance covers the approximate ex2/lg2 of zr against the final log2 Z_hat.
  constexpr float kPruneAllowance = 1.0f / 64;
  auto issue = [&](int hg, int c0, int buf) {
    const int64_t h = g * G + hg;
    issue_tile(tile[buf], bias_tile[buf], key_bf16 + h * n_chunks * kTileDim, bias2 + h * n_chunks,
               c0, static_cast<int>(n_chunks));
  };
  if (n_tiles > 0) {
    const int steps = G * n_tiles;
    uint32_t qa[4][4];
    float s[8][4];
    float m[2], l[2], swa[2];
    float theta[2];        // the head list's K-th value: a candidate must beat it
    float union_kth[2];    // the union list's K-th value (-inf until full)
    union_kth[0] = union_kth[1] = kNegInf;
    issue(0, 0, 0);
    for (int step = 0; step < steps; ++step) {
      const int hg = step / n_tiles;
      const int tile_i = step % n_tiles;
      const int c0 = tile_i * kTileDim;
      const int64_t h = g * G + hg;
      if (tile_i == 0) {
        load_query_fragments(qa, p, h, t);
        m[0] = m[1] = kNegInf, l[0] = l[1] = 0.0f;
        theta[0] = theta[1] = kNegInf;
#pragma unroll
        for (int i = 0; i < 2; ++i) swa[i] = t[i] < p.T ? lse_swa[h * p.T + t[i]] * kLog2e : kNegInf;
      }
      cp_async_wait_all();
      __syncthreads();
      if (step + 1 < steps) issue((step + 1) / n_tiles, ((step + 1) % n_tiles) * kTileDim, (step + 1) % 2);
      qk_tile(s, qa, tile[step % 2]);
      scale_and_mask(s, bias_tile[step % 2], scale2, c0, n_cand, c0 + kTileDim <= warp_min);
      accumulate_mass(s, m, l);
      // Offer threshold per row: beat the head list, and reach the union's K-th value.
      float floor2[2];
#pragma unroll
      for (int i = 0; i < 2; ++i)
        floor2[i] = union_kth[i] == kNegInf ? kNegInf
                                            : union_kth[i] + log2_normalizer(m[i], l[i], swa[i]) - kPruneAllowance;
      bool any[2] = {false, false};
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if (s[nt][e] < floor2[e / 2]) s[nt][e] = kNegInf;
          any[e / 2] |= s[nt][e] > theta[e / 2];
        }
      const unsigned rows = flagged_rows(any);
      if (rows != 0u) {
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            sh.r[row[e / 2] * kRPitch + nt * 8 + (lane % 4) * 2 + (e % 2)] = s[nt][e];
        __syncwarp();
        for (unsigned pending = rows; pending != 0u; pending &= pending - 1) {
          const int q = warp * 16 + __ffs(pending) - 1;
          offer_tile(sh.r + q * kRPitch, head_value + q * K, head_index + q * K, c0, sh.n_cand[q], K);
        }
#pragma unroll
        for (int i = 0; i < 2; ++i) theta[i] = head_value[row[i] * K + K - 1];
      }
      if (tile_i != n_tiles - 1) continue;
      // End of the head: its list joins the union with values s2 - log2 Z_hat_h.
      float z[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) z[i] = log2_normalizer(m[i], l[i], swa[i]);
      for (int j = 0; j < 16; ++j) {
        const int q = warp * 16 + j;
        const float zq = __shfl_sync(0xffffffffu, z[j / 8], (j % 8) * 4);
        merge_head_list(sh.value + q * K, sh.index + q * K, head_value + q * K, head_index + q * K, zq, K);
        for (int e = lane; e < K; e += kWarp) head_value[q * K + e] = kNegInf, head_index[q * K + e] = -1;
      }
      __syncwarp();
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int32_t last = sh.index[row[i] * K + K - 1];
        union_kth[i] = last >= 0 ? sh.value[row[i] * K + K - 1] : kNegInf;
      }
    }
  }
  __syncthreads();
  for (int q = warp * 16; q < warp * 16 + 16; ++q)
    if (t0 + q < p.T) write_selection(p, sh.index + q * K, t0 + q, g, G, key, bias, selection, selected_score);
}

}  // namespace
}  // namespace hils::gpu::detail
