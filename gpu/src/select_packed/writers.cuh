// The writers of a query's selection row and its fp32 selected scores, sigma (q~ . k') + b' summed
// in dot8's order, so that every writer gives the same bits: write_selected_chunks (the row),
// write_selection (v4, v5, v8: from the fp32 summaries), write_selection_ahead (v15: its loads one
// unit ahead), and the scores kernel that runs after the selection (selected_scores_lean_kernel:
// v21, and with kPlain v22 and v25, from the bf16 copy of k').
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "select_packed/common.cuh"

namespace hils::gpu::detail {
namespace {

// The fp32 selected score of one slot and head is sigma (q~ . k') + b' with the dot product in
// 8 parts of 8 dims (part j: dims 8 j .. 8 j + 7, one FMA chain each) summed as the tree
// ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7)), every operation rounded explicitly (no
// contraction choices of the compiler): any writer that keeps this order gives the same bits.
__device__ __forceinline__ float dot8(const float (&q)[8], float4 k0, float4 k1) {
  float a = __fmul_rn(q[0], k0.x);
  a = __fmaf_rn(q[1], k0.y, a);
  a = __fmaf_rn(q[2], k0.z, a);
  a = __fmaf_rn(q[3], k0.w, a);
  a = __fmaf_rn(q[4], k1.x, a);
  a = __fmaf_rn(q[5], k1.y, a);
  a = __fmaf_rn(q[6], k1.z, a);
  return __fmaf_rn(q[7], k1.w, a);
}

// A query's selection row: index (its K entries, the valid ones first, -1 after) written
// ascending, -1 padded. Returns n (the valid entries); rank_of[i]: the place of slot lane + 32 i.
__device__ __forceinline__ int write_selected_chunks(const LaunchParams& p, const int32_t* index, int64_t t,
                                                     int64_t g, int32_t* selection, int (&rank_of)[2]) {
  const int lane = threadIdx.x % kWarp;
  const int K = static_cast<int>(p.K);
  const int n = __popc(__ballot_sync(0xffffffffu, lane < K && index[lane] >= 0)) +
                (K > kWarp ? __popc(__ballot_sync(0xffffffffu, lane + kWarp < K && index[lane + kWarp] >= 0)) : 0);
  // Slots lane and lane + 32 (K <= 64): chunk and rank in the ascending list.
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int e = lane + kWarp * i;
    const int32_t c = e < n ? index[e] : -1;
    int rank = e;
    if (e < n) {
      rank = 0;
      for (int f = 0; f < n; ++f) rank += index[f] < c;
    }
    rank_of[i] = rank;
    if (e < K) selection[(g * p.T + t) * K + rank] = c;
  }
  return n;
}

// One step of the selected-score sums: slots 4 j + group (group = lane / 8) of one head, lane
// holding dims 8 part .. 8 part + 7 (part = lane % 8) of q~ (qf) and of the slot's key row (k0,
// k1). The xor butterfly over the 8 parts is dot8's sum tree (addition commutes); lane e % 32
// of slot e (< n) takes sigma * sum + its bias into score[e / 32].
__device__ __forceinline__ void selected_score_step(const float (&qf)[8], float4 k0, float4 k1, int j, int n,
                                                    float scale, const float (&own_bias)[2], float (&score)[2]) {
  const int lane = threadIdx.x % kWarp;
  float acc = dot8(qf, k0, k1);
  acc = __fadd_rn(acc, __shfl_xor_sync(0xffffffffu, acc, 1));
  acc = __fadd_rn(acc, __shfl_xor_sync(0xffffffffu, acc, 2));
  acc = __fadd_rn(acc, __shfl_xor_sync(0xffffffffu, acc, 4));
  // Slot e's sum is in lanes 8 group .. 8 group + 7; lane e % 32 collects it.
  const float mine = __shfl_sync(0xffffffffu, acc, 8 * ((lane - 4 * j) & 3));
  if ((lane & ~3) == ((4 * j) & 31) && 4 * j + (lane & 3) < n) {
    if (4 * j < kWarp) score[0] = __fmaf_rn(scale, mine, own_bias[0]);
    else score[1] = __fmaf_rn(scale, mine, own_bias[1]);
  }
}

// 8 packed 16-bit values (16 bytes: bf16 or fp16, Elem) as floats (exact).
template <class Elem = __nv_bfloat16>
__device__ __forceinline__ void to_float8(uint4 raw, float (&out)[8]) {
  using Pair = std::conditional_t<std::is_same_v<Elem, __half>, __half2, __nv_bfloat162>;
  const Pair* pairs = reinterpret_cast<const Pair*>(&raw);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    float2 f;
    if constexpr (std::is_same_v<Elem, __half>) f = __half22float2(pairs[j]);
    else f = __bfloat1622float2(pairs[j]);
    out[2 * j] = f.x, out[2 * j + 1] = f.y;
  }
}

// One lane's q~ row . k' row over kTileDim dims from the fp32 k', 8 dims at a time (v27's rare
// path: a selected score that the fp16 copy of k' made non-finite).
__device__ __forceinline__ float dot64_from_fp32(const __nv_bfloat16* q_row, const float* k_row) {
  float acc = 0.0f;
#pragma unroll 1
  for (int part = 0; part < kTileDim / 8; ++part) {
    float qf[8];
    to_float8(*reinterpret_cast<const uint4*>(q_row + 8 * part), qf);
    acc += dot8(qf, *reinterpret_cast<const float4*>(k_row + 8 * part),
                *reinterpret_cast<const float4*>(k_row + 8 * part + 4));
  }
  return acc;
}

// Writes a query's list (index: its K entries, the valid ones first, -1 after) ascending, -1
// padded, with fp32 s_hat of every head of the group. The dot products run 4 at a time per warp:
// 8 lanes per slot, 8 dims (one dot8 part) per lane (16-byte loads).
// The scores only (write_selected_scores): slot e's score goes to rank_of[e / 32] (lane e % 32).
// key: the fp32 summaries (v8's bits).
__device__ void write_selected_scores(const LaunchParams& p, const int32_t* index, int n, const int (&rank_of)[2],
                                      int64_t t, int64_t g, int G, const float* key, const float* bias,
                                      float* selected_score);
__device__ void write_selection(const LaunchParams& p, const int32_t* index, int64_t t,
                                int64_t g, int G, const float* key, const float* bias,
                                int32_t* selection, float* selected_score) {
  int rank_of[2];
  const int n = write_selected_chunks(p, index, t, g, selection, rank_of);
  write_selected_scores(p, index, n, rank_of, t, g, G, key, bias, selected_score);
}
// Dims 8 part .. 8 part + 7 of a key row as floats (k0: the first four).
__device__ __forceinline__ void load_key_part(const float* row, float4& k0, float4& k1) {
  k0 = *reinterpret_cast<const float4*>(row);
  k1 = *reinterpret_cast<const float4*>(row + 4);
}
__device__ void write_selected_scores(const LaunchParams& p, const int32_t* index, int n, const int (&rank_of)[2],
                                      int64_t t, int64_t g, int G, const float* key, const float* bias,
                                      float* selected_score) {
  const int lane = threadIdx.x % kWarp;
  const int K = static_cast<int>(p.K);
  const int64_t n_chunks = p.T / p.S;
  const auto* qr = static_cast<const __nv_bfloat16*>(p.q_retrieval);
  const int part = lane % 8, group = lane / 8;  // dims 8 part .. 8 part + 7 of slot 4 j + group
  for (int hg = 0; hg < G; ++hg) {
    const int64_t h = g * G + hg;
    float qf[8];
    to_float8(*reinterpret_cast<const uint4*>(qr + (h * p.T + t) * kTileDim + 8 * part), qf);
    float score[2] = {kNegInf, kNegInf};
    // Biases of the slots this lane collects (lane, lane + 32), loaded ahead of the sums.
    float own_bias[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int e = lane + kWarp * i;
      own_bias[i] = e < n ? bias[h * n_chunks + index[e]] : 0.0f;
    }
    // Batches of 4 steps (16 slots): every key load of a batch is in flight before the sums.
    constexpr int kBatch = 4;
    for (int j0 = 0; j0 < 16 && 4 * j0 < n; j0 += kBatch) {
      float4 k0[kBatch], k1[kBatch];
#pragma unroll
      for (int jj = 0; jj < kBatch; ++jj) {
        const int e = 4 * (j0 + jj) + group;
        if (e < n)
          load_key_part(key + (h * n_chunks + index[e]) * kTileDim + 8 * part, k0[jj], k1[jj]);
        else
          k0[jj] = k1[jj] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
#pragma unroll
      for (int jj = 0; jj < kBatch; ++jj) selected_score_step(qf, k0[jj], k1[jj], j0 + jj, n, p.scale, own_bias, score);
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int e = lane + kWarp * i;
      if (e < K) selected_score[(h * p.T + t) * K + rank_of[i]] = score[i];
    }
  }
}

// v21: v20's scores kernel (bf16 k', K <= 32) with the same sums in fewer instructions. v20's
// warp spends ~550 instructions per head on 32 dot products of 64 dims (ncu at 512K: 4.6e9
// instructions, 7.9 ms of v20's 43.5): the selection row's entries and their 64-bit row
// addresses again for every head, and per step of 4 slots a butterfly of 3 shuffles and adds
// plus a fourth shuffle to the collecting lane. Here the entries are read once per query (lane e
// holds entry e; lane (group, part) gets the chunks of its slots 4 j + group, j < 8, by shuffles
// as 32-bit element offsets), all 8 key parts of a head are loaded before the sums, and the 8
// steps' partial dot8 sums are reduced by one reduce-scatter over the 8 lanes of a slot group
// (xor 1, 2, 4: 7 shuffles and 7 adds for the 8 steps), after which lane (group, part) holds
// slot 4 s + group, s = part bit-reversed, and stores it. The pairs added are dot8's tree's
// ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7)) over the parts, as v20's butterfly adds
// them (each add commutes exactly), then sigma sum + b': v20's bytes by construction.
// kPlain (v22): every slot's key part and bias loaded without a test (a slot past the row's
// entries reads chunk 0 of the head, which its sums, never stored, ignore; no selects of zeros),
// and 4 blocks of 8 warps per SM (64 registers) instead of 3.
// Key: __nv_bfloat16 (v21, v22: the bf16 copy the ranking scored, 16 bytes per lane and step),
// float (v26: the fp32 k', 32 bytes per lane and step, loaded 4 steps at a time, 3 blocks per SM:
// at v22's 64 registers it spilled 12-16 bytes) or __half (v27: an fp16 copy, v22's bytes with
// 2^-11 instead of 2^-8 relative rounding; a slot whose sum a value beyond fp16's range made
// non-finite is summed again from key32, the fp32 k'); the sums are the same instructions on the
// same tree.
template <int G, bool kPlain = false, class Key = __nv_bfloat16>
__global__ void __launch_bounds__(256, kPlain && !std::is_same_v<Key, float> ? 4 : 3)
    selected_scores_lean_kernel(LaunchParams p, const Key* key, const float* key32, const float* bias,
                                const int32_t* selection, float* selected_score) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * 8 + threadIdx.x / kWarp, g = blockIdx.y;
  if (t >= p.T) return;  // the whole warp
  const int lane = threadIdx.x % kWarp, K = static_cast<int>(p.K);
  const int part = lane % 8, group = lane / 8;
  const int32_t own = lane < K ? selection[(g * p.T + t) * K + lane] : -1;
  const int n = __popc(__ballot_sync(0xffffffffu, own >= 0));  // the valid entries come first
  // Step j: slot 4 j + group, dims 8 part .. 8 part + 7 of its key row (offset inside the head).
  uint32_t key_offset[8];
  unsigned valid = 0u;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int e = 4 * j + group;
    const int32_t c = __shfl_sync(0xffffffffu, own, e);
    key_offset[j] = static_cast<uint32_t>(e < n ? c : 0) * kTileDim + 8 * part;
    valid |= static_cast<unsigned>(e < n) << j;
  }
  // After the reduce-scatter this lane holds step s: bits (part & 1, part & 2, part & 4) of
  // part choose the halves kept in rounds xor 1, 2, 4, i.e. bits 2, 1, 0 of s.
  const bool b0 = part & 1, b1 = part & 2, b2 = part & 4;
  const int e_out = 4 * ((b0 ? 4 : 0) + (b1 ? 2 : 0) + (b2 ? 1 : 0)) + group;
  const int32_t c_out = __shfl_sync(0xffffffffu, own, e_out);
  const bool out_valid = e_out < n;
  const uint32_t nc = static_cast<uint32_t>(p.T / p.S);
  const auto* qr = static_cast<const __nv_bfloat16*>(p.q_retrieval);
#pragma unroll 1
  for (int hg = 0; hg < G; ++hg) {
    const int64_t h = g * G + hg;
    const Key* key_h = key + static_cast<uint32_t>(h) * nc * kTileDim;
    const uint4 q_raw = *reinterpret_cast<const uint4*>(qr + (h * p.T + t) * kTileDim + 8 * part);
    const float b_out = kPlain ? bias[h * nc + (out_valid ? c_out : 0)] : out_valid ? bias[h * nc + c_out] : 0.0f;
    float qf[8], v[8];
    if constexpr (std::is_same_v<Key, float>) {
      to_float8(q_raw, qf);
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        float4 k0[4], k1[4];
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) {
          const int j = 4 * half + jj;
          const bool load = kPlain || (valid >> j) & 1u;
          k0[jj] = load ? *reinterpret_cast<const float4*>(key_h + key_offset[j]) : make_float4(0.f, 0.f, 0.f, 0.f);
          k1[jj] = load ? *reinterpret_cast<const float4*>(key_h + key_offset[j] + 4) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) v[4 * half + jj] = dot8(qf, k0[jj], k1[jj]);
      }
    } else {
      uint4 raw[8];
#pragma unroll
      for (int j = 0; j < 8; ++j)
        raw[j] = kPlain || (valid >> j) & 1u ? *reinterpret_cast<const uint4*>(key_h + key_offset[j])
                                             : make_uint4(0u, 0u, 0u, 0u);
      to_float8(q_raw, qf);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        float kf[8];
        to_float8<Key>(raw[j], kf);
        v[j] = dot8(qf, make_float4(kf[0], kf[1], kf[2], kf[3]), make_float4(kf[4], kf[5], kf[6], kf[7]));
      }
    }
    float w[4], x[2];
#pragma unroll
    for (int i = 0; i < 4; ++i)
      w[i] = __fadd_rn(b0 ? v[4 + i] : v[i], __shfl_xor_sync(0xffffffffu, b0 ? v[i] : v[4 + i], 1));
#pragma unroll
    for (int i = 0; i < 2; ++i)
      x[i] = __fadd_rn(b1 ? w[2 + i] : w[i], __shfl_xor_sync(0xffffffffu, b1 ? w[i] : w[2 + i], 2));
    float sum = __fadd_rn(b2 ? x[1] : x[0], __shfl_xor_sync(0xffffffffu, b2 ? x[0] : x[1], 4));
    // v27: a value beyond fp16's 65504 is inf in the copy, and an inf among a slot's products
    // makes its sum inf or NaN (inf x 0 is NaN): that slot is summed again from the fp32 k' by
    // its lane alone, after the reduce-scatter, when the copy's registers are free (session 24's
    // out-of-line re-sum of a lane's 8 parts kept v[] and q~ on the stack for every head).
    if constexpr (std::is_same_v<Key, __half>)
      if (out_valid && !isfinite(sum))
        sum = dot64_from_fp32(qr + (h * p.T + t) * kTileDim,
                              key32 + (static_cast<uint32_t>(h) * nc + c_out) * kTileDim);
    if (e_out < K) selected_score[(h * p.T + t) * K + e_out] = out_valid ? __fmaf_rn(p.scale, sum, b_out) : kNegInf;
  }
}

// v11: write_selection for K <= 32 with its loads one unit ahead. Unit u = (head u / nb, batch
// u % nb), nb = ceil(n / 16) batches of 4 steps (16 slots) per head; the q~ part, the biases and
// the key rows of unit u + 1 are in flight while unit u is summed (write_selection waits for
// them at every batch and every head: at 128K the writer was ~45% of v10's stall samples, most
// of them on those loads). The sums are write_selection's, step for step.
template <int G>
__device__ void write_selection_ahead(const LaunchParams& p, const int32_t* index, int64_t t, int64_t g,
                                      const float* key, const float* bias, int32_t* selection,
                                      float* selected_score) {
  const int lane = threadIdx.x % kWarp;
  const int K = static_cast<int>(p.K);
  int rank_of[2];
  const int n = write_selected_chunks(p, index, t, g, selection, rank_of);
  const int64_t n_chunks = p.T / p.S;
  const auto* qr = static_cast<const __nv_bfloat16*>(p.q_retrieval);
  const int part = lane % 8, group = lane / 8;
  const bool two = n > 16;  // nb = 2 (K <= 32), else 1 (n = 0 too: its heads get -inf)
  const int units = two ? 2 * G : G;
  struct Unit {
    float4 k0[4], k1[4];
    uint4 q;
    float own_bias[2];
  };
  auto load = [&](Unit& w, int u) {
    const int hg = two ? u >> 1 : u, b = two ? u & 1 : 0;
    const int64_t h = g * G + hg;
    w.q = *reinterpret_cast<const uint4*>(qr + (h * p.T + t) * kTileDim + 8 * part);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int e = lane + kWarp * i;
      w.own_bias[i] = e < n ? bias[h * n_chunks + index[e]] : 0.0f;
    }
#pragma unroll
    for (int jj = 0; jj < 4; ++jj) {
      const int e = 4 * (4 * b + jj) + group;
      if (e < n) {
        const float* row = key + (h * n_chunks + index[e]) * kTileDim + 8 * part;
        w.k0[jj] = *reinterpret_cast<const float4*>(row);
        w.k1[jj] = *reinterpret_cast<const float4*>(row + 4);
      } else {
        w.k0[jj] = w.k1[jj] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
    }
  };
  float score[2] = {kNegInf, kNegInf};
  auto sum = [&](const Unit& w, int u) {
    const int hg = two ? u >> 1 : u, b = two ? u & 1 : 0;
    float qf[8];
    to_float8(w.q, qf);
#pragma unroll
    for (int jj = 0; jj < 4; ++jj) selected_score_step(qf, w.k0[jj], w.k1[jj], 4 * b + jj, n, p.scale, w.own_bias, score);
    if (b == (two ? 1 : 0)) {  // the head's last batch
      const int64_t h = g * G + hg;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int e = lane + kWarp * i;
        if (e < K) selected_score[(h * p.T + t) * K + rank_of[i]] = score[i];
      }
      score[0] = score[1] = kNegInf;
    }
  };
  Unit wa, wb;
  load(wa, 0);
  for (int u = 0; u < units; u += 2) {
    if (u + 1 < units) load(wb, u + 1);
    sum(wa, u);
    if (u + 1 < units) {
      if (u + 2 < units) load(wa, u + 2);
      sum(wb, u + 1);
    }
  }
}

}  // namespace
}  // namespace hils::gpu::detail
