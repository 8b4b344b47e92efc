// Stages 2b and 3 of the decode step: log Z_hat per head from the scan's partials (Eq. 8), the
// window merge (write_window), the exact top-K (the radix select block_top_k; the short chains'
// warp sorts for K <= 32, since d12), the group scores r (Eq. 2) of 256 candidates per block and
// the select per (b, g) over the tiles' kept candidates.
#pragma once

#include <cstdint>

#include "decode/tiles.cuh"

namespace hils::gpu {
namespace detail {
namespace {

// Warp-wide LSE over the candidates of head `item` from the score tiles' (max, sum exp).
__device__ float candidate_lse(const DecodeParams& p, const DecodeScratch& w, int64_t item) {
  const int lane = threadIdx.x % kWarp;
  const float2* part = w.score_part + item * p.n_score_tiles;
  float m = kNegInf;
  for (int64_t i = lane; i < p.n_score_tiles; i += kWarp) m = fmaxf(m, part[i].x);
  m = warp_max(m);
  float l = 0.0f;
  for (int64_t i = lane; i < p.n_score_tiles; i += kWarp) l += part[i].y * exp_diff(part[i].x, m);
  l = warp_sum(l);
  return l > 0.0f ? m + __logf(l) : kNegInf;
}

// Warp-wide (max, sum) of head `item`'s window tiles: lse_swa = m + log l.
__device__ float2 window_stats(const DecodeParams& p, const DecodeScratch& w, int64_t item) {
  const int lane = threadIdx.x % kWarp;
  const float* part = w.win_part + item * p.n_win_tiles * (p.dv + 2);
  float m = kNegInf;
  for (int64_t i = lane; i < p.n_win_tiles; i += kWarp) m = fmaxf(m, part[i * (p.dv + 2)]);
  m = warp_max(m);
  float l = 0.0f;
  for (int64_t i = lane; i < p.n_win_tiles; i += kWarp)
    l += part[i * (p.dv + 2) + 1] * exp_diff(part[i * (p.dv + 2)], m);
  return make_float2(m, warp_sum(l));
}

__device__ float lse_of(float2 stats) {
  return stats.y > 0.0f ? stats.x + __logf(stats.y) : kNegInf;
}

// Warp-wide: merges head `item`'s window tiles into o_swa, lse_swa (scratch and outputs).
__device__ void write_window(const DecodeParams& p, const DecodeScratch& w, int64_t item,
                             float* o_window, float* lse_window) {
  const int lane = threadIdx.x % kWarp;
  const float2 stats = window_stats(p, w, item);
  const float* part = w.win_part + item * p.n_win_tiles * (p.dv + 2);
  const float inv = stats.y > 0.0f ? 1.0f / stats.y : 0.0f;
  for (int64_t dim = lane; dim < p.dv; dim += kWarp) {
    float acc = 0.0f;
    for (int64_t i = 0; i < p.n_win_tiles; ++i)
      acc += part[i * (p.dv + 2) + 2 + dim] * exp_diff(part[i * (p.dv + 2)], stats.x);
    w.win_o[item * p.dv + dim] = acc * inv;
    if (o_window) o_window[item * p.dv + dim] = acc * inv;
  }
  if (lane == 0) {
    w.win_lse[item] = lse_of(stats);
    if (lse_window) lse_window[item] = lse_of(stats);
  }
}

// The digit (bits [shift, shift+8)) holding the `rank`-th largest key (rank from 1) among the
// histogram; returns it and sets *above to the count in higher digits. Warp 0 only.
__device__ int find_digit(const int* hist, int rank, int* above) {
  const int lane = threadIdx.x % kWarp;
  // Lane owns the 8 digits 255 - 8 lane ... 248 - 8 lane (descending).
  int own = 0;
  for (int i = 0; i < 8; ++i) own += hist[255 - 8 * lane - i];
  int incl = own;
  for (int off = 1; off < kWarp; off *= 2) {
    const int y = __shfl_up_sync(0xffffffffu, incl, off);
    if (lane >= off) incl += y;
  }
  const int excl = incl - own;
  const bool mine = excl < rank && incl >= rank;
  const unsigned who = __ballot_sync(0xffffffffu, mine);
  const int src = __ffs(who) - 1;
  int digit = 0, count_above = 0;
  if (lane == src) {
    int acc = excl;
    for (int i = 0; i < 8; ++i) {
      const int dgt = 255 - 8 * lane - i;
      if (acc + hist[dgt] >= rank) {
        digit = dgt;
        break;
      }
      acc += hist[dgt];
    }
    count_above = acc;
  }
  *above = __shfl_sync(0xffffffffu, count_above, src);
  return __shfl_sync(0xffffffffu, digit, src);
}

// Block-wide exact top-k of n keys (larger first, equal keys: lower position first): calls
// emit(pos, c) for each chosen position c, pos = 0, 1, ... in ascending c; returns min(n, k).
// `work` receives the keys shifted and scaled (may alias src).
template <class Emit>
__device__ int block_top_k(const uint32_t* src, uint32_t* work, int64_t n, int64_t k, Emit emit) {
  __shared__ int hist[kRadixBins];
  __shared__ int digit_info[2];
  const int warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;
  if (n <= k) {
    for (int64_t c = threadIdx.x; c < n; c += blockDim.x) emit(static_cast<int>(c), c);
    return static_cast<int>(n);
  }
  // Keys shifted to start at the smallest and scaled so that their range fills 32 bits (a
  // monotone, one-to-one map): the first radix digit then splits the candidates instead of
  // holding the nearly constant sign and exponent bits of all of them.
  __shared__ uint32_t range[2 * kSelectThreads / kWarp];
  uint32_t lo_key = 0xffffffffu, hi_key = 0u;
  for (int64_t c = threadIdx.x; c < n; c += blockDim.x) {
    const uint32_t u = src[c];
    lo_key = min(lo_key, u), hi_key = max(hi_key, u);
  }
  lo_key = __reduce_min_sync(0xffffffffu, lo_key), hi_key = __reduce_max_sync(0xffffffffu, hi_key);
  if (threadIdx.x % kWarp == 0) range[2 * warp] = lo_key, range[2 * warp + 1] = hi_key;
  __syncthreads();
  for (int i = 0; i < warps; ++i) lo_key = min(lo_key, range[2 * i]), hi_key = max(hi_key, range[2 * i + 1]);
  const int spread = hi_key > lo_key ? __clz(hi_key - lo_key) : 0;
  for (int64_t c = threadIdx.x; c < n; c += blockDim.x) work[c] = (src[c] - lo_key) << spread;
  __syncthreads();
  const uint32_t* keys = work;
  // Radix select of the K-th largest key, 8 bits per pass from the top.
  uint32_t prefix = 0, mask = 0;
  int rank = static_cast<int>(k);
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < kRadixBins; i += blockDim.x) hist[i] = 0;
    __syncthreads();
    // Warp-aggregated: lanes with the same digit add once (the top digits of float keys are
    // nearly all equal, and 32 same-address shared atomics serialise).
    for (int64_t c0 = 0; c0 < n; c0 += blockDim.x) {
      const int64_t c = c0 + threadIdx.x;
      const uint32_t u = c < n ? keys[c] : 0u;
      const bool live = c < n && (u & mask) == prefix;
      const int bin = live ? static_cast<int>((u >> shift) & 0xffu) : kRadixBins;
      const unsigned peers = __match_any_sync(0xffffffffu, bin);
      if (live && static_cast<int>(threadIdx.x % kWarp) == __ffs(peers) - 1)
        atomicAdd(&hist[bin], __popc(peers));
    }
    __syncthreads();
    if (warp == 0) {
      int above = 0;
      const int digit = find_digit(hist, rank, &above);
      if (threadIdx.x == 0) digit_info[0] = digit, digit_info[1] = above;
    }
    __syncthreads();
    prefix |= static_cast<uint32_t>(digit_info[0]) << shift;
    mask |= 0xffu << shift;
    rank -= digit_info[1];
    __syncthreads();
  }
  // Keys above the threshold, then the `rank` lowest-index keys equal to it. Thread i walks
  // the contiguous range [i * per, (i + 1) * per) so that the output stays ascending.
  const uint32_t threshold = prefix;
  const int64_t per = (n + blockDim.x - 1) / blockDim.x;
  const int64_t lo = min(n, threadIdx.x * per), hi = min(n, lo + per);
  int n_eq = 0;
  for (int64_t c = lo; c < hi; ++c) n_eq += keys[c] == threshold;
  int total = 0;
  int eq_before = block_exclusive_scan(n_eq, &total);
  int n_sel = 0;
  for (int64_t c = lo, e = eq_before; c < hi; ++c) {
    const uint32_t u = keys[c];
    if (u > threshold) ++n_sel;
    else if (u == threshold && e++ < rank) ++n_sel;
  }
  int pos = block_exclusive_scan(n_sel, &total);
  for (int64_t c = lo, e = eq_before; c < hi; ++c) {
    const uint32_t u = keys[c];
    const bool take = u > threshold || (u == threshold && e++ < rank);
    if (take) emit(pos++, c);
  }
  __syncthreads();
  return total;
}

// ---- short chains (the fused kernel since d12): exact top-K for K <= 32 by warp sorts -------
// A candidate as one 64-bit rank: its order key above, 0xffffffff - chunk below, so that a larger
// rank is a larger key or, on equal keys, the lower chunk (the tie rule). 0 is "no candidate"
// (below every candidate). A warp holds 32 ranks (one per lane); a bitonic sort orders them in
// 15 shuffle steps, a merge of two sorted lists keeps the 32 largest in 6, with no block barrier:
// the radix select above needs 4 passes of 3-4 barriers each.

__device__ __forceinline__ uint64_t candidate_rank(uint32_t key, int64_t chunk) {
  return (static_cast<uint64_t>(key) << 32) | (0xffffffffu - static_cast<uint32_t>(chunk));
}
__device__ __forceinline__ int32_t rank_chunk(uint64_t rank) {
  return static_cast<int32_t>(0xffffffffu - static_cast<uint32_t>(rank));
}
__device__ __forceinline__ uint32_t rank_key(uint64_t rank) { return static_cast<uint32_t>(rank >> 32); }

// The warp's 32 values sorted descending (lane 0 the largest).
__device__ __forceinline__ uint64_t warp_sort_desc(uint64_t x) {
  const int lane = threadIdx.x % kWarp;
#pragma unroll
  for (int k = 2; k <= kWarp; k *= 2) {
#pragma unroll
    for (int j = k / 2; j > 0; j /= 2) {
      const uint64_t y = __shfl_xor_sync(0xffffffffu, x, j);
      const bool keep_max = ((lane & j) == 0) == ((lane & k) == 0);
      x = keep_max ? max(x, y) : min(x, y);
    }
  }
  return x;
}

// warp_sort_desc of N lists at once (their shuffles interleaved: one sort's latency, not N).
template <int N>
__device__ __forceinline__ void warp_sort_desc_batch(uint64_t (&x)[N]) {
  const int lane = threadIdx.x % kWarp;
#pragma unroll
  for (int k = 2; k <= kWarp; k *= 2) {
#pragma unroll
    for (int j = k / 2; j > 0; j /= 2) {
      const bool keep_max = ((lane & j) == 0) == ((lane & k) == 0);
      uint64_t y[N];
#pragma unroll
      for (int u = 0; u < N; ++u) y[u] = __shfl_xor_sync(0xffffffffu, x[u], j);
#pragma unroll
      for (int u = 0; u < N; ++u) x[u] = keep_max ? max(x[u], y[u]) : min(x[u], y[u]);
    }
  }
}

// The 32 largest of two descending lists, descending; `b_reversed` holds b[31 - lane].
// max(a[i], b[31 - i]) is bitonic and holds the 32 largest; half-cleaners sort it.
__device__ __forceinline__ uint64_t warp_merge_desc(uint64_t a, uint64_t b_reversed) {
  const int lane = threadIdx.x % kWarp;
  uint64_t x = max(a, b_reversed);
#pragma unroll
  for (int j = kWarp / 2; j > 0; j /= 2) {
    const uint64_t y = __shfl_xor_sync(0xffffffffu, x, j);
    x = (lane & j) == 0 ? max(x, y) : min(x, y);
  }
  return x;
}

__device__ __forceinline__ uint64_t lane_reversed(uint64_t x) {
  return __shfl_sync(0xffffffffu, x, kWarp - 1 - threadIdx.x % kWarp);
}

// Block-wide: every warp holds a descending list; returns on warp 0 the 32 largest of all of
// them, descending (other warps: their own list or a partial merge). `lists` holds 32 per warp.
// Each slot is written once (by the warp that gives its list away), so one barrier per level.
__device__ uint64_t block_merge_desc(uint64_t x, uint64_t* lists) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;
  for (int stride = 1; stride < warps; stride *= 2) {
    if (warp % (2 * stride) == stride) lists[warp * kWarp + lane] = x;
    __syncthreads();
    if (warp % (2 * stride) == 0 && warp + stride < warps)
      x = warp_merge_desc(x, lists[(warp + stride) * kWarp + kWarp - 1 - lane]);
  }
  return x;
}

// Warp-wide log Z_hat of head `item` (Eq. 8, the window and the candidates) in one pass: lane i
// loads window tile i's and score tile i's (max, sum) together, one round trip per 32 tiles
// (window_stats and candidate_lse take two each, one after the other).
__device__ float head_log_z(const DecodeParams& p, const DecodeScratch& w, int64_t item) {
  const int lane = threadIdx.x % kWarp;
  const float* win = w.win_part + item * p.n_win_tiles * (p.dv + 2);
  const float2* part = w.score_part + item * p.n_score_tiles;
  const int64_t n = p.n_win_tiles > p.n_score_tiles ? p.n_win_tiles : p.n_score_tiles;
  float m = kNegInf, l = 0.0f;
  for (int64_t i = lane; i < n; i += kWarp) {
    const bool in_win = i < p.n_win_tiles;
    const float wm = in_win ? win[i * (p.dv + 2)] : kNegInf;
    const float wl = in_win ? win[i * (p.dv + 2) + 1] : 0.0f;
    const float2 sp = i < p.n_score_tiles ? part[i] : make_float2(kNegInf, 0.0f);
    const float mn = fmaxf(m, fmaxf(wm, sp.x));
    l = l * exp_diff(m, mn) + wl * exp_diff(wm, mn) + sp.y * exp_diff(sp.x, mn);
    m = mn;
  }
  const float top = warp_max(m);
  const float sum = warp_sum(l * exp_diff(m, top));
  return sum > 0.0f ? top + __logf(sum) : kNegInf;
}

// ---- 2b. group scores: r (Eq. 2) of 256 candidates per block, one block per (tile, b, g) ---
// log Z_hat per head (Eq. 8) is recomputed by every tile from the partials (a few KB). A tile
// where a head of the group has a non-finite score among its 256 candidates (a NaN sum of score
// tile `tile`: score_tile) writes NaN into window tile 0's unnormalised o of every head of the
// group (win_part, which no group-score tile reads and launch 1 rewrites every step): the
// window's o_swa, hence the fuse's o and lse, are NaN (gpu/NOTES.md "Non-finite summary rows
// (session 22)"; fuse.cuh), and the fuse loads nothing more for it.
// kShort with K <= 32: the tile's K best by warp sorts and a merge tree (no radix passes); the
// kept candidates are then in no particular order (the select of kShort ranks them by chunk too).
template <bool kShort>
__device__ void group_score_tile(const DecodeParams& p, const DecodeScratch& w, int64_t tile,
                                 int64_t bg) {
  __shared__ float log_z[64];
  const int64_t b = bg / p.Hkv, g = bg % p.Hkv;
  const int warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;
  const int64_t tile_first = tile * kScoreThreads;
  const int64_t c = tile_first + threadIdx.x;
  const bool valid = c < p.n_cand;
  const float* scores = w.scores + (b * p.Hq + g * p.G) * p.n_chunks + c;
  // kShort, G <= 16: the candidate's scores are loaded before log Z_hat, which takes one pass.
  const bool preload = kShort && p.G <= kFastMaxGroup;
  // thread j < G: head j's sum exp over this tile's candidates (score tile `tile`)
  const float tile_sum = threadIdx.x < p.G
      ? w.score_part[(b * p.Hq + g * p.G + threadIdx.x) * p.n_score_tiles + tile].y : 0.0f;
  float pre[kFastMaxGroup];
  if (preload) {
#pragma unroll
    for (int j = 0; j < kFastMaxGroup; ++j) pre[j] = valid && j < p.G ? scores[j * p.n_chunks] : kNegInf;
  }
  for (int64_t j = warp; j < p.G; j += warps) {
    const int64_t item = b * p.Hq + g * p.G + j;
    const float z = kShort ? head_log_z(p, w, item)
                           : logaddexp(lse_of(window_stats(p, w, item)), candidate_lse(p, w, item));
    if (threadIdx.x % kWarp == 0) log_z[j] = z;
  }
  if (__syncthreads_or(isnan(tile_sum)))
    for (int64_t i = threadIdx.x; i < p.G * p.dv; i += blockDim.x)
      w.win_part[((b * p.Hq + g * p.G + i / p.dv) * p.n_win_tiles) * (p.dv + 2) + 2 + i % p.dv] = kNaN;
  float r = p.group_rule == static_cast<int>(GroupRule::sum_probabilities) ? 0.0f : kNegInf;
  auto add_head = [&](int64_t j, float s) {
    if (p.group_rule == static_cast<int>(GroupRule::max_normalized)) r = fmaxf(r, s - log_z[j]);
    else if (p.group_rule == static_cast<int>(GroupRule::sum_probabilities))
      r += __expf(s - log_z[j]);
    else r = fmaxf(r, s);
  };
  if (preload) {
#pragma unroll
    for (int j = 0; j < kFastMaxGroup; ++j)
      if (valid && j < p.G) add_head(j, pre[j]);
  } else {
    for (int64_t j = 0; valid && j < p.G; ++j) add_head(j, scores[j * p.n_chunks]);
  }
  // The tile keeps its `keep` best (ties: lower chunk); the select block picks among them.
  const int64_t keep = tile_keep(p), rest = p.n_cand - tile_first;
  const int64_t n_tile = rest < kScoreThreads ? rest : kScoreThreads;
  uint32_t* out_key = w.cand_key + (bg * p.n_score_tiles + tile) * keep;
  int32_t* out_idx = w.cand_idx + (bg * p.n_score_tiles + tile) * keep;
  if (kShort && keep <= kShortK) {
    __shared__ uint64_t lists[kScoreThreads];
    uint64_t x = warp_sort_desc(valid ? candidate_rank(order_key(r), c) : 0u);
    x = block_merge_desc(x, lists);
    const int lane = threadIdx.x % kWarp;
    if (threadIdx.x < kWarp && lane < keep && lane < n_tile)
      out_key[lane] = rank_key(x), out_idx[lane] = rank_chunk(x);
    return;
  }
  __shared__ uint32_t orig[kScoreThreads], work[kScoreThreads];
  orig[threadIdx.x] = valid ? order_key(r) : 0u;
  __syncthreads();
  block_top_k(orig, work, n_tile, keep, [&](int pos, int64_t i) {
    out_key[pos] = orig[i];
    out_idx[pos] = static_cast<int32_t>(tile_first + i);
  });
}

template <bool kShort>
__global__ void decode_group_score_kernel(DecodeParams p, DecodeScratch w) {
  wait_for_previous_grid();
  group_score_tile<kShort>(p, w, blockIdx.x, blockIdx.y);
  allow_next_grid();
}

// ---- 3. select: one block per (b, g), over the tiles' kept candidates -----------------------
// merge_window: o_swa and lse_swa from the window tiles here (false: the fuse merges them).
__device__ void select_group(const DecodeParams& p, const DecodeScratch& w, int64_t bg,
                             float* o_window, float* lse_window, uint32_t* smem_keys,
                             bool merge_window = true) {
  const int64_t b = bg / p.Hkv, g = bg % p.Hkv;
  const int warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;
  for (int64_t j = warp; merge_window && j < p.G; j += warps)
    write_window(p, w, b * p.Hq + g * p.G + j, o_window, lse_window);
  int32_t* sel = w.selection + bg * p.K;
  const int64_t n = p.n_cand;
  if (p.K == 0) return;
  if (n <= p.K) {  // every candidate is selected
    for (int64_t i = threadIdx.x; i < p.K; i += blockDim.x)
      sel[i] = i < n ? static_cast<int32_t>(i) : -1;
    return;
  }
  // Every tile but the last kept `keep` candidates; they lie in ascending chunk order.
  const int64_t keep = tile_keep(p), m = kept_candidates(p);
  uint32_t* src = w.cand_key + bg * p.n_score_tiles * keep;
  const int32_t* idx = w.cand_idx + bg * p.n_score_tiles * keep;
  uint32_t* work = m <= kSelectSmemKeys ? smem_keys : src;
  const int total = block_top_k(src, work, m, p.K, [&](int pos, int64_t c) {
    if (pos < p.K) sel[pos] = idx[c];
  });
  for (int64_t i = total + threadIdx.x; i < p.K; i += blockDim.x) sel[i] = -1;
}

// kShort with select_by_sorts, kThreads threads (kShortSelectThreads since d13, d12 ran 256; 128 in
// d36's chunk tiles): warp w ranks the kept candidates w * 32 + lane, + kThreads, ... (sorts and
// merges in registers; kBatch lists of 32 loaded at once), a merge tree gives the K best, a last
// sort orders them by chunk. The first candidates' loads are issued before the window merge (when
// this block does it) so that they overlap. kPresorted (d35, when tile_keep is 32): warp w's 32
// candidates are group-score tile w's kept list, which that tile wrote in descending rank order
// (lane 0 the largest; a partial last tile padded below by 0), so the warp's sort is skipped: the
// same lists reach the same merges. emit(slot, chunk) takes the K chunks in ascending order
// (SelectionOut: the group's selection).
struct SelectionOut {
  int32_t* at;
  __device__ void operator()(int slot, int32_t chunk) const { at[slot] = chunk; }
};

template <int kThreads, int kBatch, bool kPresorted = false, class Emit>
__device__ void select_group_short(const DecodeParams& p, const DecodeScratch& w, int64_t bg,
                                   float* o_window, float* lse_window, bool merge_window,
                                   Emit emit) {
  __shared__ uint64_t lists[kThreads];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = kThreads / kWarp;
  const int64_t b = bg / p.Hkv, g = bg % p.Hkv;
  const int64_t keep = tile_keep(p), m = kept_candidates(p);
  const uint32_t* src = w.cand_key + bg * p.n_score_tiles * keep;
  const int32_t* idx = w.cand_idx + bg * p.n_score_tiles * keep;
  const int64_t step = static_cast<int64_t>(warps) * kWarp;
  uint64_t x[kBatch];
  auto load = [&](int64_t base) {
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int64_t i = base + u * step + lane;
      x[u] = i < m ? candidate_rank(__ldg(src + i), __ldg(idx + i)) : 0u;
    }
  };
  int64_t base = warp * kWarp;
  load(base);
  for (int64_t j = warp; merge_window && j < p.G; j += warps)
    write_window(p, w, b * p.Hq + g * p.G + j, o_window, lse_window);
  uint64_t best = 0;
  // The batch's sorted lists into the K best so far, then the next batch's loads.
  auto merge_batch = [&] {
#pragma unroll
    for (int width = 1; width < kBatch; width *= 2)  // a merge tree over the batch's lists
#pragma unroll
      for (int u = 0; u + width < kBatch; u += 2 * width)
        x[u] = warp_merge_desc(x[u], lane_reversed(x[u + width]));
    best = warp_merge_desc(best, lane_reversed(x[0]));
    base += kBatch * step;
    if (base < m) load(base);
  };
  if constexpr (kPresorted) {
#pragma unroll 1  // unrolled, ptxas spilled 156 bytes at 64 registers
    while (base < m) merge_batch();
  }
  while (!kPresorted && base < m) {
    warp_sort_desc_batch(x);
    merge_batch();
  }
  best = block_merge_desc(best, lists);
  if (warp == 0) {
    // The K best by chunk: sort their low words (0xffffffff - chunk) descending.
    const uint64_t low = lane < p.K ? (best & 0xffffffffu) : 0u;
    const int32_t chunk = rank_chunk(warp_sort_desc(low));
    if (lane < p.K) emit(lane, chunk);
  }
}

template <bool kShort>
__global__ void decode_select_kernel(DecodeParams p, DecodeScratch w, float* o_window,
                                     float* lse_window) {
  extern __shared__ uint32_t smem_keys[];
  wait_for_previous_grid();
  const bool merge_window = !(kShort && fuse_merges_window(p));  // else the fuse merges it
  select_group(p, w, blockIdx.x, o_window, lse_window, smem_keys, merge_window);
  allow_next_grid();
}

// The fused kernel's select when select_by_sorts (kShortSelectThreads threads); kPresorted
// (d35) only where select_presorted.
template <bool kPresorted = false>
__global__ void __launch_bounds__(kShortSelectThreads)
    decode_select_sorted_kernel(DecodeParams p, DecodeScratch w, float* o_window,
                                float* lse_window) {
  wait_for_previous_grid();
  select_group_short<kShortSelectThreads, 1, kPresorted>(
      p, w, blockIdx.x, o_window, lse_window, !fuse_merges_window(p),
      SelectionOut{w.selection + blockIdx.x * p.K});
  allow_next_grid();
}

}  // namespace
}  // namespace detail
}  // namespace hils::gpu
