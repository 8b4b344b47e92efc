// The packed selection's shared layer (select_packed.cu; every header under gpu/src/select_packed/
// includes it): the block's rows and tiles (kQueries, kRPitch, kPanelBytes), the group rules' and
// log2 e's constants, a block's first query (block_t0: heaviest tiles first, the one-wave rounds),
// base-2 exponentials and log2 Z_hat (log2_normalizer; accumulate_mass, pass 1's running mass),
// the rows' shared memory (SelectShared), the q~ fragments, a k' tile's scores (scale_and_mask)
// and copy (cp_async4, issue_tile), and flagged_rows (the warp's rows with a candidate: both offer
// paths and the one-pass kernel use it).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "launch_params.hpp"
#include "mma_common.cuh"
#include "wgmma_common.cuh"

namespace hils::gpu::detail {
namespace {

constexpr int kQueries = 64;     // queries per block, 16 per warp
constexpr int kRPitch = 65;      // fp32 per row of the group-score tile
constexpr int kPanelBytes = kTileDim * wg::kPanelRowBytes;  // v9: one swizzled k' tile
constexpr GroupRule kGroupMaxNormalized = GroupRule::max_normalized,
                    kGroupSumProbabilities = GroupRule::sum_probabilities;
constexpr float kLog2e = 1.4426950408889634f;

// First query of this block (its KV group is blockIdx.y). Blocks run in descending work: a
// block's work grows with its queries' causal candidate chunks (~t / S), so the heaviest blocks
// start first and the grid ends on the lightest instead of a last wave of the longest
// (gpu/NOTES.md "Pipelined forward"). first_round > 0 (a grid that fits the device in one wave,
// one_wave_first_round): the device takes the first first_round blocks in launch order (x
// fastest) one per SM and then the rest as each SM's second block; a group's blocks of the first
// round take its tiles from the heaviest down, those of the second round from the lightest up,
// so that an SM's second block is light where its first is heavy (gpu/NOTES.md "The selection's
// blocks in one wave"). Within each group this is a permutation of its tiles.
__device__ __forceinline__ int64_t block_t0(int queries, int first_round) {
  const int x = static_cast<int>(blockIdx.x), tiles = static_cast<int>(gridDim.x);
  const int in_first_round =
      first_round > 0 ? min(max(first_round - tiles * static_cast<int>(blockIdx.y), 0), tiles) : tiles;
  const int tile = x < in_first_round ? tiles - 1 - x : x - in_first_round;
  return static_cast<int64_t>(tile) * queries;
}

// Scores run in base 2 (s2 = s_hat log2 e): one ex2 per exponential, the same ranking.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float fast_log2(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// The largest float below x (-inf stays -inf): r > floor_of(x) <=> r >= x for every float r.
__device__ __forceinline__ float floor_of(float x) { return x == kNegInf ? x : nextafterf(x, kNegInf); }

// log2 Z_hat = log2(2^swa2 + l 2^m): running sum (m, l) of 2^s2 joined with the window's mass.
__device__ __forceinline__ float log2_normalizer(float m, float l, float swa2) {
  const float top = fmaxf(m, swa2);
  const float top_use = top == kNegInf ? 0.0f : top;
  return top_use + fast_log2(fast_exp2(m - top_use) * l + fast_exp2(swa2 - top_use));
}

// Running base-2 log-sum-exp of the warp's two rows (m, l: max and scaled sum) over a tile.
// lane_max (optional): this lane's maximum of each row over each of kParts groups of its 16
// columns of the tile (part k: the columns of n-tiles [8 k / kParts, 8 (k + 1) / kParts)).
template <int kParts = 1>
__device__ __forceinline__ void accumulate_mass(const float (&s)[8][4], float (&m)[2], float (&l)[2],
                                                float (*lane_max)[kParts] = nullptr) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float part_max[kParts];
#pragma unroll
    for (int k = 0; k < kParts; ++k) {
      part_max[k] = kNegInf;
#pragma unroll
      for (int nt = 8 * k / kParts; nt < 8 * (k + 1) / kParts; ++nt)
        part_max[k] = fmaxf(part_max[k], fmaxf(s[nt][2 * i], s[nt][2 * i + 1]));
    }
    float tile_max = part_max[0];
#pragma unroll
    for (int k = 1; k < kParts; ++k) tile_max = fmaxf(tile_max, part_max[k]);
    if (lane_max != nullptr)
#pragma unroll
      for (int k = 0; k < kParts; ++k) lane_max[i][k] = part_max[k];
    tile_max = quad_max(tile_max);
    const float m_new = fmaxf(m[i], tile_max);
    const float m_use = m_new == kNegInf ? 0.0f : m_new;
    float sum = 0.0f;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) sum += fast_exp2(s[nt][2 * i] - m_use) + fast_exp2(s[nt][2 * i + 1] - m_use);
    l[i] = l[i] * fast_exp2(m[i] - m_use) + quad_sum(sum);
    m[i] = m_new;
  }
}

// 4-byte asynchronous copy (zero-filled when !valid; src must still point into an allocation).
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem, bool valid) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int bytes = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(gmem), "r"(bytes));
}

struct SelectShared {
  float* r;          // [64][kRPitch] group scores of the current tile (base 2)
  float* log_z;      // [G][64] log2 Z_hat
  float* value;      // [64][K]
  int32_t* index;    // [64][K]
  int32_t* n_cand;   // [64] |V(t)| of each query (0 past T)
};

__device__ void load_query_fragments(uint32_t (&qa)[4][4], const LaunchParams& p, int64_t h,
                                     const int64_t (&t)[2]) {
  const auto* q = static_cast<const __nv_bfloat16*>(p.q_retrieval) + h * p.T * kTileDim;
  load_q_fragments(qa, t[0] < p.T ? q + t[0] * kTileDim : nullptr,
                   t[1] < p.T ? q + t[1] * kTileDim : nullptr);
}

// s2 = s * scale2 + bias2[col] in place; kNegInf where c0 + col >= n_cand (only when !full).
__device__ __forceinline__ void scale_and_mask(float (&s)[8][4], const float* bias2, float scale2,
                                               int c0, const int (&n_cand)[2], bool full) {
  const int lane = threadIdx.x % kWarp;
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
    const float2 b = *reinterpret_cast<const float2*>(bias2 + nt * 8 + (lane % 4) * 2);
#pragma unroll
    for (int e = 0; e < 4; ++e) s[nt][e] = fmaf(s[nt][e], scale2, e % 2 ? b.y : b.x);
  }
  if (full) return;
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (c0 + nt * 8 + (lane % 4) * 2 + (e % 2) >= n_cand[e / 2]) s[nt][e] = kNegInf;
}

// k' rows [c0, c0 + 64) of one head (bf16, [n_chunks, 64]) into a padded tile, and its 64
// biases, through the copy engine (zeros past n_chunks); 32-bit offsets from the head's base.
__device__ __forceinline__ void issue_tile(__nv_bfloat16 (*dst)[kTilePitch], float* bias_dst,
                                           const __nv_bfloat16* key_head, const float* bias_head,
                                           int c0, int n_chunks) {
#pragma unroll
  for (int j = 0; j < kTileDim * 8 / kPackedThreads; ++j) {
    const int seg = threadIdx.x + kPackedThreads * j, row = seg / 8, col = (seg % 8) * 8;
    const bool valid = c0 + row < n_chunks;
    cp_async16(&dst[row][col], key_head + (valid ? (c0 + row) * kTileDim + col : 0), valid);
  }
  if (threadIdx.x < kTileDim) {
    const bool valid = c0 + static_cast<int>(threadIdx.x) < n_chunks;
    cp_async4(&bias_dst[threadIdx.x], bias_head + (valid ? c0 + threadIdx.x : 0), valid);
  }
  cp_async_commit();
}

// Bit j (j + 8) of the result: the warp's row j (j + 8) has a candidate. Row j sits in the quad
// of lanes 4j .. 4j + 3: OR over the quad, one ballot bit per quad (bits 4j), compressed to bit j.
__device__ __forceinline__ unsigned flagged_rows(const bool (&any)[2]) {
  unsigned rows = 0;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    int a = any[i];
    a |= __shfl_xor_sync(0xffffffffu, a, 1);
    a |= __shfl_xor_sync(0xffffffffu, a, 2);
    unsigned x = __ballot_sync(0xffffffffu, a != 0) & 0x11111111u;
    x = (x | (x >> 3)) & 0x03030303u;
    x = (x | (x >> 6)) & 0x000F000Fu;
    x = (x | (x >> 12)) & 0xFFu;
    rows |= x << (8 * i);
  }
  return rows;
}

}  // namespace
}  // namespace hils::gpu::detail
