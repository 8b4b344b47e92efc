// Softmax tiles over a range of cache slots, shared by the window tiles (stage 1, decode/scan.cuh)
// and the chunk tiles (stage 4, decode/chunks.cuh): the warp-per-head tile (group_tile_softmax,
// rows staged in shared memory when they fit kStageBytes) and the packed tile (fast_tile_softmax:
// d = dv = 64, G <= 16, 128 threads), with the host's shared-memory sizes of both.
#pragma once

#include <cuda_bf16.h>

#include <cstddef>
#include <cstdint>

#include "decode/common.cuh"

namespace hils::gpu {
namespace detail {
namespace {

// Rows staged in shared memory by the window and chunk tiles when they fit this budget.
constexpr size_t kStageBytes = 32 * 1024;

size_t stage_bytes(int64_t rows, int64_t d, int64_t dv) {
  const size_t bytes = rows * (d + dv) * sizeof(__nv_bfloat16);
  return bytes <= kStageBytes ? bytes : 0;
}

// Block-wide copy of n bf16 values, in 16-byte pieces when both ends are aligned and n % 8 == 0.
__device__ void stage_copy(__nv_bfloat16* dst, const __nv_bfloat16* src, int64_t n) {
  const bool vec = n % 8 == 0 && reinterpret_cast<uintptr_t>(dst) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(src) % 16 == 0;
  if (vec) {
    for (int64_t i = threadIdx.x; i < n / 8; i += blockDim.x)
      reinterpret_cast<uint4*>(dst)[i] = __ldg(reinterpret_cast<const uint4*>(src) + i);
  } else {
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
  }
}

// Block-wide softmax of q over the attendable slots [lo, hi] of KV group (b, g) for every query
// head of the group (a warp per head); rows [lo, lo + rows) staged in shared memory when they
// fit (`staged`). Calls emit(item, st) on each head's warp.
template <class Emit>
__device__ void group_tile_softmax(const DecodeParams& p, int64_t bg, int64_t lo, int64_t hi,
                                   int64_t rows, bool staged, float* smem, Emit emit) {
  const int warp = threadIdx.x / kWarp;
  const int d = static_cast<int>(p.d), dv = static_cast<int>(p.dv);
  const int64_t b = bg / p.Hkv, g = bg % p.Hkv;
  const __nv_bfloat16* k = p.k + bg * p.slot_cap * p.d;
  const __nv_bfloat16* v = p.v + bg * p.slot_cap * p.dv;
  float* q = smem + warp * p.d;
  if (staged) {
    auto* ks = reinterpret_cast<__nv_bfloat16*>(smem + kWarpsPerBlock * p.d);
    __nv_bfloat16* vs = ks + rows * p.d;
    const int64_t n_rows = hi - lo + 1;
    stage_copy(ks, k + lo * p.d, n_rows * p.d);
    stage_copy(vs, v + lo * p.dv, n_rows * p.dv);
    __syncthreads();
    k = ks - lo * p.d;  // so that slot j reads staged row j - lo
    v = vs - lo * p.dv;
  }
  const SlotGeometry geo{p.T, p.S, p.W, p.landmarks};
  for (int64_t j = warp; j < p.G; j += kWarpsPerBlock) {
    const int64_t item = b * p.Hq + g * p.G + j;
    load_row(q, p.q + item * p.d, d);
    WarpSoftmax st;
    attend_range(st, q, k, v, d, dv, lo, hi, p.scale, geo);
    emit(item, st);
    __syncwarp();
  }
}

// The packed shape (d = dv = 64, G <= 16, <= 64 slots, 128 threads): thread (j, half) scores
// slot lo + j against heads half, half + 2, ... from 16-byte loads of its key row; a warp per
// head turns the logits into probabilities; thread (dim, half) sums p * v over the slots
// (coalesced rows). Calls emit(item, m, l, dim, unnormalised o) for each (head, dim).
constexpr int kFastDim = 64;
constexpr int kFastMaxGroup = 16;
constexpr int kFastThreads = 128;

// Floats before the staged value rows (kEarly), a multiple of 4 so that they are 16-byte aligned.
__host__ __device__ inline int64_t fast_tile_floats(int64_t G) {
  return (2 * G * kFastDim + 2 * G + 3) / 4 * 4;
}
// kEarly also stages the tile's value rows, 64 x 64 bf16.
size_t fast_tile_smem(int64_t G, bool early = false) {
  return early ? fast_tile_floats(G) * sizeof(float) + kDecodeTileSlots * kFastDim * 2
               : (2 * G * kFastDim + 2 * G) * sizeof(float);
}

// kEarly (the fused kernel): the key row and the tile's value rows (4 16-byte pieces per
// thread, into shared memory) are loaded before q is staged, so that the tile waits for one
// memory round trip; d5 (kEarly false) loads the key row after staging q and reads the value
// rows in the p.v loop, 4 rows per round trip (16 round trips for 64 rows).
struct NoWork {
  __device__ void operator()() const {}
};

// `during` runs (on every thread, no barrier inside) once the tile's loads are issued.
template <bool kEarly, class Emit, class During = NoWork>
__device__ void fast_tile_softmax(const DecodeParams& p, int64_t bg, int64_t lo, int64_t hi,
                                  float* smem, Emit emit, During during = {}) {
  constexpr int D = kFastDim;
  constexpr int kPieces = kDecodeTileSlots * D / 8 / kFastThreads;  // 16-byte pieces per thread
  const int G = static_cast<int>(p.G);
  float* qs = smem;
  float* pr = qs + G * D;
  float* ms = pr + G * D;
  float* ls = ms + G;
  auto* vs = reinterpret_cast<__nv_bfloat16*>(smem + fast_tile_floats(G));
  const int64_t b = bg / p.Hkv, g = bg % p.Hkv, first = b * p.Hq + g * G;
  const __nv_bfloat16* k = p.k + bg * p.slot_cap * D;
  const __nv_bfloat16* v = p.v + bg * p.slot_cap * D;
  const int j = threadIdx.x % D, half = threadIdx.x / D;
  const SlotGeometry geo{p.T, p.S, p.W, p.landmarks};
  const int64_t slot = lo + j;
  const bool valid = slot <= hi && geo.attendable(slot);
  const int n_rows = static_cast<int>(hi - lo + 1);
  uint4 u[D / 8], vpiece[kPieces];
  auto load_key_row = [&] {
#pragma unroll
    for (int i = 0; i < D / 8; ++i)
      u[i] = valid ? __ldg(reinterpret_cast<const uint4*>(k + slot * D) + i) : make_uint4(0, 0, 0, 0);
  };
  if (kEarly) {
    load_key_row();
#pragma unroll
    for (int e = 0; e < kPieces; ++e) {
      const int piece = threadIdx.x + kFastThreads * e, row = piece / (D / 8);
      vpiece[e] = row < n_rows ? __ldg(reinterpret_cast<const uint4*>(v + (lo + row) * D) + piece % (D / 8))
                               : make_uint4(0, 0, 0, 0);
    }
  }
  during();
  for (int i = threadIdx.x; i < G * D; i += blockDim.x) qs[i] = __bfloat162float(p.q[first * D + i]);
  if (kEarly) {
#pragma unroll
    for (int e = 0; e < kPieces; ++e)
      reinterpret_cast<uint4*>(vs)[threadIdx.x + kFastThreads * e] = vpiece[e];
  }
  __syncthreads();
  if (!kEarly) load_key_row();
  for (int h = half; h < G; h += 2) {
    float acc = 0.0f;
#pragma unroll
    for (int i = 0; i < D / 8; ++i) {
      const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&u[i]);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 f = __bfloat1622float2(pairs[e]);
        acc = fmaf(qs[h * D + 8 * i + 2 * e], f.x, acc);
        acc = fmaf(qs[h * D + 8 * i + 2 * e + 1], f.y, acc);
      }
    }
    pr[h * D + j] = valid ? p.scale * acc : kNegInf;
  }
  __syncthreads();
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  for (int h = warp; h < G; h += kFastThreads / kWarp) {
    const float s0 = pr[h * D + lane], s1 = pr[h * D + lane + kWarp];
    const float m = warp_max(fmaxf(s0, s1));
    const float p0 = exp_diff(s0, m), p1 = exp_diff(s1, m);
    const float l = warp_sum(p0 + p1);
    pr[h * D + lane] = p0, pr[h * D + lane + kWarp] = p1;
    if (lane == 0) ms[h] = m, ls[h] = l;
  }
  __syncthreads();
  const int dim = threadIdx.x % D;
  float acc[kFastMaxGroup / 2] = {};
#pragma unroll 4
  for (int r = 0; r < n_rows; ++r) {
    const float vv = __bfloat162float(kEarly ? vs[r * D + dim] : v[(lo + r) * D + dim]);
#pragma unroll
    for (int t = 0; t < kFastMaxGroup / 2; ++t) {
      const int h = half + 2 * t;
      if (h < G) acc[t] = fmaf(pr[h * D + r], vv, acc[t]);
    }
  }
#pragma unroll
  for (int t = 0; t < kFastMaxGroup / 2; ++t) {
    const int h = half + 2 * t;
    if (h < G) emit(first + h, ms[h], ls[h], dim, acc[t]);
  }
}

}  // namespace
}  // namespace detail
}  // namespace hils::gpu
