// The decode step's shared layer (gpu/NOTES.md "decode"; every stage header under gpu/src/decode/
// includes it): the block shapes, the parameters (DecodeParams) and scratch pointers
// (DecodeScratch) that every decode kernel takes by value, the short tails' launch conditions
// (host and device, since d12), and small device helpers: logaddexp, order_key, programmatic
// dependent launch (wait_for_previous_grid, allow_next_grid) and a block-wide prefix sum.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "device_common.cuh"
#include "hils/gpu/decode.hpp"

namespace hils::gpu {
namespace detail {
namespace {

constexpr int kDecodeTileSlots = 64;    // window slots per window block item
constexpr int kScoreThreads = 256;      // chunks per score block (one per thread)
constexpr int kSelectThreads = 256;
constexpr int kSelectSmemKeys = 10240;  // keys in 40 KiB of shared memory (+ static < 48 KiB)
constexpr int kRadixBins = 256;

// Everything a decode kernel needs, by value.
struct DecodeParams {
  int64_t B, T, Hq, Hkv, G, d, dv, S, W, K;
  int64_t slot_cap, chunk_cap, n_chunks, n_cand;  // n_cand = |V(T-1)|
  int64_t win_lo, n_win_tiles, n_score_tiles;
  float scale;
  bool landmarks, softmax1, hierarchical;
  int group_rule;  // hils::GroupRule value
  const __nv_bfloat16 *q, *q_retrieval, *k, *v;
  const void* summary_key;      // bf16 or fp8 e4m3 (SummaryType)
  const float* summary_bias;
  const float* summary_scale;   // fp8: the row scales; null for bf16 (scale 1)
  const float* summary_key_fp32;  // hierarchical: fp32 rows for the selected chunks' fusion logits
  const __half2* summary_scale_bias;      // int4_h: (s16, b'16) per row, read by d40's scan
};

// Scratch pointers of one step (decode_workspace_bytes sizes them).
struct DecodeScratch {
  float* scores;        // [B, Hq, n_chunks] (the caller's surrogate output when given)
  float2* score_part;   // [B, Hq, n_score_tiles] (max, sum exp) of each score tile
  float* win_part;      // [B, Hq, n_win_tiles, dv + 2] (m, l, unnormalised o)
  float* win_o;         // [B, Hq, dv]
  float* win_lse;       // [B, Hq]
  int32_t* selection;   // [B, Hkv, K] (the caller's output when given)
  float* chunk_part;    // [B, Hq, K, dv + 1] (lse_c, normalised o_c)
  uint32_t* cand_key;   // [B, Hkv, n_score_tiles, min(K, 256)] each tile's K best r (as keys)
  int32_t* cand_idx;    // same shape: their chunk indices, ascending within each tile
  float* fusion_logit;  // [B, Hq, K] s_hat of the selected chunks from summary_key_fp32
};

// The shortened tails of the fused kernel (since d12) for K <= kShortK selected chunks; since
// d13 its fuse also merges the window tiles when dv <= kShortDim and there are at most
// kShortWinTiles of them (fuse_merges_window), and the select then leaves the window alone.
constexpr int kShortK = 32;
constexpr int kShortDim = 64;
constexpr int kShortWinTiles = 16;
constexpr int kShortSelectThreads = 1024;  // the select's block for K <= 32 (one list per warp)

__host__ __device__ inline bool fuse_merges_window(const DecodeParams& p) {
  return p.K <= kShortK && p.dv <= kShortDim && p.n_win_tiles <= kShortWinTiles;
}
// The select ranks by warp sorts (select_group_short) rather than radix passes.
__host__ __device__ inline bool select_by_sorts(const DecodeParams& p) {
  return p.K > 0 && p.K <= kShortK && p.n_cand > p.K;
}

// Candidates each 256-chunk tile keeps for the final selection.
__host__ __device__ inline int64_t tile_keep(const DecodeParams& p) {
  return p.K < kScoreThreads ? p.K : kScoreThreads;
}

// The select's warps may take the kept lists as sorted (d35): one tile's list of 32 per warp.
__host__ __device__ inline bool select_presorted(const DecodeParams& p) {
  return select_by_sorts(p) && tile_keep(p) == kWarp;
}
// d36's chunk tiles select themselves: presorted lists, and the fuse merges the window (the
// select would otherwise).
__host__ __device__ inline bool chunks_can_select(const DecodeParams& p) {
  return select_presorted(p) && fuse_merges_window(p);
}

// Candidates the select block ranks: `keep` from every full tile, fewer from the last.
__host__ __device__ inline int64_t kept_candidates(const DecodeParams& p) {
  const int64_t tiles = (p.n_cand + kScoreThreads - 1) / kScoreThreads;
  const int64_t last = p.n_cand - (tiles - 1) * kScoreThreads;
  return (tiles - 1) * tile_keep(p) + (last < tile_keep(p) ? last : tile_keep(p));
}

__device__ __forceinline__ float logaddexp(float a, float b) {
  const float m = fmaxf(a, b);
  return m == kNegInf ? kNegInf : m + __logf(__expf(a - m) + __expf(b - m));
}

// Monotone map of a float to uint32: a > b  <=>  key(a) > key(b).
__device__ __forceinline__ uint32_t order_key(float x) {
  const uint32_t u = __float_as_uint(x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Programmatic dependent launch (Hopper; the tails of the fused kernel and d29-d35): a kernel
// launched with cudaLaunchAttributeProgrammaticStreamSerialization may start while the previous
// kernel of the stream still runs; wait_for_previous_grid() returns once that kernel has completed
// and its writes are visible, so every read of an earlier stage's output and every global write
// comes after it. allow_next_grid() lets the next kernel launch once every block of this one has
// called it (or exited): each block calls it after its last store (session 9 run 1 called it first,
// and the early-resident tails slowed the running kernel). Both are no-ops for a kernel launched
// without the attribute (d5's), and compile to nothing below sm_90.
__device__ __forceinline__ void wait_for_previous_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void allow_next_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Exclusive prefix sum over the block (blockDim.x multiple of 32, <= 1024); total in *total.
__device__ int block_exclusive_scan(int x, int* total) {
  __shared__ int warp_sums[32];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int warps = blockDim.x / kWarp;
  int incl = x;
  for (int off = 1; off < kWarp; off *= 2) {
    const int y = __shfl_up_sync(0xffffffffu, incl, off);
    if (lane >= off) incl += y;
  }
  if (lane == kWarp - 1) warp_sums[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    int w = lane < warps ? warp_sums[lane] : 0;
    for (int off = 1; off < kWarp; off *= 2) {
      const int y = __shfl_up_sync(0xffffffffu, w, off);
      if (lane >= off) w += y;
    }
    if (lane < warps) warp_sums[lane] = w;  // inclusive over warps
  }
  __syncthreads();
  const int before = (warp > 0 ? warp_sums[warp - 1] : 0) + incl - x;
  *total = warp_sums[warps - 1];
  __syncthreads();
  return before;
}

}  // namespace
}  // namespace detail
}  // namespace hils::gpu
