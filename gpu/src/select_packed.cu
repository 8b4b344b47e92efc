// Scoring and top-K on tensor cores (Eq. 2, 8): a block owns 64 adjacent queries of one
// KV group; each warp 16 of them. Pass 1 accumulates log Z_hat(t,h) per head over tiles of 64
// candidate chunks (s_hat = q~ . k' with k' rounded to bf16, fp32 accumulate); pass 2 forms the
// group score per tile and offers it to a per-query top-K list in shared memory. The reported
// selected_score is recomputed in fp32 from the fp32 summaries (v21, v22, v25: from their bf16
// copy, the values the ranking scored).
// Fast path only: bf16 q~, d = 64, G in {1, 2, 4, 8, 16}, K <= 64, summary key rules.
#include "launch_params.hpp"
#include "scratch_pool.hpp"
#include "mma_common.cuh"
#include "wgmma_common.cuh"

#include <stdexcept>
#include <string>
#include <type_traits>

namespace hils::gpu::detail {
namespace {

constexpr int kQueries = 64;     // queries per block, 16 per warp
constexpr int kRPitch = 65;      // fp32 per row of the group-score tile
constexpr int kPanelBytes = kTileDim * wg::kPanelRowBytes;  // v9: one swizzled k' tile
// v25: a stage of the bias k16 step's k side (64 rows of 16 bytes) and its shared-memory area.
constexpr int kFoldStageBytes = kTileDim * 16;
constexpr int kFoldPanelFloats = (2 * kFoldStageBytes + 128) / 4;
// v25's margin on pass 1's bound. v25 ranks r' = fl(scale2 max_h acc_h) (acc the fifth k-step's
// sum) where v16 ranks v = max_h fl(fl(fma(s, scale2, b2)) - z), and pass 1's bound B (a lower
// bound of the K-th largest v over the chunks) is v16's. Per (row, head, chunk), |r' - v| gathers
// v16's two roundings (2^-24 (|s2| + |v|)), the pieces of x and y after their divisions (2^-23
// (|z| + |b2|)), the tensor core's sum of s and six exact products (aligned to its largest term
// and truncated: a few units of 2^-23 of |s| + |z| / scale2 + |b2| / scale2) and the final product
// (2^-24 |r'|). For a chunk with v >= B (v <= 0 up to lg2.approx's error, so |v| <= |B| + 1),
// |s2| <= |v| + |z| and |s scale2| <= |s2| + |b2|: |r' - v| < 2^-18 (|B| + 1 + 2 |z| + 3 |b2|).
// The margin takes 2^-12 times that sum with |z| the row's largest over its heads and |b2| the
// largest over all chunks (64 times the count, for the tensor core's accumulation, which NVIDIA
// does not document). The K chunks with v >= B have r' >= B - eps, so every chunk of the top K
// by r' has r' >= B - eps and is appended; a larger margin only appends more candidates.
constexpr float kFoldMargin = 0x1p-12f;
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

// The threshold a candidate must beat, from a sorted list's K-th value (fmaxf: a NaN reads as
// -inf). The maximum was with v6's bound, removed in session 17 (gpu/NOTES.md "Kernels removed in
// session 17"); with -inf it stays, so that v4's and v5's code is what it was.
__device__ __forceinline__ float threshold_of(float kth) { return fmaxf(kth, kNegInf); }

// Each query's top-K list is kept sorted in shared memory: descending value, and of equal
// values ascending chunk (candidates arrive in ascending chunk order, so an equal score never
// displaces). Empty slots hold (-inf, -1); entry K - 1 is the threshold a candidate must beat.
// While one query's tile row is offered, its list lives in registers (entries lane, lane + 32)
// and each insertion is a ballot (its position) plus a one-lane shift.
// r_row: the query's 64 tile values (sh.r row); value/index: its list of K entries.
__device__ void offer_tile(const float* r_row, float* value, int32_t* index, int c0, int n_cand, int K) {
  const int lane = threadIdx.x % kWarp;
  const bool two = K > kWarp;
  float v0 = lane < K ? value[lane] : kNegInf, v1 = two && lane + kWarp < K ? value[lane + kWarp] : kNegInf;
  int32_t i0 = lane < K ? index[lane] : -1, i1 = two && lane + kWarp < K ? index[lane + kWarp] : -1;
  const int last_lane = (K - 1) % kWarp;
  float theta = threshold_of(__shfl_sync(0xffffffffu, K > kWarp ? v1 : v0, last_lane));
  bool changed = false;
  for (int half = 0; half < 2; ++half) {
    const int c = c0 + half * kWarp + lane;
    const float r = c < n_cand ? r_row[half * kWarp + lane] : kNegInf;
    unsigned pending = __ballot_sync(0xffffffffu, r > theta);
    while (pending != 0u) {
      const int src = __ffs(pending) - 1;
      pending &= pending - 1;
      const float rv = __shfl_sync(0xffffffffu, r, src);
      if (!(rv > theta)) continue;
      const int32_t ci = c0 + half * kWarp + src;
      // Position: entries that stay ahead (greater, or equal with a lower chunk: all of them).
      const int pos = __popc(__ballot_sync(0xffffffffu, v0 >= rv)) +
                      (two ? __popc(__ballot_sync(0xffffffffu, v1 >= rv)) : 0);
      // Shift entries e >= pos to e + 1 (the last drops out), put the candidate at pos.
      const int e0 = lane, e1 = lane + kWarp;
      if (two) {
        const float up_v1 = __shfl_up_sync(0xffffffffu, v1, 1);
        const int32_t up_i1 = __shfl_up_sync(0xffffffffu, i1, 1);
        const float top_v0 = __shfl_sync(0xffffffffu, v0, kWarp - 1);
        const int32_t top_i0 = __shfl_sync(0xffffffffu, i0, kWarp - 1);
        if (e1 == pos) v1 = rv, i1 = ci;
        else if (e1 > pos) v1 = lane == 0 ? top_v0 : up_v1, i1 = lane == 0 ? top_i0 : up_i1;
        if (e1 >= K) v1 = kNegInf, i1 = -1;
      }
      const float up_v0 = __shfl_up_sync(0xffffffffu, v0, 1);
      const int32_t up_i0 = __shfl_up_sync(0xffffffffu, i0, 1);
      if (e0 == pos) v0 = rv, i0 = ci;
      else if (e0 > pos) v0 = up_v0, i0 = up_i0;
      if (e0 >= K) v0 = kNegInf, i0 = -1;
      theta = threshold_of(__shfl_sync(0xffffffffu, K > kWarp ? v1 : v0, last_lane));
      changed = true;
    }
  }
  if (changed) {
    if (lane < K) value[lane] = v0, index[lane] = i0;
    if (two && lane + kWarp < K) value[lane + kWarp] = v1, index[lane + kWarp] = i1;
  }
  __syncwarp();
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

// Entry (va, ia) ranks ahead of (vb, ib): a larger value, or an equal one with a lower chunk;
// an empty entry (ib < 0) ranks behind every chunk.
__device__ __forceinline__ bool ranks_ahead(float va, int32_t ia, float vb, int32_t ib) {
  return ia >= 0 && (ib < 0 || va > vb || (va == vb && ia < ib));
}

// One-pass selection, end of head h: the head's K best (value s2, sorted, in shared memory)
// join the query's running union list with value s2 - log2 Z_hat_h. A chunk listed by several
// heads keeps its largest value; the union keeps its K best. The head entries arrive in
// descending s2, so the walk stops at the first one below the union's K-th value. The union
// sits in registers meanwhile (entries lane, lane + 32), as in offer_tile.
__device__ void merge_head_list(float* u_value, int32_t* u_index, const float* h_value,
                                const int32_t* h_index, float z, int K) {
  const int lane = threadIdx.x % kWarp;
  const bool two = K > kWarp;
  const int e0 = lane, e1 = lane + kWarp;
  float v0 = e0 < K ? u_value[e0] : kNegInf, v1 = two && e1 < K ? u_value[e1] : kNegInf;
  int32_t i0 = e0 < K ? u_index[e0] : -1, i1 = two && e1 < K ? u_index[e1] : -1;
  const int last_lane = (K - 1) % kWarp;
  bool changed = false;
  for (int e = 0; e < K; ++e) {
    const int32_t c = h_index[e];
    if (c < 0) break;
    const float rv = h_value[e] - z;
    const float last_v = __shfl_sync(0xffffffffu, two ? v1 : v0, last_lane);
    const int32_t last_i = __shfl_sync(0xffffffffu, two ? i1 : i0, last_lane);
    if (last_i >= 0 && rv < last_v) break;  // later entries are no larger
    // Listed already: keep the larger value (remove the old entry, insert anew below).
    const unsigned at0 = __ballot_sync(0xffffffffu, i0 == c), at1 = two ? __ballot_sync(0xffffffffu, i1 == c) : 0u;
    if (at0 | at1) {
      const int old_pos = at0 ? __ffs(at0) - 1 : kWarp + __ffs(at1) - 1;
      const float old_v = __shfl_sync(0xffffffffu, at0 ? v0 : v1, (old_pos % kWarp));
      if (!(rv > old_v)) continue;
      // Entries after old_pos move one place forward; the last becomes empty.
      const float dn_v0 = __shfl_down_sync(0xffffffffu, v0, 1), dn_v1 = __shfl_down_sync(0xffffffffu, v1, 1);
      const int32_t dn_i0 = __shfl_down_sync(0xffffffffu, i0, 1), dn_i1 = __shfl_down_sync(0xffffffffu, i1, 1);
      const float first_v1 = __shfl_sync(0xffffffffu, v1, 0);
      const int32_t first_i1 = __shfl_sync(0xffffffffu, i1, 0);
      if (e0 >= old_pos) {
        v0 = lane == kWarp - 1 ? (two ? first_v1 : kNegInf) : dn_v0;
        i0 = lane == kWarp - 1 ? (two ? first_i1 : -1) : dn_i0;
      }
      if (two && e1 >= old_pos) {
        v1 = lane == kWarp - 1 ? kNegInf : dn_v1;
        i1 = lane == kWarp - 1 ? -1 : dn_i1;
      }
      if (e0 >= K) v0 = kNegInf, i0 = -1;
      if (e1 >= K) v1 = kNegInf, i1 = -1;
    } else if (!ranks_ahead(rv, c, __shfl_sync(0xffffffffu, two ? v1 : v0, last_lane),
                            __shfl_sync(0xffffffffu, two ? i1 : i0, last_lane))) {
      continue;
    }
    const int pos = __popc(__ballot_sync(0xffffffffu, ranks_ahead(v0, i0, rv, c))) +
                    (two ? __popc(__ballot_sync(0xffffffffu, ranks_ahead(v1, i1, rv, c))) : 0);
    if (two) {
      const float up_v1 = __shfl_up_sync(0xffffffffu, v1, 1);
      const int32_t up_i1 = __shfl_up_sync(0xffffffffu, i1, 1);
      const float top_v0 = __shfl_sync(0xffffffffu, v0, kWarp - 1);
      const int32_t top_i0 = __shfl_sync(0xffffffffu, i0, kWarp - 1);
      if (e1 == pos) v1 = rv, i1 = c;
      else if (e1 > pos) v1 = lane == 0 ? top_v0 : up_v1, i1 = lane == 0 ? top_i0 : up_i1;
      if (e1 >= K) v1 = kNegInf, i1 = -1;
    }
    const float up_v0 = __shfl_up_sync(0xffffffffu, v0, 1);
    const int32_t up_i0 = __shfl_up_sync(0xffffffffu, i0, 1);
    if (e0 == pos) v0 = rv, i0 = c;
    else if (e0 > pos) v0 = up_v0, i0 = up_i0;
    if (e0 >= K) v0 = kNegInf, i0 = -1;
    changed = true;
  }
  if (changed) {
    if (e0 < K) u_value[e0] = v0, u_index[e0] = i0;
    if (two && e1 < K) u_value[e1] = v1, u_index[e1] = i1;
  }
  __syncwarp();
}

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

__device__ __forceinline__ void bf16x8_to_float(uint4 raw, float (&qf)[8]) {
  const __nv_bfloat162* q2 = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float2 f = __bfloat1622float2(q2[j]);
    qf[2 * j] = f.x, qf[2 * j + 1] = f.y;
  }
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
    bf16x8_to_float(*reinterpret_cast<const uint4*>(qr + (h * p.T + t) * kTileDim + 8 * part), qf);
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
template <int G, bool kPlain = false>
__global__ void __launch_bounds__(256, kPlain ? 4 : 3)
    selected_scores_lean_kernel(LaunchParams p, const __nv_bfloat16* key, const float* bias,
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
    const __nv_bfloat16* key_h = key + static_cast<uint32_t>(h) * nc * kTileDim;
    const uint4 q_raw = *reinterpret_cast<const uint4*>(qr + (h * p.T + t) * kTileDim + 8 * part);
    const float b_out = kPlain ? bias[h * nc + (out_valid ? c_out : 0)] : out_valid ? bias[h * nc + c_out] : 0.0f;
    uint4 raw[8];
#pragma unroll
    for (int j = 0; j < 8; ++j)
      raw[j] = kPlain || (valid >> j) & 1u ? *reinterpret_cast<const uint4*>(key_h + key_offset[j])
                                           : make_uint4(0u, 0u, 0u, 0u);
    float qf[8];
    bf16x8_to_float(q_raw, qf);
    float v[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      float kf[8];
      bf16x8_to_float(raw[j], kf);
      v[j] = dot8(qf, make_float4(kf[0], kf[1], kf[2], kf[3]), make_float4(kf[4], kf[5], kf[6], kf[7]));
    }
    float w[4], x[2];
#pragma unroll
    for (int i = 0; i < 4; ++i)
      w[i] = __fadd_rn(b0 ? v[4 + i] : v[i], __shfl_xor_sync(0xffffffffu, b0 ? v[i] : v[4 + i], 1));
#pragma unroll
    for (int i = 0; i < 2; ++i)
      x[i] = __fadd_rn(b1 ? w[2 + i] : w[i], __shfl_xor_sync(0xffffffffu, b1 ? w[i] : w[2 + i], 2));
    const float sum = __fadd_rn(b2 ? x[1] : x[0], __shfl_xor_sync(0xffffffffu, b2 ? x[0] : x[1], 4));
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
    bf16x8_to_float(w.q, qf);
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

// Warp-wide bitonic sort, largest first, of 64 entries held 2 per lane (entry e = lane + 32 i in
// x[i]; one per lane was v6.1's, removed in session 17): entry e ends as the e-th largest.
// Floats (no NaN) or the rank keys of rank_key.
__device__ __forceinline__ float larger(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ float smaller(float a, float b) { return fminf(a, b); }
__device__ __forceinline__ uint64_t larger(uint64_t a, uint64_t b) { return a > b ? a : b; }
__device__ __forceinline__ uint64_t smaller(uint64_t a, uint64_t b) { return a > b ? b : a; }
template <typename T>
__device__ __forceinline__ void sort_largest_first(T (&x)[2]) {
  constexpr int kPer = 2;
  const int lane = threadIdx.x % kWarp;
#pragma unroll
  for (int k = 2; k <= kWarp * kPer; k *= 2)
#pragma unroll
    for (int j = k / 2; j > 0; j /= 2) {
      if (j == kWarp) {  // entries lane and lane + 32 of the one largest-first block
        const T hi = larger(x[0], x[kPer - 1]), lo = smaller(x[0], x[kPer - 1]);
        x[0] = hi, x[kPer - 1] = lo;
        continue;
      }
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        const int e = lane + kWarp * i;
        const T other = __shfl_xor_sync(0xffffffffu, x[i], j);
        // The lower entry of a pair keeps the larger one in a largest-first block (e & k == 0).
        x[i] = ((e & j) == 0) == ((e & k) == 0) ? larger(x[i], other) : smaller(x[i], other);
      }
    }
}

// Lower bound on a row's K-th group score (v6), from pass 1. The row's candidate chunks are
// split into kBoundSlots = 64 disjoint slots (v8; v6.1's 32 were removed in session 17): with
// P = kBoundSlots / 32 parts per lane, chunk c of tile i, in part k (its n-tile nt in [8 k / P,
// 8 (k + 1) / P)) of the column quarter j = (c / 2) % 4 that lane j of the row's quad holds,
// belongs to slot (4 P i + P j + k) % kBoundSlots.
// While head h is scored, each lane keeps in shared memory the running maximum of s2 over its
// slots (free lane maxima of pass 1's log-sum-exp); at the end of head h it folds
// max(V[slot], term(slot max - log2 Z_hat_h)) into the row's V (term: identity for
// max_normalized, 2^x for sum_probabilities, the same arithmetic as pass 2). V[slot] is a term of
// the group score of one chunk of its slot, so it is at most that chunk's group score; the slots
// name distinct chunks, so the K-th largest V is at most the K-th largest group score, and pass
// 2 drops candidates below it: none of them can be selected. Needs K <= 32; a row with fewer than
// K nonempty slots gets -inf (no bound).
// v_row: the row's kBoundSlots V values (in any order); returns the K-th largest (1 <= K <= 32).
constexpr int kBoundSlots = 64;
__device__ float kth_largest(const float* v_row, int K) {
  constexpr int kPer = kBoundSlots / kWarp;
  const int lane = threadIdx.x % kWarp;
  float v[kPer];
#pragma unroll
  for (int k = 0; k < kPer; ++k) v[k] = v_row[lane + kWarp * k];
  sort_largest_first(v);
  return __shfl_sync(0xffffffffu, v[0], K - 1);  // element K - 1: lane K - 1, register 0
}

// v8's rows in shared memory: kBufPitch words per row. Pass 1: the bound's 64 slots, V in words
// [0, 64) and the running slot maxima in [64, 128), slot s of row r at s ^ 8 (r % 4) (a swizzle:
// a half warp's float2 slot accesses, 4 rows x 4 quad lanes, hit 16 distinct bank pairs).
// Pass 2: the row's candidate buffer, values in [0, 64), chunks in [64, 128).
constexpr int kBufPitch = 128;
constexpr int kBufCap = 64;
__device__ __forceinline__ int swizzled_slot(int row, int slot) { return slot ^ (8 * (row % 4)); }

// Inclusive-exclusive sum over a quad: before = x of the quad lanes below this one, total = all 4.
__device__ __forceinline__ void quad_scan(int x, int& before, int& total) {
  const int quad_lane = threadIdx.x % 4;
  int incl = x;
  int y = __shfl_up_sync(0xffffffffu, incl, 1, 4);
  if (quad_lane >= 1) incl += y;
  y = __shfl_up_sync(0xffffffffu, incl, 2, 4);
  if (quad_lane >= 2) incl += y;
  total = __shfl_sync(0xffffffffu, incl, 3, 4);
  before = incl - x;
}

// A 64-bit key that orders entries as ranks_ahead does, larger first: the value's bits made
// monotonic (-0 taken as +0, equal values compare equal), then the complement of the chunk (a
// lower chunk ranks ahead); an empty entry (chunk < 0) is 0, behind every chunk.
__device__ __forceinline__ uint64_t rank_key(float v, int32_t c) {
  uint32_t u = __float_as_uint(v == 0.0f ? 0.0f : v);
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return c < 0 ? 0ull : (static_cast<uint64_t>(u) << 32) | (0xFFFFFFFFu - static_cast<uint32_t>(c));
}
__device__ __forceinline__ float key_value(uint64_t key) {
  const uint32_t u = static_cast<uint32_t>(key >> 32);
  return __uint_as_float((u & 0x80000000u) ? (u & 0x7FFFFFFFu) : ~u);
}
__device__ __forceinline__ int32_t key_chunk(uint64_t key) {
  return static_cast<int32_t>(0xFFFFFFFFu - static_cast<uint32_t>(key));
}

// The rank keys of a row's n buffered candidates (n <= kBufCap = 64), sorted best first across
// the warp: lane holds the lane-th best in key[0] and the (lane + 32)-th in key[1]; 0 past n.
__device__ __forceinline__ void sorted_rank_keys(const float* value, const int32_t* index, int n,
                                                 uint64_t (&key)[2]) {
  const int lane = threadIdx.x % kWarp;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int e = lane + kWarp * i;
    key[i] = e < n ? rank_key(value[e], index[e]) : 0ull;
  }
  sort_largest_first(key);
}

// Keeps the K best (ranks_ahead order) of a row's n buffered candidates (K < n <= kBufCap, K <=
// 32) at positions [0, K), best first, and returns the K-th value. Warp-wide (n, K uniform).
__device__ float keep_best(float* value, int32_t* index, int n, int K) {
  const int lane = threadIdx.x % kWarp;
  uint64_t key[2];
  sorted_rank_keys(value, index, n, key);
  __syncwarp();  // every entry is read before any is written
  if (lane < K) value[lane] = key_value(key[0]), index[lane] = key_chunk(key[0]);
  __syncwarp();
  return key_value(__shfl_sync(0xffffffffu, key[0], K - 1));
}

// v8 offers of one half (columns [32 half, 32 half + 32)) of a tile's group scores r, for the
// warp's rows row[0], row[1]: each lane appends its values above the row's theta to the row's
// buffer (values and chunks at count + the quad lanes before it), no ranking. theta is the float
// below the row's bound (v6), or the K-th value of the row's last compaction: when a row's buffer
// would overflow, keep_best cuts it to its K best first (the buffered chunks are all lower than
// this half's, so a later candidate equal to the K-th value ranks behind it and strict > is the
// tie rule). count: the row's buffered entries. Warp-wide.
template <int kHalf>
__device__ __forceinline__ void append_half(const float (&r)[8][4], float (&theta)[2], int (&count)[2],
                                            float* buf, const int (&row)[2], int c0, int K) {
  const int lane = threadIdx.x % kWarp;
  unsigned bits[2];
  int before[2], total[2];
  auto flag = [&]() {
    bits[0] = bits[1] = 0u;
#pragma unroll
    for (int n = 0; n < 4; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        bits[e / 2] |= static_cast<unsigned>(r[4 * kHalf + n][e] > theta[e / 2]) << (2 * n + e % 2);
#pragma unroll
    for (int i = 0; i < 2; ++i) quad_scan(__popc(bits[i]), before[i], total[i]);
  };
  flag();
  if (__ballot_sync(0xffffffffu, (bits[0] | bits[1]) != 0u) == 0u) return;
  const bool over[2] = {count[0] + total[0] > kBufCap, count[1] + total[1] > kBufCap};
  const unsigned rows = flagged_rows(over);
  if (rows != 0u) {
    __syncwarp();  // the buffers' earlier appends are visible to the warp
    const int warp = threadIdx.x / kWarp;
    for (unsigned pending = rows; pending != 0u; pending &= pending - 1) {
      const int j = __ffs(pending) - 1, q = warp * 16 + j;
      const int n = __shfl_sync(0xffffffffu, j < 8 ? count[0] : count[1], 4 * (j % 8));
      float* value = buf + q * kBufPitch;
      const float kth = keep_best(value, reinterpret_cast<int32_t*>(value + kBufCap), n, K);
#pragma unroll
      for (int i = 0; i < 2; ++i)
        if (row[i] == q) count[i] = K, theta[i] = kth;
    }
    flag();
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float* value = buf + row[i] * kBufPitch;
    int32_t* index = reinterpret_cast<int32_t*>(value + kBufCap);
    int pos = count[i] + before[i];
#pragma unroll
    for (int n = 0; n < 4; ++n)
#pragma unroll
      for (int e2 = 0; e2 < 2; ++e2)
        if ((bits[i] >> (2 * n + e2)) & 1u) {
          const int nt = 4 * kHalf + n;
          value[pos] = r[nt][2 * i + e2];
          index[pos] = c0 + nt * 8 + (lane % 4) * 2 + e2;
          ++pos;
        }
    count[i] += total[i];
  }
}

// v25's fifth k16 step of pass 2 (max_normalized). Its 16 k columns: q side (A, registers)
// [x_hi, x_mid, x_lo, 1, 1, 1, 0 ...] with x = -log2 Z_hat / scale2 of the (row, head); k side
// (B, one 16-byte row per chunk, FoldRow) [1, 1, 1, y_hi, y_mid, y_lo, 0, 0] with y = b2 / scale2
// of the (head, chunk), columns 8-15 unused (A's are zero). The pieces are x (y) rounded to bf16
// three times in turn (each remainder exact in fp32): x_hi + x_mid + x_lo = x within 2^-24 |x|.
// So the product adds x + y to s: acc = s + (b2 - z) / scale2, and scale2 acc is v16's
// s2 - z = fma(s, scale2, b2) - z up to the roundings (bounded in kFoldMargin's comment).
struct Bf16Pieces {
  uint32_t hi, mid, lo;  // bf16 bits
};
__device__ __forceinline__ Bf16Pieces bf16_pieces(float x) {
  const __nv_bfloat16 hi = __float2bfloat16_rn(x);
  const float r1 = x - __bfloat162float(hi);
  const __nv_bfloat16 mid = __float2bfloat16_rn(r1);
  const __nv_bfloat16 lo = __float2bfloat16_rn(r1 - __bfloat162float(mid));
  return {__bfloat16_as_ushort(hi), __bfloat16_as_ushort(mid), __bfloat16_as_ushort(lo)};
}
constexpr uint32_t kBf16One = 0x3F80u;
// The k side's row of a chunk with y = b2 / scale2: columns 0-7 (16 bytes).
__device__ __forceinline__ uint4 fold_row(float y) {
  const Bf16Pieces b = bf16_pieces(y);
  return make_uint4(kBf16One | kBf16One << 16, kBf16One | b.hi << 16, b.mid | b.lo << 16, 0u);
}
// v25's rows after bias2 in the selection's scratch: bias2's n_bias floats rounded up to 16 bytes,
// then n_bias FoldRows ([Hq][n_chunks]), then max |b2| over them (one float).
__host__ __device__ constexpr int64_t fold_rows_offset(int64_t n_bias) { return (n_bias + 3) / 4 * 4; }
__host__ __device__ constexpr int64_t fold_scratch_floats(int64_t n_bias) {
  return fold_rows_offset(n_bias) + 4 * n_bias + 4;
}

// fp32 summaries -> bf16 copy for the copy engine and the tensor cores; bias -> bias log2 e.
// v25 (fold_rows not null): each bias's FoldRow, and max |b2| into *fold_bias_max (zeroed before).
__global__ void to_bf16_kernel(const float* src, __nv_bfloat16* dst, int64_t n, const float* bias,
                               float* bias2, int64_t n_bias, uint4* fold_rows, float* fold_bias_max,
                               float scale2) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) dst[i] = __float2bfloat16_rn(src[i]);
  float b2 = 0.0f;
  if (i < n_bias) bias2[i] = b2 = bias[i] * kLog2e;
  if (fold_rows == nullptr || i - static_cast<int64_t>(threadIdx.x % kWarp) >= n_bias) return;
  if (i < n_bias) fold_rows[i] = fold_row(b2 / scale2);
  float m = fabsf(b2);
  for (int off = kWarp / 2; off > 0; off /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  // |b2| >= 0: its bits order as unsigned integers.
  if (threadIdx.x % kWarp == 0) atomicMax(reinterpret_cast<unsigned*>(fold_bias_max), __float_as_uint(m));
}

// The template options below are those of the kept kernels (attention.hpp SelectKernel); the
// versions between them were removed in session 17 (gpu/NOTES.md "Kernels removed in session 17",
// their code at commit ad5fb84), so a kept kernel is named by the version that introduced each of
// its options.
// How pass 2 hands a tile's group scores to the rows' top K: one row at a time into sorted
// lists (offer_tile, v4), or appended to per-row buffers without ranking (append_half, v8,
// K <= 32). The buffered kernels' pass 1 also forms the lower bound of each row's K-th group
// score over kBoundSlots slots (kth_largest) and pass 2 offers no candidate below it; the sorted
// lists (v4) form none (v6's did: removed in session 17).
enum class Offers { sorted, buffered };

// kScoring: mma.sync (qk_tile, v4, v8), or wgmma_q_smem (v10 on, sm_90a): the products by the
// warpgroup's wgmma from swizzled k' panels, 128 queries per block (two warpgroups sharing each
// k' panel), and pass 2's q~ (a new head every step) staged by cp.async into a swizzled panel per
// warpgroup instead of loaded as register fragments.
enum class Scoring { mma_sync, wgmma_q_smem };
// Which writer puts out the selected chunks and scores: write_selection (v4, v8), or
// write_selection_ahead (v11 on: its loads one unit ahead; K <= 32, buffered offers only), or only
// the selection, the scores by selected_scores_lean_kernel after it (v17 on).
enum class Writer { in_order, ahead, separate };
// Pass 2's steps as written first (v4, v8), or lean (v12 on: the copies' per-thread pieces and
// the wgmma descriptors worked out once, each tile's first head without the per-step reset
// selects; wgmma_q_smem scoring and buffered offers only), or v12's with 32-bit copy state (v16
// on: the q~ and k' copy sources worked out per step from the head index, the kernel's parameters
// and 32-bit offsets, shared addresses and descriptor low words in 32 bits, so that pass 2 keeps
// no 64-bit copy state in registers; v15 spills v12's 64-bit q~ copy pieces and reloads them
// every step), or v16's with the bias and log2 Z_hat folded into the products (v25,
// max_normalized: a fifth k16 step adds (b2 - z) / scale2 to s as three bf16 pieces each, so a
// step's epilogue is one FMNMX per element, r = scale2 max_h acc_h after the tile's G heads;
// FoldColumns).
enum class Lean { none, pass2, pass2_q32, pass2_fold };
template <Scoring kScoring>
constexpr int kBlockQueries = kScoring == Scoring::wgmma_q_smem ? 128 : 64;

template <int G, Offers kOffers, Scoring kScoring = Scoring::mma_sync, Writer kWriter = Writer::in_order,
          Lean kLeanSteps = Lean::none>
__global__ void __launch_bounds__(2 * kBlockQueries<kScoring>, kBlockQueries<kScoring> == 64 ? 4 : 2)
    select_packed_kernel(LaunchParams p, const float* key, const __nv_bfloat16* key_bf16,
                         const float* bias, const float* bias2, const float* lse_swa,
                         int32_t* selection, float* selected_score, int first_round) {
  constexpr bool kBuffered = kOffers == Offers::buffered;
  constexpr bool kWgmma = kScoring == Scoring::wgmma_q_smem;
  constexpr int kQueries = kBlockQueries<kScoring>, kThreads = 2 * kQueries;  // 16 rows per warp
  static_assert(kWgmma == (kLeanSteps != Lean::none), "the wgmma kernels are the lean ones (v15 on)");
  static_assert(kWriter == Writer::in_order || kBuffered, "the writer ahead takes v8's buffers (K <= 32)");
  constexpr bool kLean = kLeanSteps != Lean::none;
  constexpr bool kFold = kLeanSteps == Lean::pass2_fold;
  constexpr bool kQ32 = kLeanSteps == Lean::pass2_q32 || kFold;
  // Pass 1 one k' tile per step (mma.sync: v4, v8) or two (wgmma: v14 on, in panels 0-3, which
  // pass 1 has free; v12's copy pieces).
  constexpr bool kPairs = kWgmma;
  static_assert(!kLean || kBuffered, "the lean pass 2 is v10's with buffered offers");
  constexpr int kSlots = kBoundSlots;     // the bound's (v8 on: buffered offers only)
  constexpr int kParts = kSlots / kWarp;  // slot maxima per lane and row
  // Two stages of (k' tile, bias tile): step s + 1 streams in while step s is computed.
  __shared__ __align__(16) __nv_bfloat16 tile[2][kWgmma ? 1 : kTileDim][kTilePitch];
  __shared__ __align__(16) float bias_tile[kPairs ? 4 : 2][kTileDim];
  extern __shared__ __align__(16) float dyn[];
  const int K = static_cast<int>(p.K);
  // wgmma: four swizzled k' panels (pass 1: two stages of two tiles; pass 2: two stages, then one
  // q~ panel per warpgroup), on a 1024-byte boundary (select_smem_bytes adds the slack).
  unsigned char* panels = nullptr;
  float* cursor = dyn;
  if (kWgmma) {
    const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(dyn));
    panels = reinterpret_cast<unsigned char*>(dyn) + (wg::kAtomBytes - base % wg::kAtomBytes) % wg::kAtomBytes;
    cursor = reinterpret_cast<float*>(panels + 4 * kPanelBytes);
  }
  auto take = [&](int64_t count) { float* out = cursor; cursor += count; return out; };
  // v25: the k side of pass 2's fifth k16 step, two stages of 64 FoldRows (16 bytes each, no
  // swizzle), then 128 bytes that stay zero (the unused second core matrix along K of the last
  // 8 rows reads there: A's columns 8-15 are zero, so it only has to be finite; all of it is
  // zeroed first), on the panels' 1024-byte boundary.
  unsigned char* fold_panel = kFold ? reinterpret_cast<unsigned char*>(take(kFoldPanelFloats)) : nullptr;
  SelectShared sh;
  // v8: the rows of kBufPitch words (bound slots in pass 1, candidate buffers in pass 2) replace
  // the group-score tile and the lists.
  float* buf = kBuffered ? take(kQueries * kBufPitch) : nullptr;
  sh.r = kBuffered ? nullptr : take(kQueries * kRPitch);
  sh.log_z = take(G * kQueries);
  // v25 (max_normalized): pass 1 leaves the q side's pieces of x = -log2 Z_hat / scale2 instead of
  // log2 Z_hat: (x_hi, x_mid) as one word in sh.log_z's place, x_lo's bf16 bits here.
  auto* fold_lo = kFold ? reinterpret_cast<uint16_t*>(take(G * kQueries / 2)) : nullptr;
  sh.value = kBuffered ? nullptr : take(kQueries * K);
  sh.index = kBuffered ? nullptr : reinterpret_cast<int32_t*>(take(kQueries * K));
  sh.n_cand = reinterpret_cast<int32_t*>(take(kQueries));
  float* row_bound = take(kQueries);  // kSlots: lower bound of each row's K-th group score
  // Word of the bound's slot `slot` of row r in buf: V at +0, the running slot maximum at +kSlots.
  auto slot_word = [&](int r, int slot) { return r * kBufPitch + swizzled_slot(r, slot); };
  const SlotGeometry geo{p.T, p.S, p.W, p.landmarks};
  const int64_t t0 = block_t0(kQueries, first_round), g = blockIdx.y;
  const int64_t n_chunks = geo.n_chunks();
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int row[2] = {warp * 16 + lane / 4, warp * 16 + lane / 4 + 8};
  const int64_t t[2] = {t0 + row[0], t0 + row[1]};
  // The bound needs pass 1's log2 Z_hat: not for max_raw. Its V rows live in the buffer rows (v8)
  // in pass 1 (the sorted lists with a bound were the removed v6's: gpu/NOTES.md "Kernels
  // removed in session 17").
  const bool bound = kBuffered && p.group_rule != GroupRule::max_raw && K <= kWarp;
  if (!kBuffered)
    for (int e = threadIdx.x; e < kQueries * K; e += kThreads) sh.value[e] = kNegInf, sh.index[e] = -1;
  if (bound)
    for (int e = threadIdx.x; e < kQueries * kBufPitch; e += kThreads) buf[e] = kNegInf;
  if (kFold) {
    for (int e = threadIdx.x; e < kFoldPanelFloats; e += kThreads) reinterpret_cast<float*>(fold_panel)[e] = 0.0f;
    wg::fence_proxy_async();
  }
  for (int q = threadIdx.x; q < kQueries; q += kThreads) {
    sh.n_cand[q] = t0 + q < p.T ? static_cast<int>(geo.candidate_count(t0 + q)) : 0;
  }
  __syncthreads();
  const int n_cand[2] = {sh.n_cand[row[0]], sh.n_cand[row[1]]};
  // Tiles below every row's count of the warp need no mask.
  int warp_min = n_cand[0] < n_cand[1] ? n_cand[0] : n_cand[1];
  for (int off = kWarp / 2; off > 0; off /= 2) warp_min = min(warp_min, __shfl_xor_sync(0xffffffffu, warp_min, off));
  const int64_t t_last = t0 + kQueries - 1 < p.T - 1 ? t0 + kQueries - 1 : p.T - 1;
  const int n_tiles = (sh.n_cand[t_last - t0] + kTileDim - 1) / kTileDim;
  const float scale2 = p.scale * kLog2e;
  // v25's fifth k-step for the default group rule (block-uniform); the row's largest |log2 Z_hat|
  // over its heads (its margin, kFoldMargin).
  const bool fold = kFold && p.group_rule == kGroupMaxNormalized;
  float fold_z_max[2] = {0.0f, 0.0f};
  // With fewer than K nonempty slots (kSlots / 8 per tile) the bound is -inf: not formed at all.
  const bool prune = bound && (kSlots / 8) * n_tiles >= K;
  // Stage `buf` <- k' and bias2 of head g G + hg, chunks [c0, c0 + 64) (mma.sync kernels).
  auto issue = [&](int hg, int c0, int buf) {
    const int64_t h = g * G + hg;
    issue_tile(tile[buf], bias_tile[buf], key_bf16 + h * n_chunks * kTileDim, bias2 + h * n_chunks,
               c0, static_cast<int>(n_chunks));
  };
  // The staged tile is complete and visible to the block (and, wgmma, to the tensor cores).
  auto await_tile = [&]() {
    cp_async_wait_all();
    if (kWgmma) wg::fence_proxy_async();
    __syncthreads();
  };
  // v12: the k' copy's per-thread pieces (rows tid / 8 + 32 j: the 128-byte swizzle of
  // row + 32 j is row's, 4096 bytes on; 32-bit element offsets inside the group) and the k'
  // panels' descriptor (panel 1: + kPanelBytes / 16), worked out once.
  const int nc = static_cast<int>(n_chunks), k_row = threadIdx.x / 8, k_col = (threadIdx.x % 8) * 8;
  const uint32_t k_dst = kLean ? wg::sw128_offset(k_row, k_col) : 0u;
  const __nv_bfloat16* key_g = key_bf16 + g * G * n_chunks * kTileDim;
  const float* bias_g = bias2 + g * G * n_chunks;
  // k' rows [c0, c0 + 64) and their biases of head g G + hg into stage `stage`, committed.
  auto copy_k = [&](int hg, int c0, int stage) {
    const __nv_bfloat16* head = key_g + hg * nc * kTileDim;
    unsigned char* dst = panels + stage * kPanelBytes + k_dst;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int rr = c0 + k_row + 32 * j;
      const bool valid = rr < nc;
      cp_async16(dst + 4096 * j, valid ? head + rr * kTileDim + k_col : head, valid);
    }
    if (threadIdx.x < kTileDim) {
      const int cc = c0 + static_cast<int>(threadIdx.x);
      const bool valid = cc < nc;
      cp_async4(&bias_tile[stage][threadIdx.x], bias_g + hg * nc + (valid ? cc : 0), valid);
    }
    cp_async_commit();
  };
  const uint64_t k_desc = kLean ? wg::desc_k_major(panels) : 0ull;
  uint32_t qa[4][4], qn[4][4];
  float s[8][4];
  // Pass 1, step = (head, tile): log2 Z_hat(t,h) = log2(2^lse_swa2 + sum over V(t) of 2^s2).
  // Folds a tile's lane maxima into this lane's running slot maxima (words kSlots + slot).
  auto update_slots = [&](int tile_i, const float (&lane_max)[2][kParts]) {
#pragma unroll
    for (int k = 0; k < kParts; ++k) {
      const int slot = (4 * kParts * tile_i + kParts * (lane % 4) + k) % kSlots;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        float& cur = buf[slot_word(row[i], slot) + kSlots];
        cur = fmaxf(cur, lane_max[i][k]);
      }
    }
  };
  // End of head hg: log2 Z_hat into sh.log_z; V[slot] = max over heads of the slot's best term
  // (pass 2's arithmetic; a NaN from a row without any mass is ignored by fmaxf), and the slot
  // maxima restart for the next head. Each (row, slot) belongs to one thread: slots kParts
  // (lane % 4) + k + 4 kParts j.
  auto end_head = [&](int hg, const float (&m)[2], const float (&l)[2]) {
    const int64_t h = g * G + hg;
    float z[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float swa = t[i] < p.T ? lse_swa[h * p.T + t[i]] * kLog2e : kNegInf;
      z[i] = log2_normalizer(m[i], l[i], swa);
      if (kFold && fold) {
        fold_z_max[i] = fmaxf(fold_z_max[i], fabsf(z[i]));
        if (lane % 4 == 0) {
          // A row past T (z = -inf) gets zeros; its columns are masked.
          const Bf16Pieces x = bf16_pieces(isfinite(z[i]) ? -z[i] / scale2 : 0.0f);
          reinterpret_cast<uint32_t*>(sh.log_z)[hg * kQueries + row[i]] = x.hi | x.mid << 16;
          fold_lo[hg * kQueries + row[i]] = static_cast<uint16_t>(x.lo);
        }
      } else if (lane % 4 == 0) {
        sh.log_z[hg * kQueries + row[i]] = z[i];
      }
    }
    if (prune)
#pragma unroll
      for (int j = 0; j < kWarp / 4; ++j)
#pragma unroll
        for (int k = 0; k < kParts; ++k)
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            const int word = slot_word(row[i], kParts * (lane % 4) + k + 4 * kParts * j);
            float& cur = buf[word + kSlots];
            const float x = cur - z[i];
            const float term = p.group_rule == kGroupSumProbabilities ? fast_exp2(x) : x;
            float& v = buf[word];
            v = fmaxf(v, term);
            cur = kNegInf;
          }
  };
  if (kPairs && p.group_rule != GroupRule::max_raw && n_tiles > 0) {
    // v14: two k' tiles per step (tiles 2 j and 2 j + 1 of a head; an odd count ends on a
    // phantom tile past every row's candidates, which leaves m, l and the slots as they are:
    // exactly what a row shorter than the block's longest sees in v12). One block barrier, one
    // copy commit and one wgmma wait per two tiles, and two independent tile maxima and ex2
    // sums per step for the schedulers; the mass of tile 2 j is accumulated before that of
    // 2 j + 1, as in v12 (the same bits).
    const int n_pairs = (n_tiles + 1) / 2;
    // k' tiles [c0, c0 + 128) of head hg into panels 2 stage, 2 stage + 1, one commit.
    auto copy_pair = [&](int hg, int c0, int stage) {
      const __nv_bfloat16* head = key_g + hg * nc * kTileDim;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        unsigned char* dst = panels + (2 * stage + half) * kPanelBytes + k_dst;
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int rr = c0 + kTileDim * half + k_row + 32 * j;
          const bool valid = rr < nc;
          cp_async16(dst + 4096 * j, valid ? head + rr * kTileDim + k_col : head, valid);
        }
      }
      if (threadIdx.x < 2 * kTileDim) {
        const int cc = c0 + static_cast<int>(threadIdx.x);
        const bool valid = cc < nc;
        cp_async4(&bias_tile[2 * stage][threadIdx.x], bias_g + hg * nc + (valid ? cc : 0), valid);
      }
      cp_async_commit();
    };
    float m[2], l[2];
    float sb[8][4];
    copy_pair(0, 0, 0);
    for (int hg = 0, pair = 0, stage = 0; hg < G; stage ^= 1) {
      const int c0 = pair * 2 * kTileDim;
      const bool last_pair = pair + 1 == n_pairs;
      if (pair == 0) {
        load_query_fragments(qa, p, g * G + hg, t);
        m[0] = m[1] = kNegInf, l[0] = l[1] = 0.0f;
      }
      await_tile();
      if (!last_pair) copy_pair(hg, c0 + 2 * kTileDim, stage ^ 1);
      else if (hg + 1 < G) copy_pair(hg + 1, 0, stage ^ 1);
      {
        const uint64_t kd = k_desc + static_cast<uint64_t>(2 * stage * (kPanelBytes >> 4));
        const uint64_t kd1 = kd + static_cast<uint64_t>(kPanelBytes >> 4);
        wg::fence_operands(s);
        wg::fence_operands(sb);
        wg::fence();
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) wg::mma_rs<false>(s, qa[ks], wg::desc_advance(kd, 32 * ks), ks > 0);
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) wg::mma_rs<false>(sb, qa[ks], wg::desc_advance(kd1, 32 * ks), ks > 0);
        wg::commit();
        wg::wait<0>();
        wg::fence_operands(s);
        wg::fence_operands(sb);
      }
      scale_and_mask(s, bias_tile[2 * stage], scale2, c0, n_cand, c0 + kTileDim <= warp_min);
      scale_and_mask(sb, bias_tile[2 * stage + 1], scale2, c0 + kTileDim, n_cand, c0 + 2 * kTileDim <= warp_min);
      if (prune) {
        float lane_max[2][kParts], lane_max_b[2][kParts];
        accumulate_mass<kParts>(s, m, l, lane_max);
        accumulate_mass<kParts>(sb, m, l, lane_max_b);
        update_slots(2 * pair, lane_max);
        update_slots(2 * pair + 1, lane_max_b);
      } else {
        accumulate_mass(s, m, l);
        accumulate_mass(sb, m, l);
      }
      if (last_pair) end_head(hg, m, l);
      if (last_pair) pair = 0, ++hg;
      else ++pair;
    }
  } else if (!kPairs && p.group_rule != GroupRule::max_raw && n_tiles > 0) {
    float m[2], l[2];
    issue(0, 0, 0);
    // (hg, tile_i): the step's head and tile, advanced by counters (no division per step).
    for (int hg = 0, tile_i = 0, buf = 0; hg < G; buf ^= 1) {
      const int c0 = tile_i * kTileDim;
      const int64_t h = g * G + hg;
      const bool last_tile = tile_i + 1 == n_tiles;
      if (tile_i == 0) {
        load_query_fragments(qa, p, h, t);
        m[0] = m[1] = kNegInf, l[0] = l[1] = 0.0f;
      }
      await_tile();
      if (!last_tile) issue(hg, c0 + kTileDim, buf ^ 1);
      else if (hg + 1 < G) issue(hg + 1, 0, buf ^ 1);
      qk_tile(s, qa, tile[buf]);
      scale_and_mask(s, bias_tile[buf], scale2, c0, n_cand, c0 + kTileDim <= warp_min);
      if (prune) {
        float lane_max[2][kParts];
        accumulate_mass<kParts>(s, m, l, lane_max);
        update_slots(tile_i, lane_max);
      } else {
        accumulate_mass(s, m, l);
      }
      if (last_tile) end_head(hg, m, l);
      if (last_tile) tile_i = 0, ++hg;
      else ++tile_i;
    }
  }
  __syncthreads();
  if (prune) {
    for (int j = 0; j < 16; ++j) {
      const int q = warp * 16 + j;
      const float kth = kth_largest(buf + q * kBufPitch, K);
      if (lane == 0) row_bound[q] = kth;
    }
    __syncwarp();
  }
  // Pass 2, step = (tile, head): group score per tile; rows with a score above their list's
  // threshold (held in registers) are offered to their top-K lists.
  int count[2] = {0, 0};  // v8: entries in the buffers of rows row[0], row[1]
  if constexpr (kLean) {
    // v12: v10's pass 2 (same products, same epilogue arithmetic and order), with the per-step
    // overhead v10's SASS showed (~330 instructions per step for 96 of score arithmetic) cut:
    // the per-thread pieces of the q~ panel copy (rows tq / 8 + 16 j) and of the k' copy (rows
    // tid / 8 + 32 j: the 128-byte swizzle of row + 16 j or + 32 j is row's, 2048 or 4096 bytes
    // on) and the wgmma descriptors are worked out once; 32-bit element offsets inside a group;
    // the loop runs (tile, head) with each tile's first head as its own code, so r needs no
    // reset selects on every step.
    if (n_tiles > 0) {
      const int steps = G * n_tiles;
      float r[8][4];
      float theta[2] = {prune ? floor_of(row_bound[row[0]]) : kNegInf, prune ? floor_of(row_bound[row[1]]) : kNegInf};
      // v25: the fifth k-step's k-side rows in the scratch after bias2, the margin on the bound.
      const int64_t n_bias = p.Hq * (p.T / p.S);
      const uint4* fold_rows = kFold ? reinterpret_cast<const uint4*>(bias2 + fold_rows_offset(n_bias)) : nullptr;
      if (kFold && fold && prune) {
        const float b_max = *reinterpret_cast<const float*>(fold_rows + n_bias);
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const float bound_i = row_bound[row[i]];
          const float eps = kFoldMargin * (fabsf(bound_i) + 1.0f + 2.0f * fold_z_max[i] + 3.0f * b_max);
          theta[i] = bound_i == kNegInf ? kNegInf : floor_of(bound_i - eps);
        }
      }
      const int wg_index = warp / 4;
      unsigned char* q_panel = panels + (2 + wg_index) * kPanelBytes;
      const int64_t wg_t0 = t0 + 64 * wg_index;
      const auto* q0 = static_cast<const __nv_bfloat16*>(p.q_retrieval) + g * G * p.T * kTileDim;
      const int64_t head_stride = p.T * kTileDim;
      const int tq = threadIdx.x % 128, q_row = tq / 8;
      unsigned char* const q_dst = q_panel + wg::sw128_offset(q_row, (tq % 8) * 8);
      const int64_t q_off = (wg_t0 + q_row) * kTileDim + (tq % 8) * 8;  // used only where valid
      const int64_t q_left = p.T - (wg_t0 + q_row);                      // row q_row + 16 j valid: 16 j < q_left
      // The warpgroup's q~ rows of head g G + hg (not committed).
      auto copy_q = [&](int hg) {
        const __nv_bfloat16* head = q0 + hg * head_stride;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const bool valid = 16 * j < q_left;
          cp_async16(q_dst + 2048 * j, valid ? head + q_off + 1024 * j : head, valid);
        }
      };
      // v16: pass 2's copies from 32-bit element offsets on the kernel's parameters (q~: Hq T 64
      // < 2^32, launch_select_packed checks; k': Hq n_chunks 64 < Hq T), worked out per step
      // from the head index, into 32-bit shared addresses, so that no 64-bit copy state stays
      // live across the steps (v15 spilled v12's and reloaded it after every wgmma). Every
      // warpgroup but the last block's has its 64 rows before T: no per-row test there.
      const uint32_t hq0 = blockIdx.y * G, T64 = static_cast<uint32_t>(p.T) * kTileDim;
      const uint32_t q_dst32 = kQ32 ? static_cast<uint32_t>(__cvta_generic_to_shared(q_dst)) : 0u;
      const uint32_t fold32 = kFold ? static_cast<uint32_t>(__cvta_generic_to_shared(fold_panel)) : 0u;
      const uint32_t k_dst32 = kQ32 ? static_cast<uint32_t>(__cvta_generic_to_shared(panels)) + k_dst : 0u;
      const uint32_t q_off32 = static_cast<uint32_t>(q_off);
      const int q_rows = q_left < 64 ? static_cast<int>(q_left) : 64;
      auto copy_q2 = [&](int hg) {
        if constexpr (kQ32) {
          const auto* q = static_cast<const __nv_bfloat16*>(p.q_retrieval);
          const uint32_t off = (hq0 + hg) * T64 + q_off32;
          if (q_rows == 64) {
#pragma unroll
            for (int j = 0; j < 4; ++j) cp_async16_at(q_dst32 + 2048 * j, q + off + 1024 * j, true);
          } else {
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              const bool valid = 16 * j < q_rows;
              cp_async16_at(q_dst32 + 2048 * j, q + (valid ? off + 1024 * j : 0u), valid);
            }
          }
        } else {
          copy_q(hg);
        }
      };
      auto copy_k2 = [&](int hg, int c0, int stage) {
        if constexpr (kQ32) {
          const uint32_t head = (hq0 + hg) * static_cast<uint32_t>(nc);
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            const int rr = c0 + k_row + 32 * j;
            const bool valid = rr < nc;
            cp_async16_at(k_dst32 + stage * kPanelBytes + 4096 * j,
                          key_bf16 + (valid ? (head + rr) * kTileDim + k_col : 0u), valid);
          }
          if (threadIdx.x < kTileDim) {
            const int cc = c0 + static_cast<int>(threadIdx.x);
            const bool valid = cc < nc;
            if (kFold && fold)  // v25: the chunks' k-side rows of the fifth k-step instead of the biases
              cp_async16_at(fold32 + stage * kFoldStageBytes + threadIdx.x * 16, fold_rows + (valid ? head + cc : 0u),
                            valid);
            else
              cp_async4(&bias_tile[stage][threadIdx.x], bias2 + (valid ? head + cc : 0u), valid);
          }
          cp_async_commit();
        } else {
          copy_k(hg, c0, stage);
        }
      };
      const uint64_t q_desc = wg::desc_k_major(q_panel);
      // v16: the descriptors' k16 steps on their low words only (the 14-bit address field of a
      // shared address below 228 KB, plus 6, does not carry; both high words are equal).
      const uint32_t q_lo = static_cast<uint32_t>(q_desc), k_lo = static_cast<uint32_t>(k_desc);
      auto product = [&](int stage) {
        wg::fence_operands(s);
        wg::fence();
        if constexpr (kQ32) {
          const uint32_t kd_lo = k_lo + static_cast<uint32_t>(stage * (kPanelBytes >> 4));
          wg::mma_ss_k_major<0>(s, q_lo, kd_lo, false);
          wg::mma_ss_k_major<1>(s, q_lo, kd_lo, true);
          wg::mma_ss_k_major<2>(s, q_lo, kd_lo, true);
          wg::mma_ss_k_major<3>(s, q_lo, kd_lo, true);
        } else {
          const uint64_t kd = k_desc + static_cast<uint64_t>(stage * (kPanelBytes >> 4));
#pragma unroll
          for (int ks = 0; ks < 4; ++ks)
            wg::mma_ss<false>(s, wg::desc_advance(q_desc, 32 * ks), wg::desc_advance(kd, 32 * ks), ks > 0);
        }
        wg::commit();
        wg::wait<0>();
        wg::fence_operands(s);
      };
      // v25: the four k16 steps of q~ . k' and the fifth (A: this thread's q-side pieces, B: the
      // stage's FoldRows; leading and stride offsets both 128 bytes, so the unused second core
      // matrix along K is the next 8 rows whatever the order of the two fields) into acc.
      const uint64_t fold_desc = kFold ? wg::desc_interleave(fold32, 128, 128) : 0ull;
      auto product_fold = [&](int stage, float (&acc)[8][4], const uint32_t (&a)[4]) {
        wg::fence_operands(acc);
        wg::fence();
        const uint32_t kd_lo = k_lo + static_cast<uint32_t>(stage * (kPanelBytes >> 4));
        wg::mma_ss_k_major<0>(acc, q_lo, kd_lo, false);
        wg::mma_ss_k_major<1>(acc, q_lo, kd_lo, true);
        wg::mma_ss_k_major<2>(acc, q_lo, kd_lo, true);
        wg::mma_ss_k_major<3>(acc, q_lo, kd_lo, true);
        wg::mma_rs<false>(acc, a, fold_desc + static_cast<uint64_t>(stage * (kFoldStageBytes >> 4)), true);
        wg::commit();
        wg::wait<0>();
        wg::fence_operands(acc);
      };
      // This thread's A fragment of the fifth k-step for head hg: columns 2 (lane % 4) + {0, 1} of
      // rows row[0] (a[0]) and row[1] (a[1]); columns 8-15 zero.
      const int quad = lane % 4;
      const uint32_t fold_ones = quad == 2 ? kBf16One | kBf16One << 16 : 0u;
      auto fold_a = [&](int hg, uint32_t (&a)[4]) {
        const auto* hi_mid = reinterpret_cast<const uint32_t*>(sh.log_z);
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int idx = hg * kQueries + row[i];
          const uint32_t hm = hi_mid[idx], lo = fold_lo[idx];
          a[i] = quad == 0 ? hm : quad == 1 ? lo | kBf16One << 16 : fold_ones;
        }
        a[2] = a[3] = 0u;
      };
      copy_q2(0);  // committed with the first k' tile
      copy_k2(0, 0, 0);
      int step = 0;
      // Step (tile at c0, head hg): v10's step; kFirst: the tile's first head (r starts here).
      // The next step's k' tile into the other stage (v16 on: one copy with the next (head, tile)
      // selected, so that the next tile's addresses are not worked out ahead of the head loop and
      // kept live across it).
      auto copy_next_k = [&](int hg, int c0, int stage) {
        if constexpr (kQ32) {
          const bool next_tile = hg + 1 == G;
          copy_k2(next_tile ? 0 : hg + 1, next_tile ? c0 + kTileDim : c0, stage ^ 1);
        } else {
          if (hg + 1 < G) copy_k(hg + 1, c0, stage ^ 1);
          else copy_k(0, c0 + kTileDim, stage ^ 1);
        }
      };
      // The warpgroup's wgmma has read the q~ panel: it takes the next step's head (named barrier 1
      // or 2 per warpgroup, an immediate).
      auto hand_on_q_panel = [&](int hg) {
        if (wg_index == 0)
          asm volatile("bar.sync 1, 128;\n" ::: "memory");
        else
          asm volatile("bar.sync 2, 128;\n" ::: "memory");
        copy_q2(hg + 1 < G ? hg + 1 : 0);
        cp_async_commit();
      };
      auto head_step = [&](int hg, int c0, auto first) {
        constexpr bool kFirst = decltype(first)::value;
        const int stage = step & 1;
        await_tile();
        const bool more = step + 1 < steps;
        if (more) copy_next_k(hg, c0, stage);
        product(stage);
        if (G > 1 && more) hand_on_q_panel(hg);
        const float* b2 = bias_tile[stage];
        const float z[2] = {sh.log_z[hg * kQueries + row[0]], sh.log_z[hg * kQueries + row[1]]};
        const float init = p.group_rule == kGroupSumProbabilities ? 0.0f : kNegInf;
        if (p.group_rule == kGroupMaxNormalized) {
#pragma unroll
          for (int nt = 0; nt < 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int col = nt * 8 + (lane % 4) * 2 + (e % 2);
              r[nt][e] = fmaxf(kFirst ? init : r[nt][e], fmaf(s[nt][e], scale2, b2[col]) - z[e / 2]);
            }
        } else if (p.group_rule == kGroupSumProbabilities) {
#pragma unroll
          for (int nt = 0; nt < 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int col = nt * 8 + (lane % 4) * 2 + (e % 2);
              r[nt][e] = (kFirst ? init : r[nt][e]) + fast_exp2(fmaf(s[nt][e], scale2, b2[col]) - z[e / 2]);
            }
        } else {
#pragma unroll
          for (int nt = 0; nt < 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int col = nt * 8 + (lane % 4) * 2 + (e % 2);
              r[nt][e] = fmaxf(kFirst ? init : r[nt][e], fmaf(s[nt][e], scale2, b2[col]));
            }
        }
        ++step;
      };
      // v25's step (max_normalized): the products with the bias and -log2 Z_hat / scale2 added
      // (acc); r = max over the tile's heads of acc, in place for the first head.
      auto fold_step = [&](int hg, int c0, auto first) {
        constexpr bool kFirst = decltype(first)::value;
        const int stage = step & 1;
        uint32_t a[4];
        fold_a(hg, a);
        await_tile();
        const bool more = step + 1 < steps;
        if (more) copy_next_k(hg, c0, stage);
        if constexpr (kFirst)
          product_fold(stage, r, a);
        else
          product_fold(stage, s, a);
        if (G > 1 && more) hand_on_q_panel(hg);
        if constexpr (!kFirst) {
#pragma unroll
          for (int nt = 0; nt < 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) r[nt][e] = fmaxf(r[nt][e], s[nt][e]);
        }
        ++step;
      };
      for (int tile_i = 0; tile_i < n_tiles; ++tile_i) {
        const int c0 = tile_i * kTileDim;
        bool folded = false;
        if constexpr (kFold) {
          if (fold) {
            fold_step(0, c0, std::true_type{});
            for (int hg = 1; hg < G; ++hg) fold_step(hg, c0, std::false_type{});
            // scale2 > 0 and rounding is monotone: fl(scale2 max_h acc_h) = max_h fl(scale2 acc_h).
#pragma unroll
            for (int nt = 0; nt < 8; ++nt)
#pragma unroll
              for (int e = 0; e < 4; ++e) r[nt][e] *= scale2;
            folded = true;
          }
        }
        if (!folded) {
          head_step(0, c0, std::true_type{});
          for (int hg = 1; hg < G; ++hg) head_step(hg, c0, std::false_type{});
        }
        // Sums of probabilities are ranked in the linear domain, the others in base 2.
        if (c0 + kTileDim > warp_min) {
#pragma unroll
          for (int nt = 0; nt < 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e)
              if (c0 + nt * 8 + (lane % 4) * 2 + (e % 2) >= n_cand[e / 2]) r[nt][e] = kNegInf;
        }
        append_half<0>(r, theta, count, buf, row, c0, K);
        append_half<1>(r, theta, count, buf, row, c0, K);
      }
    }
  } else if (n_tiles > 0) {
    const int steps = G * n_tiles;
    float r[8][4];
    // A candidate must beat theta to enter: the sorted list's K-th value (v4), or the float
    // below the row's bound (v8's buffers, r > floor_of(bound) <=> r >= bound) until a compaction.
    float theta[2] = {prune ? floor_of(row_bound[row[0]]) : kNegInf, prune ? floor_of(row_bound[row[1]]) : kNegInf};
    // Rows of q~ for head g G (null past T); head g G + hg is hg T 64 elements further.
    const auto* q0 = static_cast<const __nv_bfloat16*>(p.q_retrieval) + g * G * p.T * kTileDim;
    const __nv_bfloat16* qrow[2] = {t[0] < p.T ? q0 + t[0] * kTileDim : nullptr,
                                    t[1] < p.T ? q0 + t[1] * kTileDim : nullptr};
    const int64_t head_stride = p.T * kTileDim;
    issue(0, 0, 0);
    load_q_fragments(qn, qrow[0], qrow[1]);
    for (int step = 0; step < steps; ++step) {
      const int hg = step % G;
      const int c0 = (step / G) * kTileDim;
      const int next_hg = (step + 1) % G;
#pragma unroll
      for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int b = 0; b < 4; ++b) qa[a][b] = qn[a][b];
      await_tile();
      if (step + 1 < steps) {
        issue(next_hg, ((step + 1) / G) * kTileDim, (step + 1) & 1);
        if (G > 1) {
          const int64_t off = next_hg * head_stride;
          load_q_fragments(qn, qrow[0] ? qrow[0] + off : nullptr, qrow[1] ? qrow[1] + off : nullptr);
        }
      }
      if (hg == 0) {
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) r[nt][e] = p.group_rule == kGroupSumProbabilities ? 0.0f : kNegInf;
      }
      qk_tile(s, qa, tile[step & 1]);
      const float* b2 = bias_tile[step & 1];
      const float z[2] = {sh.log_z[hg * kQueries + row[0]], sh.log_z[hg * kQueries + row[1]]};
      // One loop per group rule (the rule is uniform: no branch per element).
      if (p.group_rule == kGroupMaxNormalized) {
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int col = nt * 8 + (lane % 4) * 2 + (e % 2);
            r[nt][e] = fmaxf(r[nt][e], fmaf(s[nt][e], scale2, b2[col]) - z[e / 2]);
          }
      } else if (p.group_rule == kGroupSumProbabilities) {
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int col = nt * 8 + (lane % 4) * 2 + (e % 2);
            r[nt][e] += fast_exp2(fmaf(s[nt][e], scale2, b2[col]) - z[e / 2]);
          }
      } else {
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int col = nt * 8 + (lane % 4) * 2 + (e % 2);
            r[nt][e] = fmaxf(r[nt][e], fmaf(s[nt][e], scale2, b2[col]));
          }
      }
      if (hg != G - 1) continue;
      // Sums of probabilities are ranked in the linear domain, the others in base 2.
      if (c0 + kTileDim > warp_min) {
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            if (c0 + nt * 8 + (lane % 4) * 2 + (e % 2) >= n_cand[e / 2]) r[nt][e] = kNegInf;
      }
      if (kBuffered) {
        append_half<0>(r, theta, count, buf, row, c0, K);
        append_half<1>(r, theta, count, buf, row, c0, K);
        continue;
      }
      bool any[2] = {false, false};
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) any[e / 2] |= r[nt][e] > theta[e / 2];
      // Row j (lane / 4) has a candidate if any lane of its quad has one: OR over the quad, one
      // ballot bit per quad (bits 4 j), compressed to bit j.
      const unsigned rows = flagged_rows(any);
      if (rows == 0u) continue;
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          sh.r[row[e / 2] * kRPitch + nt * 8 + (lane % 4) * 2 + (e % 2)] = r[nt][e];
      __syncwarp();
      // Each warp ranks its own 16 queries: no block barrier needed for sh.r rows.
      for (unsigned pending = rows; pending != 0u; pending &= pending - 1) {
        const int q = warp * 16 + __ffs(pending) - 1;
        offer_tile(sh.r + q * kRPitch, sh.value + q * K, sh.index + q * K, c0, sh.n_cand[q], K);
      }
#pragma unroll
      for (int i = 0; i < 2; ++i)
        theta[i] = threshold_of(sh.value[row[i] * K + K - 1]);
    }
  }
  __syncthreads();
  if (kBuffered) {
    // Each row's K best of its buffer, the valid entries first and -1 after.
    for (int j = 0; j < 16; ++j) {
      const int q = warp * 16 + j;
      if (t0 + q >= p.T) continue;
      float* value = buf + q * kBufPitch;
      int32_t* index = reinterpret_cast<int32_t*>(value + kBufCap);
      int n = __shfl_sync(0xffffffffu, j < 8 ? count[0] : count[1], 4 * (j % 8));
      if (n > K) {
        keep_best(value, index, n, K);
        n = K;
      }
      if (lane >= n && lane < K) index[lane] = -1;
      __syncwarp();
      if constexpr (kWriter == Writer::ahead) {
        write_selection_ahead<G>(p, index, t0 + q, g, key, bias, selection, selected_score);
      } else if constexpr (kWriter == Writer::separate) {
        int rank_of[2];
        write_selected_chunks(p, index, t0 + q, g, selection, rank_of);
      } else
        write_selection(p, index, t0 + q, g, G, key, bias, selection, selected_score);
    }
  } else {
    for (int q = warp * 16; q < warp * 16 + 16; ++q) {
      if (t0 + q >= p.T) continue;
      write_selection(p, sh.index + q * K, t0 + q, g, G, key, bias, selection, selected_score);
    }
  }
}

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

size_t select_one_pass_smem_bytes(int64_t K) {
  return (kQueries * kRPitch + 4 * kQueries * K + kQueries) * 4;
}

// Queries per block of each kernel (threads: 2 per query): 128 for the wgmma kernels
// (Scoring::wgmma_q_smem), 64 for the others.
int block_queries(PackedSelect kernel) {
  return uses_wgmma(kernel) ? kBlockQueries<Scoring::wgmma_q_smem> : kQueries;
}

size_t select_smem_bytes(int64_t G, int64_t K, PackedSelect kernel) {
  const size_t v8_bytes = (kQueries * kBufPitch + G * kQueries + 2 * kQueries) * 4;
  if (kernel == PackedSelect::two_pass_v8) return v8_bytes;
  // v25: + the fifth k-step's k-side stages and the q side's low pieces (G x 128 bf16).
  if (kernel == PackedSelect::two_pass_v25)
    return 2 * v8_bytes + 4 * kPanelBytes + wg::kAtomBytes + kFoldPanelFloats * 4 + G * 128 * 2;
  if (uses_wgmma(kernel)) return 2 * v8_bytes + 4 * kPanelBytes + wg::kAtomBytes;
  return (kQueries * kRPitch + G * kQueries + 2 * kQueries * K + 2 * kQueries) * 4;
}

using SelectKernelFn = void (*)(LaunchParams, const float*, const __nv_bfloat16*, const float*,
                                const float*, const float*, int32_t*, float*, int);

// block_rows' first round for a grid of `blocks` blocks of `threads` threads: the device's SM
// count when the grid fits the device in one wave with at least two blocks per SM (then every
// SM takes one block before any takes a second, and the second blocks can be the light ones),
// else 0 (descending work only).
int one_wave_first_round(SelectKernelFn fn, int threads, size_t smem, int64_t blocks) {
  const Residency r = kernel_residency(fn, threads, smem, "select_kernel");
  return r.blocks_per_sm >= 2 && blocks > r.sms && blocks <= r.blocks() ? r.sms : 0;
}

template <int G>
SelectKernelFn select_kernel_of(PackedSelect kernel) {
  switch (kernel) {
    case PackedSelect::two_pass_v4: return select_packed_kernel<G, Offers::sorted>;
    case PackedSelect::one_pass_v5: return select_one_pass_kernel<G>;
    case PackedSelect::two_pass_v8: return select_packed_kernel<G, Offers::buffered>;
    case PackedSelect::two_pass_v15:
      return select_packed_kernel<G, Offers::buffered, Scoring::wgmma_q_smem, Writer::ahead, Lean::pass2>;
    case PackedSelect::two_pass_v21:  // the selection; the scores by selected_scores_lean_kernel
    case PackedSelect::two_pass_v22:  // the same; the scores by selected_scores_lean_kernel<G, true>
      return select_packed_kernel<G, Offers::buffered, Scoring::wgmma_q_smem, Writer::separate, Lean::pass2_q32>;
    case PackedSelect::two_pass_v25:  // v22 with the bias and log2 Z_hat as pass 2's fifth k-step
      return select_packed_kernel<G, Offers::buffered, Scoring::wgmma_q_smem, Writer::separate, Lean::pass2_fold>;
  }
  return select_packed_kernel<G, Offers::sorted>;
}

template <int G>
void launch_select_g(const LaunchParams& p, const float* key, const float* bias,
                     const float* lse_swa, int32_t* selection, float* selected_score,
                     PackedSelect kernel, cudaStream_t stream) {
  // Static stages plus this dynamic scratch may pass the 48 KB default: always raise the limit.
  const size_t smem = kernel == PackedSelect::one_pass_v5 ? select_one_pass_smem_bytes(p.K)
                                                          : select_smem_bytes(G, p.K, kernel);
  const SelectKernelFn fn = select_kernel_of<G>(kernel);
  cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  const int queries = block_queries(kernel);
  const dim3 grid(static_cast<unsigned>((p.T + queries - 1) / queries),
                  static_cast<unsigned>(p.Hkv));
  // A bf16 copy of k' and a log2 e scaled bias (stream-ordered scratch) feed the copy engine;
  // v25: and the fifth k-step's k-side rows and max |b2| after them (fold_rows_offset).
  const int64_t n = p.Hq * (p.T / p.S) * kTileDim, n_bias = p.Hq * (p.T / p.S);
  const bool fold = kernel == PackedSelect::two_pass_v25;
  const size_t key_bytes = ((n > 0 ? n : 1) * sizeof(__nv_bfloat16) + 255) / 256 * 256;
  const int64_t bias_floats = fold ? fold_scratch_floats(n_bias) : (n_bias > 0 ? n_bias : 1);
  auto* scratch = static_cast<char*>(take_scratch(key_bytes + bias_floats * sizeof(float), stream, "selection"));
  auto* key_bf16 = reinterpret_cast<__nv_bfloat16*>(scratch);
  auto* bias2 = reinterpret_cast<float*>(scratch + key_bytes);
  auto* fold_rows = fold ? reinterpret_cast<uint4*>(bias2 + fold_rows_offset(n_bias)) : nullptr;
  auto* fold_bias_max = fold ? reinterpret_cast<float*>(fold_rows + n_bias) : nullptr;
  if (fold) cudaMemsetAsync(fold_bias_max, 0, sizeof(float), stream);
  if (n > 0)
    to_bf16_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(
        key, key_bf16, n, bias, bias2, n_bias, fold_rows, fold_bias_max, p.scale * kLog2e);
  const int first_round = one_wave_first_round(fn, 2 * queries, smem, static_cast<int64_t>(grid.x) * grid.y);
  fn<<<grid, 2 * queries, smem, stream>>>(p, key, key_bf16, bias, bias2, lse_swa, selection, selected_score,
                                          first_round);
  // v21, v22, v25: the selected scores after the selection, by a kernel of their own, from bf16 k'.
  const dim3 scores_grid(static_cast<unsigned>((p.T + 7) / 8), static_cast<unsigned>(p.Hkv));
  if (kernel == PackedSelect::two_pass_v21)  // v21: v20's sums in fewer instructions (K <= 32)
    selected_scores_lean_kernel<G><<<scores_grid, 256, 0, stream>>>(p, key_bf16, bias, selection, selected_score);
  if (kernel == PackedSelect::two_pass_v22 || kernel == PackedSelect::two_pass_v25)  // v22: v21's without load
    selected_scores_lean_kernel<G, true><<<scores_grid, 256, 0, stream>>>(p, key_bf16, bias, selection,
                                                                          selected_score);
  give_back_scratch(scratch, stream);
}

}  // namespace

bool packed_select_applies(const LaunchParams& p) {
  const int64_t G = p.Hq / p.Hkv;
  return p.bf16 && p.d == kTileDim && p.K >= 1 && p.K <= 64 && p.key_rule != KeyRule::exact &&
         (G == 1 || G == 2 || G == 4 || G == 8 || G == 16);
}

void launch_select_packed(const LaunchParams& p, const float* key, const float* bias,
                          const float* lse_swa, int32_t* selection, float* selected_score,
                          PackedSelect kernel, cudaStream_t stream) {
  // The one-pass argument holds for the default group rule only; v8's 64-entry buffers (K + 32
  // entries) hold K <= 32, and so do the later kernels'.
  const bool fall_back = (kernel == PackedSelect::one_pass_v5 && p.group_rule != kGroupMaxNormalized) ||
                         (kernel != PackedSelect::two_pass_v4 && kernel != PackedSelect::one_pass_v5 &&
                          p.K > kWarp);
  // v21, v22 and v25 offset q~ rows in 32 bits (Hq T 64 < 2^32); longer sequences run v15 (the same
  // selection as v21 and v22; v25 differs from it only where it differs from v8; the scores are
  // v8's, not v21's rounding of k' to bf16).
  const bool long_rows = (kernel == PackedSelect::two_pass_v21 || kernel == PackedSelect::two_pass_v22 ||
                          kernel == PackedSelect::two_pass_v25) &&
                         p.Hq * p.T * kTileDim > UINT32_MAX;
  // v25 at G = 16: its extra shared memory (select_smem_bytes) would leave one block per SM; v22 runs.
  const bool fold_too_large = kernel == PackedSelect::two_pass_v25 && p.Hq / p.Hkv == 16;
  const PackedSelect one = fall_back   ? PackedSelect::two_pass_v4
                           : long_rows ? PackedSelect::two_pass_v15
                           : fold_too_large ? PackedSelect::two_pass_v22
                                            : kernel;
  if (uses_wgmma(one) && !wgmma_runs_on_current_device())
    refuse_wgmma_kernel("select_kernel", select_kernel_name(one),
                        "two_pass_v4, one_pass_v5 or two_pass_v8; two_pass_v8 is the fastest");
  switch (p.Hq / p.Hkv) {
    case 1: return launch_select_g<1>(p, key, bias, lse_swa, selection, selected_score, one, stream);
    case 2: return launch_select_g<2>(p, key, bias, lse_swa, selection, selected_score, one, stream);
    case 4: return launch_select_g<4>(p, key, bias, lse_swa, selection, selected_score, one, stream);
    case 8: return launch_select_g<8>(p, key, bias, lse_swa, selection, selected_score, one, stream);
    default: return launch_select_g<16>(p, key, bias, lse_swa, selection, selected_score, one, stream);
  }
}

}  // namespace hils::gpu::detail
