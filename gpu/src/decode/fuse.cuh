// Stage 5 of the decode step, the fuse (one warp per (b, h)): hierarchical (Eq. 10) or flat
// (Eq. 3) over the selected chunks and the window (fuse_head), and the short tails' form that
// issues every load at once and also merges the window tiles (fuse_head_short, since d13).
#pragma once

#include <cstdint>

#include "decode/common.cuh"

namespace hils::gpu {
namespace detail {
namespace {

// ---- 5. fuse: one warp per (b, h) -----------------------------------------------------------
// Non-finite scores (gpu/NOTES.md "Non-finite summary rows (session 22)"): with K > 0, where
// any head of head `item`'s KV group (the heads that share its selection) has a non-finite
// candidate score (a NaN among its score tiles' sums exp: score_tile), the head's o and lse are
// NaN: its selection ranked a NaN, so no output of it is plausible (fp8 and int4 rows with a
// NaN or an infinity are stored marked for this, decode_quantize.cu). Where the group-score
// tiles ran (K < candidates) they made the window's o NaN (group_score_tile), so o is NaN and
// nonfinite_lse makes lse NaN beside it; else (every candidate selected) the fuse reads the
// group's tile sums itself (group_sums_nonfinite).
__device__ __forceinline__ bool group_scores_ran(const DecodeParams& p) {
  return p.K > 0 && p.n_cand > p.K;  // launch_d5, launch_fused
}
// Warp-wide, where the group-score tiles did not run.
__device__ bool group_sums_nonfinite(const DecodeParams& p, const DecodeScratch& w, int64_t item) {
  if (p.K == 0 || group_scores_ran(p)) return false;  // K = 0: no chunk is read
  const float2* sums = w.score_part + (item / p.G) * p.G * p.n_score_tiles;  // the group's tiles
  bool bad = false;
  for (int64_t i = threadIdx.x % kWarp; i < p.G * p.n_score_tiles; i += kWarp) bad |= isnan(sums[i].y);
  return __any_sync(0xffffffffu, bad) != 0;
}
// lse of a head whose o (dimension 0: `o0`) is NaN: NaN with it. A select, so a finite lse keeps
// its bits.
__device__ __forceinline__ float nonfinite_lse(float lse, float o0) { return isnan(o0) ? kNaN : lse; }

// Logits a_i: hierarchical s_hat(c_i) (Eq. 10), flat lse_{c_i} (Eq. 3 as a merge of
// (lse, o) pairs); then the window (lse_swa) and, hierarchical with softmax1, a zero logit.
// Lane i handles selected slot i (32 at a time); its weight is broadcast for the output sums.
// kBatched (the fused kernel): the selected chunks' o_c rows are loaded kFuseBatch at a time
// before their sums, so that one head's fusion is not a chain of K dependent L2 round trips (d5,
// kBatched false, loads one row per step). Hierarchical with `fusion_logit`: the logits of the
// selected chunks come from there (the bf16 rows next to fp8 summaries) instead of the scores.
constexpr int kFuseBatch = 8;
template <bool kBatched>
__device__ void fuse_head(const DecodeParams& p, const DecodeScratch& w, int64_t item, float* o,
                          float* lse, float* fusion_weights) {
  const int lane = threadIdx.x % kWarp;
  const int64_t b = item / p.Hq, h = item % p.Hq, g = h / p.G;
  const int32_t* sel = w.selection + (b * p.Hkv + g) * p.K;
  const float* part = w.chunk_part + item * p.K * (p.dv + 1);
  auto logit = [&](int64_t i) {
    if (i >= p.K) return kNegInf;
    const int32_t c = sel[i];
    if (c < 0) return kNegInf;
    if (!p.hierarchical) return part[i * (p.dv + 1)];
    return w.fusion_logit[item * p.K + i];  // the chunk tiles' sums from summary_key_fp32
  };
  const float a_win = w.win_lse[item];
  const bool zero_logit = p.hierarchical && p.softmax1;
  float m = kNegInf;
  for (int64_t i = lane; i < p.K; i += kWarp) m = fmaxf(m, logit(i));
  m = fmaxf(fmaxf(warp_max(m), a_win), zero_logit ? 0.0f : kNegInf);
  float l = 0.0f;
  for (int64_t i = lane; i < p.K; i += kWarp) l += exp_diff(logit(i), m);
  l = warp_sum(l) + exp_diff(a_win, m) + (zero_logit ? __expf(-m) : 0.0f);
  const float total = group_sums_nonfinite(p, w, item) ? kNaN : m == kNegInf ? kNegInf : m + __logf(l);
  auto weight = [&](float a) { return total == kNegInf ? 0.0f : exp_diff(a, total); };
  float acc[kDimRegs];
  const float w_win = weight(a_win);
#pragma unroll
  for (int r = 0; r < kDimRegs; ++r) {
    const int dim = lane + kWarp * r;
    acc[r] = dim < p.dv ? w_win * w.win_o[item * p.dv + dim] : 0.0f;
  }
  float* fw = fusion_weights ? fusion_weights + item * (p.K + 2) : nullptr;
  for (int64_t base = 0; base < p.K; base += kWarp) {
    const float wi = weight(logit(base + lane));
    if (fw && base + lane < p.K) fw[base + lane] = wi;
    const int n = p.K - base < kWarp ? static_cast<int>(p.K - base) : kWarp;
    if constexpr (kBatched) {
      for (int jj0 = 0; jj0 < n; jj0 += kFuseBatch) {
        float wj[kFuseBatch], v[kFuseBatch][kDimRegs];
#pragma unroll
        for (int u = 0; u < kFuseBatch; ++u) {
          wj[u] = __shfl_sync(0xffffffffu, wi, (jj0 + u) % kWarp);
          const float* row = part + (base + jj0 + u) * (p.dv + 1) + 1;
#pragma unroll
          for (int r = 0; r < kDimRegs; ++r) {
            const int dim = lane + kWarp * r;
            v[u][r] = jj0 + u < n && dim < p.dv ? row[dim] : 0.0f;
          }
        }
#pragma unroll
        for (int u = 0; u < kFuseBatch; ++u)
#pragma unroll
          for (int r = 0; r < kDimRegs; ++r) acc[r] = fmaf(jj0 + u < n ? wj[u] : 0.0f, v[u][r], acc[r]);
      }
    } else {
      for (int jj = 0; jj < n; ++jj) {
        const float wj = __shfl_sync(0xffffffffu, wi, jj);
        const float* row = part + (base + jj) * (p.dv + 1) + 1;
#pragma unroll
        for (int r = 0; r < kDimRegs; ++r) {
          const int dim = lane + kWarp * r;
          if (dim < p.dv) acc[r] = fmaf(wj, row[dim], acc[r]);
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kDimRegs; ++r) {
    const int dim = lane + kWarp * r;
    if (dim < p.dv) o[item * p.dv + dim] = acc[r];
  }
  if (lane == 0) {
    lse[item] = nonfinite_lse(total, acc[0]);
    if (fw) fw[p.K] = w_win, fw[p.K + 1] = zero_logit ? weight(0.0f) : 0.0f;
  }
}

// kShort when fuse_merges_window: every load of the head is issued at once (lane i: selected
// slot i's chunk and logit, window tile i's (m, l); all K rows of o_c and all window tiles' o,
// dims lane and lane + 32), then the sums: one round trip (hierarchical fusion's logits are the
// chunk tiles' sums from the fp32 rows, read as slot i's). The window merge (o_swa, lse_swa)
// happens here.
__device__ void fuse_head_short(const DecodeParams& p, const DecodeScratch& w, int64_t item,
                                float* o, float* lse, float* fusion_weights, float* o_window,
                                float* lse_window) {
  const int lane = threadIdx.x % kWarp;
  const int64_t b = item / p.Hq, h = item % p.Hq, g = h / p.G;
  const int32_t* sel = w.selection + (b * p.Hkv + g) * p.K;
  const float* part = w.chunk_part + item * p.K * (p.dv + 1);
  const bool mine = lane < p.K;
  const int32_t c = mine ? sel[lane] : -1;
  // hierarchical: the chunk tiles' sums from summary_key_fp32
  const float given = mine && p.hierarchical ? w.fusion_logit[item * p.K + lane] : kNegInf;
  const float flat = mine && !p.hierarchical ? part[lane * (p.dv + 1)] : kNegInf;
  float v0[kShortK], v1[kShortK];
#pragma unroll
  for (int i = 0; i < kShortK; ++i) {
    const float* row = part + i * (p.dv + 1) + 1;
    v0[i] = i < p.K && lane < p.dv ? row[lane] : 0.0f;
    v1[i] = i < p.K && lane + kWarp < p.dv ? row[lane + kWarp] : 0.0f;
  }
  const float* win = w.win_part + item * p.n_win_tiles * (p.dv + 2);
  const bool my_tile = lane < p.n_win_tiles;
  const float tile_m = my_tile ? win[lane * (p.dv + 2)] : kNegInf;
  const float tile_l = my_tile ? win[lane * (p.dv + 2) + 1] : 0.0f;
  float t0[kShortWinTiles], t1[kShortWinTiles];
#pragma unroll
  for (int t = 0; t < kShortWinTiles; ++t) {
    const float* row = win + t * (p.dv + 2) + 2;
    t0[t] = t < p.n_win_tiles && lane < p.dv ? row[lane] : 0.0f;
    t1[t] = t < p.n_win_tiles && lane + kWarp < p.dv ? row[lane + kWarp] : 0.0f;
  }
  // The window (write_window's merge): lse_swa and o_swa.
  const float win_m = warp_max(tile_m);
  const float factor = exp_diff(tile_m, win_m);
  const float win_l = warp_sum(tile_l * factor);
  const float a_win = win_l > 0.0f ? win_m + __logf(win_l) : kNegInf;
  const float win_inv = win_l > 0.0f ? 1.0f / win_l : 0.0f;
  float wo0 = 0.0f, wo1 = 0.0f;
#pragma unroll
  for (int t = 0; t < kShortWinTiles; ++t) {
    const float ft = __shfl_sync(0xffffffffu, factor, t);
    wo0 = fmaf(t0[t], ft, wo0);
    wo1 = fmaf(t1[t], ft, wo1);
  }
  wo0 *= win_inv, wo1 *= win_inv;
  if (o_window && lane < p.dv) o_window[item * p.dv + lane] = wo0;
  if (o_window && lane + kWarp < p.dv) o_window[item * p.dv + lane + kWarp] = wo1;
  if (lse_window && lane == 0) lse_window[item] = a_win;
  float a = kNegInf;
  if (mine && c >= 0)
    a = p.hierarchical ? given : flat;
  const bool zero_logit = p.hierarchical && p.softmax1;
  const float m = fmaxf(fmaxf(warp_max(a), a_win), zero_logit ? 0.0f : kNegInf);
  const float l = warp_sum(exp_diff(a, m)) + exp_diff(a_win, m) + (zero_logit ? __expf(-m) : 0.0f);
  const float total = group_sums_nonfinite(p, w, item) ? kNaN : m == kNegInf ? kNegInf : m + __logf(l);
  auto weight = [&](float x) { return total == kNegInf ? 0.0f : exp_diff(x, total); };
  const float wi = weight(a), w_win = weight(a_win);
  float* fw = fusion_weights ? fusion_weights + item * (p.K + 2) : nullptr;
  if (fw && mine) fw[lane] = wi;
  float acc0 = w_win * wo0, acc1 = w_win * wo1;
#pragma unroll
  for (int i = 0; i < kShortK; ++i) {
    const float wj = __shfl_sync(0xffffffffu, wi, i);
    acc0 = fmaf(wj, v0[i], acc0);
    acc1 = fmaf(wj, v1[i], acc1);
  }
  if (lane < p.dv) o[item * p.dv + lane] = acc0;
  if (lane + kWarp < p.dv) o[item * p.dv + lane + kWarp] = acc1;
  if (lane == 0) {
    lse[item] = nonfinite_lse(total, acc0);
    if (fw) fw[p.K] = w_win, fw[p.K + 1] = zero_logit ? weight(0.0f) : 0.0f;
  }
}

template <bool kBatched, bool kShort>
__global__ void decode_fuse_kernel(DecodeParams p, DecodeScratch w, float* o, float* lse,
                                   float* fusion_weights, float* o_window, float* lse_window) {
  wait_for_previous_grid();
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  if (item >= p.B * p.Hq) return;
  if (kShort && fuse_merges_window(p))
    fuse_head_short(p, w, item, o, lse, fusion_weights, o_window, lse_window);
  else
    fuse_head<kBatched>(p, w, item, o, lse, fusion_weights);
}

}  // namespace
}  // namespace detail
}  // namespace hils::gpu
