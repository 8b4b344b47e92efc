// Stage 4 of the decode step, the chunk tiles: softmax of q over each selected chunk's tokens per
// head (o_c, lse_c) and the selected chunks' fusion logits (from the cache's fp32 rows, every
// summary store, for hierarchical fusion): the warp tiles (d5's, and the fast tiles of
// decode/tiles.cuh) and the tiles on the tensor cores (4b: d29's one warp per slot, d35's four, d36's that also select).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "mma_common.cuh"
#include "decode/scan.cuh"
#include "decode/select.cuh"

namespace hils::gpu {
namespace detail {
namespace {

// ---- 4. chunk tiles: one block per (selected slot i, b, g), a warp per head ---------------
// s_hat(c) = sigma q~ . k'_c + b'_c from the fp32 row of chunk c for every head of group bg (a
// warp per head), into fusion_logit[item, i]: the fusion logit of selected slot i.
__device__ void selected_logits(const DecodeParams& p, float* fusion_logit, int32_t c, int64_t i,
                                int64_t bg) {
  const int lane = threadIdx.x % kWarp;
  const int64_t b = bg / p.Hkv, g = bg % p.Hkv;
  for (int64_t j = threadIdx.x / kWarp; j < p.G; j += blockDim.x / kWarp) {
    const int64_t item = b * p.Hq + g * p.G + j, row = item * p.chunk_cap + c;
    float acc = 0.0f;
    for (int64_t e = lane; e < p.d; e += kWarp)
      acc = fmaf(__bfloat162float(p.q_retrieval[item * p.d + e]),
                 p.summary_key_fp32[row * p.d + e], acc);
    acc = warp_sum(acc);
    if (lane == 0) fusion_logit[item * p.K + i] = c >= 0 ? p.scale * acc + p.summary_bias[row] : kNegInf;
  }
}

// sigma q~ . k'_c + b'_c of `item` against the fp32 summary row `row` (d = 64) by 8 lanes: lane
// `piece` loads 16 bytes of q~ and 32 of the row, xor shuffles sum the 8 pieces. Every lane of the
// warp must call it (lanes with live == false add zeros); the value is meant for piece 0.
__device__ __forceinline__ float fusion_logit_by_8_lanes(const DecodeParams& p, int64_t item,
                                                         int64_t row, int piece, bool live) {
  constexpr int kLanes = kFastDim / 8;
  const uint4 qu = live ? __ldg(reinterpret_cast<const uint4*>(p.q_retrieval + item * kFastDim) + piece)
                        : make_uint4(0, 0, 0, 0);
  const float4* k_row = reinterpret_cast<const float4*>(p.summary_key_fp32 + row * kFastDim) + 2 * piece;
  const float4 k0 = live ? __ldg(k_row) : make_float4(0.f, 0.f, 0.f, 0.f);
  const float4 k1 = live ? __ldg(k_row + 1) : make_float4(0.f, 0.f, 0.f, 0.f);
  const float bias = live && piece == 0 ? __ldg(p.summary_bias + row) : 0.0f;
  float qf[8];
  Bf16Summary::widen(qu, qf);
  const float kf[8] = {k0.x, k0.y, k0.z, k0.w, k1.x, k1.y, k1.z, k1.w};
  float acc = 0.0f;
#pragma unroll
  for (int e = 0; e < 8; ++e) acc = fmaf(qf[e], kf[e], acc);
#pragma unroll
  for (int off = 1; off < kLanes; off *= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  return p.scale * acc + bias;
}

// The same for d = 64, G <= 16 and 16-byte aligned rows, in one round trip: thread (head
// t / 8, piece t % 8) loads 16 bytes of q~ and of the row, 8 lanes sum. 128 threads.
__device__ void selected_logits_packed(const DecodeParams& p, float* fusion_logit, int32_t c,
                                       int64_t i, int64_t bg) {
  constexpr int kLanes = kFastDim / 8;
  const int64_t b = bg / p.Hkv, g = bg % p.Hkv;
  const int j = threadIdx.x / kLanes, piece = threadIdx.x % kLanes;
  const int64_t item = b * p.Hq + g * p.G + j, row = item * p.chunk_cap + c;
  const bool live = j < p.G;
  const float logit = fusion_logit_by_8_lanes(p, item, row, piece, live);
  if (live && piece == 0) fusion_logit[item * p.K + i] = logit;
}

__device__ bool logits_packable(const DecodeParams& p) {
  return p.d == kFastDim && p.G <= kFastThreads / (kFastDim / 8) && blockDim.x == kFastThreads &&
         reinterpret_cast<uintptr_t>(p.q_retrieval) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(p.summary_key_fp32) % 16 == 0;
}

// kShort: on the fast path the fusion logits are computed while the tile's key and value rows
// are in flight (one round trip, packed), not before issuing them.
template <bool kEarly, bool kShort>
__device__ void chunk_tile(const DecodeParams& p, bool fast, bool staged,
                           const int32_t* selection, float* chunk_part, int64_t i, int64_t bg,
                           float* smem, float* fusion_logit) {
  const int lane = threadIdx.x % kWarp;
  const int32_t c = selection[bg * p.K + i];
  const bool overlap = kShort && fast && c >= 0;
  if (p.summary_key_fp32 && c >= 0 && !overlap) selected_logits(p, fusion_logit, c, i, bg);
  if (fast && c >= 0) {
    auto logits = [&] {
      if (!overlap || !p.summary_key_fp32) return;
      if (logits_packable(p)) selected_logits_packed(p, fusion_logit, c, i, bg);
      else selected_logits(p, fusion_logit, c, i, bg);
    };
    fast_tile_softmax<kEarly>(p, bg, c * p.S, c * p.S + p.S - 1, smem,
                      [&](int64_t item, float m, float l, int dim, float o) {
                        float* out = chunk_part + (item * p.K + i) * (p.dv + 1);
                        if (dim == 0) out[0] = l > 0.0f ? m + __logf(l) : kNegInf;
                        out[1 + dim] = l > 0.0f ? o / l : 0.0f;
                      }, logits);
    return;
  }
  auto emit = [&](int64_t item, const WarpSoftmax& st) {
    float* out = chunk_part + (item * p.K + i) * (p.dv + 1);
    const float inv = st.l > 0.0f ? 1.0f / st.l : 0.0f;
    if (lane == 0) out[0] = st.lse();
#pragma unroll
    for (int r = 0; r < kDimRegs; ++r) {
      const int dim = lane + kWarp * r;
      if (dim < p.dv) out[1 + dim] = st.o[r] * inv;
    }
  };
  if (c >= 0) {
    group_tile_softmax(p, bg, c * p.S, c * p.S + p.S - 1, p.S, staged, smem, emit);
  } else {  // -1 padding: an empty softmax (lse -inf, o 0)
    const int64_t b = bg / p.Hkv, g = bg % p.Hkv;
    for (int64_t j = threadIdx.x / kWarp; j < p.G; j += kWarpsPerBlock)
      emit(b * p.Hq + g * p.G + j, WarpSoftmax{});
  }
}

template <bool kEarly, bool kShort>
__global__ void decode_chunk_kernel(DecodeParams p, bool fast, bool staged,
                                    const int32_t* selection, float* chunk_part,
                                    float* fusion_logit) {
  extern __shared__ float smem[];
  wait_for_previous_grid();
  chunk_tile<kEarly, kShort>(p, fast, staged, selection, chunk_part, blockIdx.x, blockIdx.y, smem,
                     fusion_logit);
  allow_next_grid();
}

// ---- 4b. chunk tiles on the tensor cores (since d17: d29 one warp, d35 four warps) --------
// One warp per (selected slot i, b, g), kMmaChunkWarps warps per block, for the fast tiles'
// shape (d = dv = 64, G <= 16, S <= 64, 16-byte aligned rows). The warp copies the chunk's key
// and value rows into its own shared tiles (cp.async, zeros past S), computes the logits of
// its G heads (rows 0..G-1 of one 16-row A fragment, zero rows beyond) against the 64 slots by
// mma.sync (qk_tile), the softmax per head on the C fragments (a head's row lies in one quad of
// lanes), and o = P V (pv_tile: P rounded to bf16 as in the prefill's packed kernels, the sum l
// from the fp32 probabilities). d13's tile ran ~2,660 scalar instructions per warp for this
// (gpu/NOTES.md "decode", the chunk tiles under Nsight Compute). The fusion logits of the
// selected chunk (fp8 summaries) are computed while the rows are in flight.
constexpr int kMmaChunkWarps = 2;  // 2 x 18 KB of static shared memory per block

struct ChunkTiles {
  __nv_bfloat16 k[kTileDim][kTilePitch];
  __nv_bfloat16 v[kTileDim][kTilePitch];
};

// The launch condition (host and device): the fast tiles' shape, 16-byte rows for the fusion
// logits' loads and 4-byte q rows for the A fragments.
__host__ __device__ inline bool chunk_by_mma(const DecodeParams& p, bool fast_chunk) {
  return fast_chunk && p.d == kTileDim && p.dv == kTileDim && p.S <= kTileDim &&
         p.G <= kFastMaxGroup && reinterpret_cast<uintptr_t>(p.q) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(p.q_retrieval) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(p.summary_key_fp32) % 16 == 0;
}

// fusion_logit[item, i] = sigma q~ . k'_c + b'_c (fp32 rows) for the G heads of group (b, g):
// lane (head t / 8, piece t % 8) loads 16 bytes of q~ and 32 of the row; 8 lanes sum.
__device__ void selected_logits_warp(const DecodeParams& p, float* fusion_logit, int32_t c,
                                     int64_t i, int64_t first) {
  constexpr int kLanes = kTileDim / 8;
  static_assert(kTileDim == kFastDim, "fusion_logit_by_8_lanes reads rows of kFastDim");
  const int lane = threadIdx.x % kWarp;
  for (int base = 0; base < p.G * kLanes; base += kWarp) {
    const int t = base + lane, j = t / kLanes, piece = t % kLanes;
    const bool live = j < p.G;
    const int64_t item = first + j, row = item * p.chunk_cap + c;
    const float logit = fusion_logit_by_8_lanes(p, item, row, piece, live);
    if (live && piece == 0) fusion_logit[item * p.K + i] = logit;
  }
}

// cp_async16 with an L2 cache-policy operand (the chunk tiles since d29: the selected chunks' K/V
// An L2 evict-first cache policy (createpolicy) for the chunk tiles' K/V copies (d29 on).
__device__ __forceinline__ uint64_t evict_first_policy() {
  uint64_t policy = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
#endif
  return policy;
}

// rows, read once per step).
__device__ __forceinline__ void cp_async16_policy(void* smem, const void* gmem, bool valid,
                                                  uint64_t policy) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(dst),
               "l"(gmem), "r"(bytes), "l"(policy));
}

// A 16-row tile's outputs for selected slot i: rows r0 (m0, l0; o[nt][0..1]) and r1 = r0 + 8
// (m1, l1; o[nt][2..3]) of the lane's quad (dims nt * 8 + 2 quad + e) as lse_c and o_c / l;
// rows >= G are padding. The tile of chunk_mma_warp and the four-warp tile's last warp.
__device__ __forceinline__ void write_chunk_rows(const DecodeParams& p, float* chunk_part,
                                                 int64_t first, int64_t i, int G, int quad, int r0,
                                                 int r1, const float (&o)[8][4], float m0,
                                                 float l0, float m1, float l1) {
  auto emit = [&](int row, float m, float l, int half) {
    if (row >= G) return;
    float* out = chunk_part + ((first + row) * p.K + i) * (p.dv + 1);
    if (quad == 0) out[0] = l > 0.0f ? m + __logf(l) : kNegInf;
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) out[1 + nt * 8 + 2 * quad + e] = o[nt][2 * half + e] * inv;
  };
  emit(r0, m0, l0, 0);
  emit(r1, m1, l1, 1);
}

// The logits of a chunk tile's rows r0 (s[t][0..1]) and r1 (s[t][2..3]) at slots
// slot0 + 8 t + 2 quad + e of the first N 8-slot groups: scaled, -inf past n_rows and at the
// landmark (the last row when `landmarks`); m0, m1 get the rows' maxima over the quad
// (chunk_mma_warp: all 8 groups; d35's quad chunk tile: a warp's 2).
template <int N>
__device__ __forceinline__ void scale_mask_slots(float (&s)[8][4], int slot0, int quad, int n_rows,
                                                 bool landmarks, float scale, float& m0, float& m1) {
  const int landmark = landmarks ? n_rows - 1 : n_rows;
  m0 = kNegInf, m1 = kNegInf;
#pragma unroll
  for (int t = 0; t < N; ++t)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int slot = slot0 + t * 8 + 2 * quad + e;
      const bool valid = slot < n_rows && slot != landmark;
      s[t][e] = valid ? scale * s[t][e] : kNegInf;
      s[t][2 + e] = valid ? scale * s[t][2 + e] : kNegInf;
      m0 = fmaxf(m0, s[t][e]);
      m1 = fmaxf(m1, s[t][2 + e]);
    }
  m0 = quad_max(m0), m1 = quad_max(m1);
}

// One warp: selected slot i of group bg in `tile` (d29's chunk tile). The K/V rows come in with
// an L2 evict-first policy, as d25's stream does. A selected chunk is complete (c < T / S), so its
// one unattendable slot is the landmark S - 1: the mask tests that (d19) instead of
// SlotGeometry::attendable per slot (two 64-bit divisions each, 16 slots per lane: the PTX fell
// from 1,765 to 1,205 instructions).
__device__ void chunk_mma_warp(const DecodeParams& p, const int32_t* selection, float* chunk_part,
                               float* fusion_logit, int64_t i, int64_t bg, ChunkTiles& tile) {
  const int lane = threadIdx.x % kWarp;
  const int64_t b = bg / p.Hkv, g = bg % p.Hkv, first = b * p.Hq + g * p.G;
  const int G = static_cast<int>(p.G), quad = lane % 4, r0 = lane / 4, r1 = r0 + 8;
  const int32_t c = i < p.K ? selection[bg * p.K + i] : -1;
  if (i < p.K && c < 0) {  // -1 padding: an empty softmax (lse -inf, o 0)
    for (int t = lane; t < G * (kTileDim + 1); t += kWarp) {
      const int j = t / (kTileDim + 1), col = t % (kTileDim + 1);
      chunk_part[((first + j) * p.K + i) * (p.dv + 1) + col] = col == 0 ? kNegInf : 0.0f;
    }
  }
  if (i < p.K && c >= 0) {
    const int64_t lo = static_cast<int64_t>(c) * p.S;
    const int n_rows = static_cast<int>(p.S);
    const __nv_bfloat16* k = p.k + (bg * p.slot_cap + lo) * kTileDim;
    const __nv_bfloat16* v = p.v + (bg * p.slot_cap + lo) * kTileDim;
    const uint64_t policy = evict_first_policy();
    auto copy_row_piece = [&](__nv_bfloat16* dst, const __nv_bfloat16* src, bool valid) {
      cp_async16_policy(dst, src, valid, policy);
    };
    for (int seg = lane; seg < kTileDim * 8; seg += kWarp) {
      const int row = seg / 8, col = (seg % 8) * 8;
      copy_row_piece(&tile.k[row][col], k + (row < n_rows ? row * kTileDim + col : 0), row < n_rows);
    }
    cp_async_commit();
    for (int seg = lane; seg < kTileDim * 8; seg += kWarp) {
      const int row = seg / 8, col = (seg % 8) * 8;
      copy_row_piece(&tile.v[row][col], v + (row < n_rows ? row * kTileDim + col : 0), row < n_rows);
    }
    cp_async_commit();
    uint32_t qa[4][4];
    load_q_fragments(qa, r0 < G ? p.q + (first + r0) * kTileDim : nullptr,
                     r1 < G ? p.q + (first + r1) * kTileDim : nullptr);
    if (p.summary_key_fp32) selected_logits_warp(p, fusion_logit, c, i, first);
    cp_async_wait_one();  // the key rows
    __syncwarp();
    float s[8][4];
    qk_tile(s, qa, tile.k);
    // Logits of rows r0 (s[nt][0..1]) and r1 (s[nt][2..3]) at slots nt * 8 + 2 * quad + e.
    float m0, m1;
    scale_mask_slots<8>(s, 0, quad, n_rows, p.landmarks, p.scale, m0, m1);
    float l0 = 0.0f, l1 = 0.0f;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        s[nt][e] = exp_diff(s[nt][e], m0), l0 += s[nt][e];
        s[nt][2 + e] = exp_diff(s[nt][2 + e], m1), l1 += s[nt][2 + e];
      }
    l0 = quad_sum(l0), l1 = quad_sum(l1);
    float o[8][4] = {};
    cp_async_wait_all();  // the value rows
    __syncwarp();
    pv_tile(o, s, tile.v);
    write_chunk_rows(p, chunk_part, first, i, G, quad, r0, r1, o, m0, l0, m1, l1);
  }
}

__global__ void __launch_bounds__(kMmaChunkWarps * kWarp)
    decode_chunk_mma_kernel(DecodeParams p, const int32_t* selection, float* chunk_part,
                            float* fusion_logit) {
  __shared__ __align__(16) ChunkTiles tiles[kMmaChunkWarps];
  wait_for_previous_grid();
  const int warp = threadIdx.x / kWarp;
  chunk_mma_warp(p, selection, chunk_part, fusion_logit,
                 static_cast<int64_t>(blockIdx.x) * kMmaChunkWarps + warp, blockIdx.y, tiles[warp]);
  allow_next_grid();
}

// d35: the tensor-core chunk tile of chunk_mma_warp on four warps (one block per (selected slot i,
// b, g)), so that each warp's chain is a quarter as long: warp w copies key and value rows
// 16w .. 16w + 15 (cp.async, evict-first as d29), scores them (qk_tile on its 16 rows), and the
// heads' maxima meet in shared memory; the block computes the fusion logits (128 threads, one
// round trip). The sums then run in chunk_mma_warp's order, so that the outputs are its bits:
// warp w continues l (per lane, slots in ascending order) and o = P V (the 16-key mma steps in
// ascending order) from warp w - 1 through shared memory, and warp 3 writes the tile. d29's
// chunk tile is one warp of ~1,600 instructions (ncu, session 10) with ~4 warps per SM at B = 8.
constexpr int kQuadChunkWarps = 4;
constexpr int kChunkSelectBatch = 8;  // kept lists per warp and load in d36's chunk tiles
constexpr int kQuadChunkRows = kTileDim / kQuadChunkWarps;  // 16 slots per warp
static_assert(kQuadChunkWarps * kWarp == kFastThreads, "selected_logits_packed runs 128 threads");

struct QuadChunkShared {
  ChunkTiles tile;
  float row_max[kQuadChunkWarps][16];  // each warp's maximum of the 16 A rows (heads)
  float carry[8 * 4 + 2][kWarp];       // o[8][4], l0, l1 of the warp before, per lane
};

// kSelects (d36, where chunks_can_select): every block of the group first selects (the select of
// d35 on the block's four warps, eight sorted kept lists per warp and load, merged by a tree)
// and takes chunk i of it; block i writes slot i of the selection. No select launch.
template <bool kSelects>
__global__ void __launch_bounds__(kQuadChunkWarps * kWarp)
    decode_chunk_mma4_kernel(DecodeParams p, DecodeScratch w) {
  __shared__ __align__(16) QuadChunkShared sh;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int64_t i = blockIdx.x, bg = blockIdx.y;
  wait_for_previous_grid();
  const int64_t b = bg / p.Hkv, g = bg % p.Hkv, first = b * p.Hq + g * p.G;
  const int G = static_cast<int>(p.G), quad = lane % 4, r0 = lane / 4, r1 = r0 + 8;
  float* chunk_part = w.chunk_part;
  float* fusion_logit = w.fusion_logit;
  int32_t c;
  if constexpr (kSelects) {
    __shared__ int32_t chosen[kShortK];
    select_group_short<kQuadChunkWarps * kWarp, kChunkSelectBatch, true>(
        p, w, bg, nullptr, nullptr, false, [&](int slot, int32_t chunk) { chosen[slot] = chunk; });
    __syncthreads();
    c = chosen[i];
    if (threadIdx.x == 0) w.selection[bg * p.K + i] = c;
  } else {
    c = w.selection[bg * p.K + i];
  }
  if (c < 0) {  // -1 padding: an empty softmax (lse -inf, o 0)
    for (int t = threadIdx.x; t < G * (kTileDim + 1); t += blockDim.x) {
      const int j = t / (kTileDim + 1), col = t % (kTileDim + 1);
      chunk_part[((first + j) * p.K + i) * (p.dv + 1) + col] = col == 0 ? kNegInf : 0.0f;
    }
    allow_next_grid();
    return;
  }
  const int64_t lo = static_cast<int64_t>(c) * p.S;
  const int n_rows = static_cast<int>(p.S), row0 = warp * kQuadChunkRows;
  const uint64_t policy = evict_first_policy();
  auto copy_rows = [&](__nv_bfloat16 (*dst)[kTilePitch], const __nv_bfloat16* src) {
    for (int seg = lane; seg < kQuadChunkRows * 8; seg += kWarp) {
      const int row = row0 + seg / 8, col = (seg % 8) * 8;
      const bool valid = row < n_rows;
      cp_async16_policy(&dst[row][col], src + (valid ? row * kTileDim + col : 0), valid, policy);
    }
    cp_async_commit();
  };
  copy_rows(sh.tile.k, p.k + (bg * p.slot_cap + lo) * kTileDim);
  copy_rows(sh.tile.v, p.v + (bg * p.slot_cap + lo) * kTileDim);
  uint32_t qa[4][4];
  load_q_fragments(qa, r0 < G ? p.q + (first + r0) * kTileDim : nullptr,
                   r1 < G ? p.q + (first + r1) * kTileDim : nullptr);
  if (p.summary_key_fp32) selected_logits_packed(p, fusion_logit, c, i, bg);
  cp_async_wait_one();  // this warp's key rows
  __syncwarp();
  // s[t]: chunk_mma_warp's s[2 warp + t] (slots 16 warp + 8 t + 2 quad + e).
  float s[8][4];
  qk_tile(s, qa, sh.tile.k + row0, 2);
  float m0, m1;
  scale_mask_slots<2>(s, row0, quad, n_rows, p.landmarks, p.scale, m0, m1);
  if (quad == 0) sh.row_max[warp][r0] = m0, sh.row_max[warp][r1] = m1;
  __syncthreads();
#pragma unroll
  for (int u = 0; u < kQuadChunkWarps; ++u)
    m0 = fmaxf(m0, sh.row_max[u][r0]), m1 = fmaxf(m1, sh.row_max[u][r1]);
#pragma unroll
  for (int t = 0; t < 2; ++t)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      s[t][e] = exp_diff(s[t][e], m0);
      s[t][2 + e] = exp_diff(s[t][2 + e], m1);
    }
  cp_async_wait_all();  // this warp's value rows
  __syncwarp();
  float o[8][4] = {}, l0 = 0.0f, l1 = 0.0f;
  for (int step = 0; step < kQuadChunkWarps; ++step) {
    if (warp == step) {
      if (step > 0) {
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) o[nt][e] = sh.carry[nt * 4 + e][lane];
        l0 = sh.carry[32][lane], l1 = sh.carry[33][lane];
      }
#pragma unroll
      for (int t = 0; t < 2; ++t)
#pragma unroll
        for (int e = 0; e < 2; ++e) l0 += s[t][e], l1 += s[t][2 + e];
      pv_tile(o, s, sh.tile.v + row0, 1);
      if (step + 1 < kQuadChunkWarps) {
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) sh.carry[nt * 4 + e][lane] = o[nt][e];
        sh.carry[32][lane] = l0, sh.carry[33][lane] = l1;
      }
    }
    if (step + 1 < kQuadChunkWarps) __syncthreads();
  }
  if (warp == kQuadChunkWarps - 1) {
    l0 = quad_sum(l0), l1 = quad_sum(l1);
    write_chunk_rows(p, chunk_part, first, i, G, quad, r0, r1, o, m0, l0, m1, l1);
  }
  allow_next_grid();
}

}  // namespace
}  // namespace detail
}  // namespace hils::gpu
