// The sorted top-K lists of v4 and v5 (Offers::sorted): a query's list in shared memory, offered
// one tile row at a time (threshold_of, offer_tile), and the one-pass kernel's join of a head's
// list into the query's union list (ranks_ahead, merge_head_list).
#pragma once

#include <cstdint>

#include "select_packed/common.cuh"

namespace hils::gpu::detail {
namespace {

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

}  // namespace
}  // namespace hils::gpu::detail
