// v8's buffered offers (Offers::buffered, K <= 32) and pass 1's bound: the warp's bitonic sort
// (sort_largest_first), the lower bound on a row's K-th group score (kBoundSlots, kth_largest), the
// rows' layout in shared memory (kBufPitch, kBufCap, swizzled_slot), the rank keys and the cut of a
// full buffer to its K best (rank_key, keep_best), and the appends of a tile half (append_half).
#pragma once

#include <cstdint>

#include "select_packed/common.cuh"

namespace hils::gpu::detail {
namespace {

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

}  // namespace
}  // namespace hils::gpu::detail
