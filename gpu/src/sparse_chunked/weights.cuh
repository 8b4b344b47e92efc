// The sparse stage's pair weights, formed before the chunk kernel: per (group, query) each head's
// fusion softmax (lse, o16 started at its window term) and each selected slot's weights w_c / l at
// the pair's bucket position (pair_weights_block: v21's fp32 weights or v30's fp16 records;
// pair_records_block: v36's lanes as (head, slots)), their kernels (fusion_pair_weights_kernel,
// pair_records_kernel), and v29's launch of the describe with segment 0's weights
// (bucket_and_weights_kernel).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "sparse_chunked/common.cuh"
#include "sparse_chunked/buckets.cuh"

namespace hils::gpu::detail {
namespace {

__device__ __forceinline__ void store4(__half* at, float4 x) {
  __half2* h2 = reinterpret_cast<__half2*>(at);
  h2[0] = __floats2half2_rn(x.x, x.y);
  h2[1] = __floats2half2_rn(x.z, x.w);
}

// chunked_v11, one warp per (group, query) of the segment: fusion_weights_kernel<__half>'s work
// for each head of the group (lse, o16 started at the window term), and each selected slot's
// weight w_c / l (the same arithmetic as v10's chunk kernel, so the same values), stored with
// the group's G heads side by side at the pair's position in the segment's bucket (the
// scatter's offset + rank): the chunk kernel then reads its rows' weights in order, one 32-byte
// sector per pair for G = 8, instead of two scattered 4-byte loads per row.
// Every head's selected scores, lse_swa and o_swa row are loaded before the first head's
// arithmetic (chunked_v13), with head j's o_swa row held by half-warp j % 2 (16 lanes x 16 bytes;
// chunked_v15: half the registers for the rows, 4 blocks per SM).
// Where fusion_pair_weights_kernel puts the pair weights of query t: segment s = t / seg (counted
// from t0's) has its pairs' bucket offsets at offsets + s offsets_stride and its pair weights at
// pair_weight + s pair_weight_stride (one segment per launch: s = 0).
struct SegmentTables {
  int64_t seg;
  const int32_t* offsets;
  int64_t offsets_stride;
  float* pair_weight;
  int64_t pair_weight_stride;
};
// The window rows (o_swa) of one query's G heads as a warp of pair_weights_block holds them
// (half-warps): a row (64 fp32 or fp16 values) is spread over kLanes lanes, 16 bytes
// each, so the warp holds kRowsAtOnce rows side by side; head j's row is held by the lanes
// lane / kLanes == j % kRowsAtOnce (fp32: half-warps, chunked_v15; fp16: quarter-warps, chunked_v24).
template <int G, typename OSwa>
struct WarpWindowRows {
  static constexpr int kLanes = kTileDim * static_cast<int>(sizeof(OSwa)) / 16;  // 16 (fp32) or 8 (fp16)
  static constexpr int kRowsAtOnce = kWarp / kLanes;
  static constexpr int kValues = 16 / static_cast<int>(sizeof(OSwa));  // per lane: 4 (fp32) or 8 (fp16)
  uint4 part[(G + kRowsAtOnce - 1) / kRowsAtOnce];

  // The rows of heads g G .. g G + G - 1 of query t (o_swa [Hq, T, 64]).
  __device__ __forceinline__ void load(const OSwa* o_swa, int64_t g, int64_t t, int64_t T, int lane) {
#pragma unroll
    for (int jj = 0; jj < (G + kRowsAtOnce - 1) / kRowsAtOnce; ++jj) {
      const int j = kRowsAtOnce * jj + lane / kLanes;
      if (j < G) part[jj] = reinterpret_cast<const uint4*>(o_swa + ((g * G + j) * T + t) * kTileDim)[lane % kLanes];
    }
  }
  // o16_row = head j's window row times f (each fp32 product rounded to fp16 once), stored by the
  // lanes that hold the row.
  __device__ __forceinline__ void store_scaled(int j, float f, __half* o16_row, int lane) const {
    if (lane / kLanes != j % kRowsAtOnce) return;
    const uint4 in = part[j / kRowsAtOnce];
    __half* at = o16_row + kValues * (lane % kLanes);
    if constexpr (std::is_same_v<OSwa, float>) {
      const float4 x = *reinterpret_cast<const float4*>(&in);
      store4(at, make_float4(x.x * f, x.y * f, x.z * f, x.w * f));
    } else {
      uint4 out;
      const __half2* from = reinterpret_cast<const __half2*>(&in);
      __half2* to = reinterpret_cast<__half2*>(&out);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 v = __half22float2(from[e]);
        to[e] = __floats2half2_rn(v.x * f, v.y * f);
      }
      *reinterpret_cast<uint4*>(at) = out;
    }
  }
};

// Block `block` of fusion_pair_weights_kernel (below).
// OSwa: float (the API's o_swa), or __half (an fp16 o_swa, chunked_v24 on with RowType::f16: head
// j's 128-byte row held by quarter-warp j % 4, 16 bytes per lane).
// kPairWeights: the format of the pair weights at tables.pair_weight (PairWeights; f16_records,
// chunked_v30: each pair's record, so no scatter is needed).
template <int G, typename OSwa = float, PairWeights kPairWeights = PairWeights::f32>
__device__ __forceinline__ void pair_weights_block(unsigned block, const LaunchParams& p, int64_t t0,
                                                   int64_t tn, int64_t nc, const int32_t* selection,
                                                   const float* selected_score, const OSwa* o_swa,
                                                   const float* lse_swa, const int32_t* rank,
                                                   const SegmentTables& tables, __half* o16, float* lse) {
  const int64_t item = static_cast<int64_t>(block) * kReduceWarps + threadIdx.x / kWarp;
  if (item >= p.Hkv * tn) return;
  const int lane = threadIdx.x % kWarp;
  const int64_t g = item / tn, tl = item % tn, t = t0 + tl;
  // The query's segment relative to t0's: its offsets and its pair weights.
  const int64_t s = t / tables.seg - t0 / tables.seg;
  const int32_t* seg_offsets = tables.offsets + s * tables.offsets_stride;
  float* pair_weight = tables.pair_weight + s * tables.pair_weight_stride;
  const int K = static_cast<int>(p.K);
  const int64_t pair0 = (g * p.T + t) * K;  // the pairs of (g, t) in the selection and in rank
  bool valid[2];
  int64_t pos[2];  // the pair's position in the segment's bucket
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int slot = lane + kWarp * i;
    const int32_t c = slot < K ? selection[pair0 + slot] : -1;
    valid[i] = c >= 0;
    pos[i] = valid[i] ? static_cast<int64_t>(seg_offsets[g * nc + c]) + rank[pair0 + slot] : 0;
  }
  float a[G][2], a_swa[G];
  WarpWindowRows<G, OSwa> window_rows;
  auto load_scores = [&](int j) {
    const int64_t row = (g * G + j) * p.T + t;
    const float* score = selected_score + row * K;
#pragma unroll
    for (int i = 0; i < 2; ++i) a[j][i] = valid[i] ? score[lane + kWarp * i] : kNegInf;
    a_swa[j] = lse_swa[row];
  };
#pragma unroll
  for (int j = 0; j < G; ++j) load_scores(j);
  window_rows.load(o_swa, g, t, p.T, lane);
  float w[2][G];
#pragma unroll
  for (int j = 0; j < G; ++j) {
    const int64_t row = (g * G + j) * p.T + t;
    float m = warp_max(fmaxf(fmaxf(a[j][0], a[j][1]), a_swa[j]));
    if (p.softmax1) m = fmaxf(m, 0.0f);
    float l = warp_sum(exp_diff(a[j][0], m) + exp_diff(a[j][1], m));
    const float w_swa = exp_diff(a_swa[j], m);
    l += w_swa;
    if (p.softmax1) l += exp_diff(0.0f, m);
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
    for (int i = 0; i < 2; ++i) w[i][j] = exp_diff(a[j][i], m) * inv;
    window_rows.store_scaled(j, w_swa * inv, o16 + row * kTileDim, lane);
    if (lane == 0) lse[row] = l > 0.0f ? m + __logf(l) : kNegInf;
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (!valid[i]) continue;
    if constexpr (kPairWeights == PairWeights::f16_records) {
      constexpr int kWords = pair_record_words<G>();
      uint32_t record[kWords] = {};
      record[0] = static_cast<uint32_t>((t % tables.seg) << 6 | (lane + kWarp * i));
#pragma unroll
      for (int j = 0; j < G; j += 2) {
        const __half2 h = __floats2half2_rn(w[i][j], j + 1 < G ? w[i][(j + 1) % G] : 0.0f);
        record[1 + j / 2] = *reinterpret_cast<const uint32_t*>(&h);
      }
      uint4* out = reinterpret_cast<uint4*>(reinterpret_cast<uint32_t*>(pair_weight) + pos[i] * kWords);
#pragma unroll
      for (int q4 = 0; q4 < kWords / 4; ++q4)
        out[q4] = make_uint4(record[4 * q4], record[4 * q4 + 1], record[4 * q4 + 2], record[4 * q4 + 3]);
      continue;
    }
    float* out = pair_weight + pos[i] * G;
    if constexpr (G % 4 == 0) {
#pragma unroll
      for (int j = 0; j < G; j += 4)
        *reinterpret_cast<float4*>(out + j) = make_float4(w[i][j], w[i][j + 1], w[i][j + 2], w[i][j + 3]);
    } else {
#pragma unroll
      for (int j = 0; j < G; ++j) out[j] = w[i][j];
    }
  }
}

// chunked_v36: pair_weights_block's work for v30's records (PairWeights::f16_records) where G <= 8
// and K <= 32, with the warp's lanes as (head j = lane / L, part q = lane % L), L = 32 / G lanes per
// head, lane (j, q) holding head j's scores of the S = G slots S q .. S q + S - 1 (two 16-byte loads
// for G = 8 instead of 16 scalar ones, half of them empty slots at K = 32): each head's maximum and
// sum over its L lanes only, all G heads at once. The sum is formed in warp_sum's order (its
// butterfly levels across lanes first, here across the head's lanes for every slot, then the
// lane's own slots by the same tree), so l, lse and every weight equal pair_weights_block's bit for
// bit. The weights go through shared memory to the lanes that store the records, as whole
// 16-byte parts side by side (G = 8: a 32-byte record by two adjacent lanes, one full sector,
// where pair_weights_block stored it from one lane in two 16-byte writes).
template <int G>
__host__ __device__ constexpr int lane_slots_row_words() { return (G + 1) / 2 + 1; }  // padded
template <int G, typename OSwa>
__device__ __forceinline__ void pair_records_block(unsigned block, const LaunchParams& p, int64_t t0, int64_t tn,
                                                   int64_t nc, const int32_t* selection,
                                                   const float* selected_score, const OSwa* o_swa,
                                                   const float* lse_swa, const int32_t* rank,
                                                   const SegmentTables& tables, __half* o16, float* lse) {
  static_assert(G <= 8 && kWarp % G == 0, "lanes as (head, part): G <= 8");
  constexpr int L = kWarp / G, S = G;  // lanes per head, slots per lane (L S = 32 >= K)
  constexpr int kWords = pair_record_words<G>(), kParts = kWords / 4, kRow = lane_slots_row_words<G>();
  __shared__ uint32_t weight_rows[kReduceWarps * kWarp * kRow];  // per warp: 32 slots x kRow words
  const int64_t item = static_cast<int64_t>(block) * kReduceWarps + threadIdx.x / kWarp;
  if (item >= p.Hkv * tn) return;
  const int lane = threadIdx.x % kWarp, j = lane / L, q = lane % L;
  const int64_t g = item / tn, t = t0 + item % tn;
  const int64_t s = t / tables.seg - t0 / tables.seg;
  const int32_t* seg_offsets = tables.offsets + s * tables.offsets_stride;
  auto* records = reinterpret_cast<uint32_t*>(tables.pair_weight + s * tables.pair_weight_stride);
  const int K = static_cast<int>(p.K);
  const int64_t pair0 = (g * p.T + t) * K, row = (g * G + j) * p.T + t;
  // Slot `lane`'s chunk and its record's position (pair_weights_block's, for slot = lane).
  const int32_t chunk = lane < K ? selection[pair0 + lane] : -1;
  const int32_t pos = chunk >= 0 ? seg_offsets[g * nc + chunk] + rank[pair0 + lane] : 0;
  const unsigned valid = __ballot_sync(0xffffffffu, chunk >= 0);
  float a[S];
  const float* score = selected_score + row * K + S * q;
  if constexpr (S % 4 == 0) {
    if (K % 4 == 0 && reinterpret_cast<uintptr_t>(selected_score) % 16 == 0) {
#pragma unroll
      for (int e = 0; e < S; e += 4) {
        const float4 v = S * q + e < K ? *reinterpret_cast<const float4*>(score + e)
                                       : make_float4(kNegInf, kNegInf, kNegInf, kNegInf);
        a[e] = v.x, a[e + 1] = v.y, a[e + 2] = v.z, a[e + 3] = v.w;
      }
    } else {
#pragma unroll
      for (int e = 0; e < S; ++e) a[e] = S * q + e < K ? score[e] : kNegInf;
    }
  } else {
#pragma unroll
    for (int e = 0; e < S; ++e) a[e] = S * q + e < K ? score[e] : kNegInf;
  }
  const float a_swa = lse_swa[row];
  WarpWindowRows<G, OSwa> window_rows;
  window_rows.load(o_swa, g, t, p.T, lane);
#pragma unroll
  for (int e = 0; e < S; ++e)
    if (!(valid >> (S * q + e) & 1u)) a[e] = kNegInf;
  float m = a_swa;
#pragma unroll
  for (int e = 0; e < S; ++e) m = fmaxf(m, a[e]);
#pragma unroll
  for (int off = L / 2; off > 0; off /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  if (p.softmax1) m = fmaxf(m, 0.0f);
  float x[S], sum[S];
#pragma unroll
  for (int e = 0; e < S; ++e) {
    x[e] = exp_diff(a[e], m);
    sum[e] = x[e];
#pragma unroll
    for (int off = L / 2; off > 0; off /= 2) sum[e] += __shfl_xor_sync(0xffffffffu, sum[e], off);
  }
#pragma unroll
  for (int h = S / 2; h > 0; h /= 2)
#pragma unroll
    for (int e = 0; e < h; ++e) sum[e] = sum[e] + sum[e + h];
  float l = sum[0];
  const float w_swa = exp_diff(a_swa, m);
  l += w_swa;
  if (p.softmax1) l += exp_diff(0.0f, m);
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  if (q == 0) lse[row] = l > 0.0f ? m + __logf(l) : kNegInf;
  const float f = w_swa * inv;
#pragma unroll
  for (int jj = 0; jj < G; ++jj)
    window_rows.store_scaled(jj, __shfl_sync(0xffffffffu, f, jj * L), o16 + ((g * G + jj) * p.T + t) * kTileDim,
                             lane);
  // The weights, slot-major: row c of this warp's weight_rows holds w_c of heads 0 .. G - 1 in fp16.
  uint32_t* rows = weight_rows + (threadIdx.x / kWarp) * kWarp * kRow;
  auto* halves = reinterpret_cast<__half*>(rows);
#pragma unroll
  for (int e = 0; e < S; ++e) {
    halves[(S * q + e) * 2 * kRow + j] = __float2half_rn(x[e] * inv);
    if (G % 2 == 1) halves[(S * q + e) * 2 * kRow + G] = __float2half_rn(0.0f);
  }
  __syncwarp();
  // Record part k = lane + 32 i: slot k / kParts, its 16-byte part k % kParts (the entry's word,
  // the weights' words, zeros), stored at the slot's position.
#pragma unroll
  for (int i = 0; i < kParts; ++i) {
    const int k = lane + kWarp * i, c = k / kParts, part = k % kParts;
    const int32_t at = __shfl_sync(0xffffffffu, pos, c);
    if (!(valid >> c & 1u)) continue;
    uint32_t w[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int word = 4 * part + u;
      w[u] = word == 0 ? static_cast<uint32_t>((t % tables.seg) << 6 | c)
             : word <= (G + 1) / 2 ? rows[c * kRow + word - 1]
                                   : 0u;
    }
    reinterpret_cast<uint4*>(records + static_cast<int64_t>(at) * kWords)[part] = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

// chunked_v36: pair_records_block as a kernel in v35's chain.
template <int G, typename OSwa>
__global__ void __launch_bounds__(kReduceWarps * kWarp, 4)
    pair_records_kernel(LaunchParams p, int64_t t0, int64_t tn, int64_t nc, const int32_t* selection,
                        const float* selected_score, const OSwa* o_swa, const float* lse_swa, const int32_t* rank,
                        SegmentTables tables, __half* o16, float* lse) {
  wait_previous_then_allow_next<true>();
  pair_records_block<G, OSwa>(blockIdx.x, p, t0, tn, nc, selection, selected_score, o_swa, lse_swa, rank, tables,
                              o16, lse);
}

// kChained: chunked_v35 (wait_previous_then_allow_next).
template <int G, typename OSwa = float, PairWeights kPairWeights = PairWeights::f32, bool kChained = false>
__global__ void __launch_bounds__(kReduceWarps * kWarp, 4)
    fusion_pair_weights_kernel(LaunchParams p, int64_t t0, int64_t tn, int64_t nc,
                               const int32_t* selection, const float* selected_score,
                               const OSwa* o_swa, const float* lse_swa, const int32_t* rank,
                               SegmentTables tables, __half* o16, float* lse) {
  wait_previous_then_allow_next<kChained>();
  pair_weights_block<G, OSwa, kPairWeights>(blockIdx.x, p, t0, tn, nc, selection, selected_score, o_swa, lse_swa,
                                            rank, tables, o16, lse);
}

// chunked_v29 on (v30, v35, v36): the describe (blocks [0, describe_blocks)) and the pair weights
// of segment 0 (queries [0, tn): the rest) in one launch of 256-thread blocks: both read only the
// count's and the scan's results, so the chunk kernel is the first to need them all; the pair
// weights as v30's records (no scatter). kChained: chunked_v35 (wait_previous_then_allow_next);
// kLaneSlots: chunked_v36 (pair_records_block).
template <int G, typename OSwa, bool kChained = false, bool kLaneSlots = false>
__global__ void __launch_bounds__(kReduceWarps * kWarp, 4)
    bucket_and_weights_kernel(DescribeArgs describe, unsigned describe_blocks, LaunchParams p, int64_t tn,
                              int64_t nc, const int32_t* selection, const float* selected_score, const OSwa* o_swa,
                              const float* lse_swa, const int32_t* rank, SegmentTables tables, __half* o16,
                              float* lse) {
  wait_previous_then_allow_next<kChained>();
  static_assert(kReduceWarps * kWarp == 256, "the describe runs 256-thread blocks");
  if (blockIdx.x < describe_blocks)
    describe_segment_items(static_cast<int64_t>(blockIdx.x) * 256 + threadIdx.x, describe);
  else if constexpr (kLaneSlots && G <= 8)
    pair_records_block<G, OSwa>(blockIdx.x - describe_blocks, p, 0, tn, nc, selection, selected_score, o_swa,
                                lse_swa, rank, tables, o16, lse);
  else
    pair_weights_block<G, OSwa, PairWeights::f16_records>(blockIdx.x - describe_blocks, p, 0, tn, nc, selection,
                                                          selected_score, o_swa, lse_swa, rank, tables, o16, lse);
}

}  // namespace
}  // namespace hils::gpu::detail
