// The sparse stage's chunk kernels: one chunk's K/V for every (query, head) row that selected it,
// each row's o_c scaled by its weight and added into o16 (16-byte f16x2 reductions). The wgmma
// chunk kernel (chunk_item_v9 in the persistent chunk_attention_persistent_kernel: v30, v35, v36)
// and v21's mma.sync kernel (chunk_attention_f16_kernel), with their helpers (stmatrix_x4,
// pv_tile_packed, fill_row_table, load_panel_async, red_add_f16x8, v9_smem).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "wgmma_common.cuh"
#include "sparse_chunked/common.cuh"

namespace hils::gpu::detail {
namespace {

// Four 8x8 b16 matrices to shared memory (lanes 8i..8i+7 give the row addresses of matrix i;
// each lane's register i holds its fragment of matrix i, as ldmatrix returns it).
__device__ __forceinline__ void stmatrix_x4(void* row, uint32_t r0, uint32_t r1, uint32_t r2,
                                            uint32_t r3) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
               "r"(r0), "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}

__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

__device__ __forceinline__ float ex2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// o += P . V_tile with P as bf16 A fragments (pv_tile of mma_common.cuh, which packs P itself).
// The several 16-row slices per call (chunk_attention_v6_kernel's kSub) went in session 17
// (gpu/NOTES.md "Kernels removed in session 17"); the scores side is mma_common.cuh's qk_tile.
__device__ __forceinline__ void pv_tile_packed(float (&o)[8][4], const uint32_t (&pa)[4][4],
                                               const __nv_bfloat16 (*vs_tile)[kTilePitch]) {
  const int lane = threadIdx.x % kWarp;
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) {
    const __nv_bfloat16* row = vs_tile[16 * ks + lane % 8 + 8 * ((lane / 8) % 2)] + 8 * (lane / 16);
#pragma unroll
    for (int np = 0; np < 4; ++np) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, row + 16 * np);
      mma_16816(o[2 * np], pa[ks], b[0], b[1]);
      mma_16816(o[2 * np + 1], pa[ks], b[2], b[3]);
    }
  }
}

// A chunk kernel's row table: row rr is head g G + rr % G of the item's pair rr / G; row_q holds
// its q element offset (-1 past the item's pairs), row_out its scratch row (h seg + tl) K + slot
// (the partials' row of the removed chunked_v6-v9; written, not read).
// kEntryWords: the bucket's words per entry (chunked_v30: the pair records', the entry first).
template <int G, int kEntryWords>
__device__ __forceinline__ void fill_row_table(int64_t* row_q, uint32_t* row_out, int n_rows,
                                               const LaunchParams& p, int64_t t0, int64_t seg,
                                               const ItemDesc& desc, const uint32_t* bucket,
                                               int64_t g) {
  for (int rr = threadIdx.x; rr < n_rows; rr += kPackedThreads) {
    const int e = rr / G;
    const int64_t h = g * G + rr % G;
    if (e < desc.count) {
      const uint32_t entry = bucket[(static_cast<int64_t>(desc.first) + e) * kEntryWords];
      const int64_t tl = entry >> 6;
      row_q[rr] = (h * p.T + t0 + tl) * kTileDim;
      row_out[rr] = static_cast<uint32_t>((h * seg + tl) * p.K + (entry & 63u));
    } else {
      row_q[rr] = -1;
    }
  }
}

// The wgmma chunk kernel (chunked_v9 on; chunked_v30, v35, v36). The block (one warpgroup) runs
// 64-row steps: S = Q K^T with Q (the step's 64 q rows) and K from 128-byte-swizzled
// shared-memory panels, P = softmax in registers (each warp's 16 rows: the accumulator of warp w
// is the mma.sync C fragment of rows 16 w ..), O = P V with P from registers and V as the N-major
// B panel. No ldmatrix: the tensor cores read q, K and V from shared memory themselves. The step's
// q rows come by cp.async into one of two swizzled stages (the next step's while this one
// computes); the fp16 results leave through the same stage (stmatrix, 16-byte reductions).
constexpr int kV9Panel = 64 * wg::kPanelRowBytes;  // bytes of a 64-row panel
constexpr int kV9SmemBytes = wg::kAtomBytes + 4 * kV9Panel;  // K, V, 2 q stages, alignment slack

// Rows [row0, row0 + 64) of a [rows, 64] bf16 matrix into a swizzled panel (cp.async, 128
// threads).
__device__ __forceinline__ void load_panel_async(unsigned char* panel, const __nv_bfloat16* src,
                                                 int64_t row0) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int piece = threadIdx.x + kPackedThreads * j, row = piece / 8, col = (piece % 8) * 8;
    cp_async16(panel + wg::sw128_offset(row, col), src + (row0 + row) * kTileDim + col, true);
  }
}

// Eight halves at o (16-byte aligned) += v (chunked_v10 on): one 16-byte reduction on sm_90
// (ptxas refuses .v8), four half2 atomics below.
__device__ __forceinline__ void red_add_f16x8(__half* o, uint4 v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.noftz.v4.f16x2 [%0], {%1, %2, %3, %4};\n" ::"l"(o), "r"(v.x),
               "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
#else
  const uint32_t parts[4] = {v.x, v.y, v.z, v.w};
  for (int i = 0; i < 4; ++i)
    atomicAdd(reinterpret_cast<__half2*>(o) + i, *reinterpret_cast<const __half2*>(&parts[i]));
#endif
}

// One item of chunk_attention_persistent_kernel: chunk c of group g and its pairs desc, with the
// dynamic shared memory `smem` (1024-byte aligned), two q stages (the next step's rows stream in
// while this one computes). records: the segment's pair records (PairWeights::f16_records: the
// entry, then the G weights in fp16). Each row is scaled by its weight over its softmax sum, then
// added into o16 at the row's q offset by 8 f16x2 reductions of 16 bytes per row from the
// consumed q stage.
template <int G>
__device__ __forceinline__ void chunk_item_v9(const LaunchParams& p, int64_t t0, int64_t seg, int64_t nc,
                                              const ItemDesc& desc, const uint32_t* records, __half* o16,
                                              unsigned char* smem) {
  constexpr int kRows = pairs_per_item<G>() * G;  // 512
  unsigned char* k_panel = smem;
  unsigned char* v_panel = smem + kV9Panel;
  unsigned char* q_stages = smem + 2 * kV9Panel;  // 2 stages, kV9Panel bytes apart
  __shared__ int64_t row_q[kRows];     // q element offset of the row; -1 past the pairs
  __shared__ uint32_t row_out[kRows];  // fill_row_table's (not read)
  const int64_t g = desc.chunk / nc, c = desc.chunk % nc;
  const int n_steps = (desc.count * G + 63) / 64;
  load_panel_async(k_panel, static_cast<const __nv_bfloat16*>(p.k) + g * p.T * kTileDim, c * kTileDim);
  load_panel_async(v_panel, static_cast<const __nv_bfloat16*>(p.v) + g * p.T * kTileDim, c * kTileDim);
  cp_async_commit();
  constexpr int kEntryWords = pair_record_words<G>();
  __shared__ float row_weight[kRows];  // w_c / l of the row
  fill_row_table<G, kEntryWords>(row_q, row_out, 64 * n_steps, p, t0, seg, desc, records, g);
  for (int rr = threadIdx.x; rr < 64 * n_steps; rr += kPackedThreads) {
    const auto* weights = reinterpret_cast<const __half*>(records + (static_cast<int64_t>(desc.first) + rr / G) *
                                                                        kEntryWords + 1);
    row_weight[rr] = rr < desc.count * G ? __half2float(weights[rr % G]) : 0.0f;
  }
  __syncthreads();  // the row table

  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const auto* q = static_cast<const __nv_bfloat16*>(p.q);
  // The step's 64 q rows -> a stage (zeros past the pairs); thread t copies pieces t + 128 j.
  auto issue_q = [&](int s, unsigned char* stage) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int piece = threadIdx.x + kPackedThreads * j, row = piece / 8, col = (piece % 8) * 8;
      const int64_t off = row_q[64 * s + row];
      cp_async16(stage + wg::sw128_offset(row, col), q + (off >= 0 ? off + col : 0), off >= 0);
    }
    cp_async_commit();
  };
  const uint64_t k_desc = wg::desc_k_major(k_panel);
  const uint64_t v_desc = wg::desc_n_major(v_panel, kV9Panel);
  // Base-2 softmax as the mma.sync kernel's (c = scale log2 e > 0), the landmark key (column 63)
  // masked.
  const float c2 = p.scale * 1.4426950408889634f;
  const bool mask_landmark = p.landmarks && lane % 4 == 3;
  const int row_in_step = 16 * warp + lane % 8 + 8 * ((lane / 8) % 2);  // stmatrix row address
  issue_q(0, q_stages);
  for (int s = 0; s < n_steps; ++s) {
    unsigned char* stage = q_stages + (s & 1) * kV9Panel;
    cp_async_wait_all();  // this step's q (and, at s = 0, K and V)
    wg::fence_proxy_async();
    __syncthreads();  // q visible to the tensor cores; every warp is done with the stage refilled now
    if (s + 1 < n_steps) issue_q(s + 1, q_stages + ((s + 1) & 1) * kV9Panel);
    float sc[8][4];
    const uint64_t q_desc = wg::desc_k_major(stage);
    wg::fence();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks)
      wg::mma_ss<false>(sc, wg::desc_advance(q_desc, 32 * ks), wg::desc_advance(k_desc, 32 * ks),
                        ks > 0);
    wg::commit();
    wg::wait<0>();
    wg::fence_operands(sc);
    if (mask_landmark) sc[7][1] = sc[7][3] = kNegInf;
    float row_max[2] = {kNegInf, kNegInf};
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) row_max[e / 2] = fmaxf(row_max[e / 2], sc[nt][e]);
    float neg_max[2], row_sum[2] = {0.0f, 0.0f}, inv[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) neg_max[r] = -quad_max(row_max[r]) * c2;  // finite: 63 keys
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        sc[nt][e] = ex2_approx(fmaf(sc[nt][e], c2, neg_max[e / 2]));  // -inf -> 0
        row_sum[e / 2] += sc[nt][e];
      }
#pragma unroll
    for (int r = 0; r < 2; ++r)  // the row's fusion weight over its sum
      inv[r] = row_weight[64 * s + 16 * warp + lane / 4 + 8 * r] / quad_sum(row_sum[r]);
    uint32_t pa[4][4];
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      pa[ks][0] = pack_bf16(sc[2 * ks][0], sc[2 * ks][1]);
      pa[ks][1] = pack_bf16(sc[2 * ks][2], sc[2 * ks][3]);
      pa[ks][2] = pack_bf16(sc[2 * ks + 1][0], sc[2 * ks + 1][1]);
      pa[ks][3] = pack_bf16(sc[2 * ks + 1][2], sc[2 * ks + 1][3]);
    }
    float oc[8][4];
    wg::fence();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks)
      wg::mma_rs<true>(oc, pa[ks], wg::desc_advance(v_desc, 16 * wg::kPanelRowBytes * ks), ks > 0);
    wg::commit();
    wg::wait<0>();
    wg::fence_operands(oc);
    // The normalised rows as fp16 into the stage (the tensor cores are done with its q), the
    // warp's own 16 rows, then 16-byte reductions of those rows.
#pragma unroll
    for (int nt = 0; nt < 8; nt += 2)
      stmatrix_x4(stage + wg::sw128_offset(row_in_step, 8 * nt + 8 * (lane / 16)),
                  pack_half2(oc[nt][0] * inv[0], oc[nt][1] * inv[0]),
                  pack_half2(oc[nt][2] * inv[1], oc[nt][3] * inv[1]),
                  pack_half2(oc[nt + 1][0] * inv[0], oc[nt + 1][1] * inv[0]),
                  pack_half2(oc[nt + 1][2] * inv[1], oc[nt + 1][3] * inv[1]));
    __syncwarp();
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int row = 16 * warp + lane / 8 + 4 * j, col = (lane % 8) * 8, rr = 64 * s + row;
      if (row_q[rr] < 0) continue;
      const uint4 x = *reinterpret_cast<const uint4*>(stage + wg::sw128_offset(row, col));
      red_add_f16x8(o16 + row_q[rr] + col, x);
    }
  }
}

// The dynamic shared memory of the wgmma chunk kernel, on 1024-byte boundaries (the swizzle's atom).
__device__ __forceinline__ unsigned char* v9_smem() {
  extern __shared__ __align__(16) unsigned char dynamic_smem[];
  return reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(dynamic_smem) + wg::kAtomBytes - 1) &
                                          ~static_cast<uintptr_t>(wg::kAtomBytes - 1));
}

// chunked_v26 on: the wgmma chunk kernel's items taken by a grid of as many blocks as fit on the
// device at once, each taking its next item from the segment's cursor (an atomicAdd, issued at
// the start of the current item and read after it), until the segment's n_items are taken. No
// block for an item that does not exist (a block per item's grid is the bound Hkv seg K / pairs +
// Hkv nc, ~40% above the items at 512K) and no block launch per item. records: chunk_item_v9's.
// kChained: chunked_v35 (wait_previous_then_allow_next).
template <int G, bool kChained = false>
__global__ void __launch_bounds__(kPackedThreads, 4)
    chunk_attention_persistent_kernel(LaunchParams p, int64_t t0, int64_t seg, int64_t nc,
                                      const int32_t* items, const ItemDesc* item_desc,
                                      const uint32_t* records, __half* o16, int32_t* item_cursor) {
  wait_previous_then_allow_next<kChained>();
  __shared__ int32_t next_item;
  const int32_t n_items = items[p.Hkv * nc];
  if (threadIdx.x == 0) next_item = atomicAdd(item_cursor, 1);
  __syncthreads();
  unsigned char* smem = v9_smem();
  for (;;) {
    const int32_t item = next_item;  // every thread reads it before the item's first barrier
    if (item >= n_items) return;
    const ItemDesc desc = item_desc[item];
    int32_t next = 0;
    if (threadIdx.x == 0) next = atomicAdd(item_cursor, 1);  // awaited only after this item
    chunk_item_v9<G>(p, t0, seg, nc, desc, records, o16, smem);
    if (threadIdx.x == 0) next_item = next;
    __syncthreads();  // next_item visible; every warp done with the panels, stages and row tables
  }
}

// chunked_v21's chunk kernel (mma.sync; chunked_v10, v11's): one block per item descriptor, its
// rows (pair x head) first turned into their q element offsets (= their o16 offsets) and weights
// in shared memory, the weights w_c / l in bucket order from pair_weight (written by
// fusion_pair_weights_kernel). A warp step is one 16-row slice (the q rows by cp.async into one of
// the warp's two stages, the next slice's while this one computes); each row is scaled by its
// weight over its softmax sum before its fp16 rounding and added into o16 (f16x2 reductions).
template <int G>
__global__ void __launch_bounds__(kPackedThreads, 5)
    chunk_attention_f16_kernel(LaunchParams p, int64_t t0, int64_t seg, int64_t nc,
                               const int32_t* items, const ItemDesc* item_desc,
                               const uint32_t* bucket, const float* pair_weight, __half* o16) {
  constexpr int kRows = pairs_per_item<G>() * G;  // 512
  extern __shared__ __align__(16) unsigned char dynamic_smem[];
  auto* q_stage = reinterpret_cast<__nv_bfloat16(*)[2][16][kTilePitch]>(dynamic_smem);
  __shared__ __align__(16) __nv_bfloat16 ks_tile[kTileDim][kTilePitch];
  __shared__ __align__(16) __nv_bfloat16 vs_tile[kTileDim][kTilePitch];
  __shared__ int64_t row_q[kRows];   // q element offset of the row (= its o16 offset); -1 past
  __shared__ float row_weight[kRows];  // w_c / l of the row
  const int32_t item = static_cast<int32_t>(blockIdx.x);
  const int32_t n_items = items[p.Hkv * nc];
  const ItemDesc desc = item_desc[item];
  if (item >= n_items) return;
  const int64_t g = desc.chunk / nc, c = desc.chunk % nc;
  const int n_pairs = desc.count, n_steps = (n_pairs * G + 15) / 16;
  load_tile_async(ks_tile, static_cast<const __nv_bfloat16*>(p.k) + g * p.T * kTileDim, c * kTileDim, p.T);
  load_tile_async(vs_tile, static_cast<const __nv_bfloat16*>(p.v) + g * p.T * kTileDim, c * kTileDim, p.T);
  cp_async_commit();
  for (int rr = threadIdx.x; rr < 16 * n_steps; rr += kPackedThreads) {
    const int e = rr / G;
    const int64_t h = g * G + rr % G;
    if (e < n_pairs) {
      const uint32_t entry = bucket[desc.first + e];
      const int64_t tl = entry >> 6, t = t0 + tl;
      row_q[rr] = (h * p.T + t) * kTileDim;
      row_weight[rr] = pair_weight[static_cast<int64_t>(desc.first) * G + rr];
    } else {
      row_q[rr] = -1;
      row_weight[rr] = 0.0f;
    }
  }
  cp_async_wait_all();
  __syncthreads();

  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int col = (lane % 8) * 8;
  const auto* q = static_cast<const __nv_bfloat16*>(p.q) + col;
  auto issue_q = [&](int s, int buf) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t off = row_q[16 * s + lane / 8 + 4 * j];
      cp_async16(&q_stage[warp][buf][lane / 8 + 4 * j][col], q + (off >= 0 ? off : 0), off >= 0);
    }
    cp_async_commit();
  };
  const float c2 = p.scale * 1.4426950408889634f;
  const bool mask_landmark = p.landmarks && lane % 4 == 3;
  if (warp < n_steps) issue_q(warp, 0);
  int it = 0;
  for (int s = warp; s < n_steps; s += kWarpsPerBlock, ++it) {
    const int buf = it & 1;
    if (s + kWarpsPerBlock < n_steps) {
      issue_q(s + kWarpsPerBlock, buf ^ 1);
      cp_async_wait_one();
    } else {
      cp_async_wait_all();
    }
    __syncwarp();
    __nv_bfloat16(*stage)[kTilePitch] = q_stage[warp][buf];
    __nv_bfloat16* frag_row = stage[lane % 8 + 8 * ((lane / 8) % 2)] + 8 * (lane / 16);
    uint32_t qa[4][4];
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) ldmatrix_x4(qa[ks], frag_row + 16 * ks);
    float sc[8][4];
    qk_tile(sc, qa, ks_tile);
    if (mask_landmark) sc[7][1] = sc[7][3] = kNegInf;
    float row_max[2] = {kNegInf, kNegInf};
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) row_max[e / 2] = fmaxf(row_max[e / 2], sc[nt][e]);
    float neg_max[2], row_sum[2] = {0.0f, 0.0f}, scale[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) neg_max[r] = -quad_max(row_max[r]) * c2;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        sc[nt][e] = ex2_approx(fmaf(sc[nt][e], c2, neg_max[e / 2]));
        row_sum[e / 2] += sc[nt][e];
      }
#pragma unroll
    for (int r = 0; r < 2; ++r)
      scale[r] = row_weight[16 * s + lane / 4 + 8 * r] / quad_sum(row_sum[r]);
    uint32_t pa[4][4];
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      pa[ks][0] = pack_bf16(sc[2 * ks][0], sc[2 * ks][1]);
      pa[ks][1] = pack_bf16(sc[2 * ks][2], sc[2 * ks][3]);
      pa[ks][2] = pack_bf16(sc[2 * ks + 1][0], sc[2 * ks + 1][1]);
      pa[ks][3] = pack_bf16(sc[2 * ks + 1][2], sc[2 * ks + 1][3]);
    }
    float oc[8][4] = {};
    pv_tile_packed(oc, pa, vs_tile);
    __syncwarp();
#pragma unroll
    for (int nt = 0; nt < 8; nt += 2)
      stmatrix_x4(frag_row + 8 * nt,
                  pack_half2(oc[nt][0] * scale[0], oc[nt][1] * scale[0]),
                  pack_half2(oc[nt][2] * scale[1], oc[nt][3] * scale[1]),
                  pack_half2(oc[nt + 1][0] * scale[0], oc[nt + 1][1] * scale[0]),
                  pack_half2(oc[nt + 1][2] * scale[1], oc[nt + 1][3] * scale[1]));
    __syncwarp();
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int rr = 16 * s + lane / 8 + 4 * j;
      if (row_q[rr] >= 0)
        red_add_f16x8(o16 + row_q[rr] + col,
                      *reinterpret_cast<const uint4*>(&stage[lane / 8 + 4 * j][col]));
    }
    __syncwarp();
  }
}

}  // namespace
}  // namespace hils::gpu::detail
