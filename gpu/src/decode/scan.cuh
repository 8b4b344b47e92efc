// Stages 1 and 2 of the decode step, the scan of the cache: the window tiles, the summary element
// types (Bf16Summary, Fp8Summary, Int4Summary), the scan's loads (ScanLoads), d39's int4 dots on
// the tensor cores, the score tiles, d5's window and score kernels, and the fused step's launch 1
// (fused_window_score_kernel: both stages in one grid, DecodeKernel::fused and d29-d40).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "mma_common.cuh"
#include "decode/tiles.cuh"

namespace hils::gpu {
namespace detail {
namespace {

// ---- 1. window tiles: one block (128 threads) per (tile, b, g) ----------------------------
template <bool kEarly>
__device__ void window_tile(const DecodeParams& p, bool fast, bool staged, float* win_part,
                            int64_t tile, int64_t bg, float* smem) {
  const int64_t lo = p.win_lo + tile * kDecodeTileSlots;
  const int64_t hi = min(p.T - 1, lo + kDecodeTileSlots - 1);
  const int lane = threadIdx.x % kWarp;
  if (fast) {
    fast_tile_softmax<kEarly>(p, bg, lo, hi, smem, [&](int64_t item, float m, float l, int dim, float o) {
      float* out = win_part + (item * p.n_win_tiles + tile) * (p.dv + 2);
      if (dim == 0) out[0] = m, out[1] = l;
      out[2 + dim] = o;
    });
    return;
  }
  group_tile_softmax(p, bg, lo, hi, kDecodeTileSlots, staged, smem,
                     [&](int64_t item, const WarpSoftmax& st) {
                       float* out = win_part + (item * p.n_win_tiles + tile) * (p.dv + 2);
                       if (lane == 0) out[0] = st.m, out[1] = st.l;
#pragma unroll
                       for (int r = 0; r < kDimRegs; ++r) {
                         const int dim = lane + kWarp * r;
                         if (dim < p.dv) out[2 + dim] = st.o[r];
                       }
                     });
}

__global__ void decode_window_kernel(DecodeParams p, bool fast, bool staged, float* win_part) {
  extern __shared__ float smem[];
  window_tile<false>(p, fast, staged, win_part, blockIdx.x, blockIdx.y, smem);
}

// Summary element types: a 16-byte load holds kPerLoad values, widened to fp32 exactly; an Elem
// holds kPerElem values (a row of d values is d / kPerElem Elems); widen_at(row, i) widens value i.
struct Bf16Summary {
  using Elem = __nv_bfloat16;
  static constexpr int kPerLoad = 8;
  static constexpr int kPerElem = 1;
  __device__ static void widen(const uint4& u, float* out) {
    const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 f = __bfloat1622float2(pairs[j]);
      out[2 * j] = f.x, out[2 * j + 1] = f.y;
    }
  }
  __device__ static float widen_at(const Elem* row, int i) { return __bfloat162float(row[i]); }
};
struct Fp8Summary {
  using Elem = __nv_fp8_storage_t;
  static constexpr int kPerLoad = 16;
  static constexpr int kPerElem = 1;
  __device__ static void widen(const uint4& u, float* out) {
    const __nv_fp8x2_storage_t* pairs = reinterpret_cast<const __nv_fp8x2_storage_t*>(&u);
#pragma unroll
    for (int j = 0; j < 8; ++j) {  // e4m3 -> f16 is exact (hardware cvt on sm_89+)
      const float2 f = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(pairs[j], __NV_E4M3)));
      out[2 * j] = f.x, out[2 * j + 1] = f.y;
    }
  }
  __device__ static float widen_at(const Elem* row, int i) {
    return __half2float(__half(__nv_cvt_fp8_to_halfraw(row[i], __NV_E4M3)));
  }
};
// int4 (SummaryType::int4): value i of a row is the code n in [-7, 7] stored as n + 8 in the low
// (i even) or high (i odd) nibble of byte i / 2; the row's scale s multiplies the dot product.
struct Int4Summary {
  using Elem = uint8_t;
  static constexpr int kPerLoad = 32;
  static constexpr int kPerElem = 2;
  // Nibbles k and k + 4 of a word as the halves 1024 + (n + 8) (0x6400 | nibble), less 1032:
  // exact, as is the widening to fp32.
  __device__ static void widen(const uint4& u, float* out) {
    const uint32_t words[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int w = 0; w < 4; ++w)
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const uint32_t bits = ((words[w] >> (4 * k)) & 0x000f000fu) | 0x64006400u;
        const float2 f = __half22float2(
            __hsub2(*reinterpret_cast<const __half2*>(&bits), __halves2half2(__ushort_as_half(0x6408),
                                                                              __ushort_as_half(0x6408))));
        out[8 * w + k] = f.x, out[8 * w + k + 4] = f.y;
      }
  }
  __device__ static float widen_at(const Elem* row, int i) {
    return static_cast<float>(static_cast<int>((row[i / 2] >> (4 * (i % 2))) & 0xf) - 8);
  }
};

// q~ . row for one stored chunk row; `vectorised` rows are 16-byte aligned, d % kPerLoad == 0.
template <class Summary>
__device__ __forceinline__ float score_row(const float* q, const typename Summary::Elem* row,
                                           int d, bool vectorised) {
  constexpr int kPer = Summary::kPerLoad;
  float acc = 0.0f;
  if (vectorised) {
    const uint4* r4 = reinterpret_cast<const uint4*>(row);
    for (int i = 0; i < d / kPer; ++i) {
      float f[kPer];
      Summary::widen(__ldg(r4 + i), f);
#pragma unroll
      for (int j = 0; j < kPer; ++j) acc = fmaf(q[kPer * i + j], f[j], acc);
    }
  } else {
    for (int i = 0; i < d; ++i) acc = fmaf(q[i], Summary::widen_at(row, i), acc);
  }
  return acc;
}

// How the score tiles load the summary rows, b' and the row scales: the stream that launch 1 reads
// once (77.6 MB at B = 8, 512K fp8; 304 MB at B = 32) and that thrashes the 50 MB L2 for the tails'
// code and launch 1's own outputs (gpu/NOTES.md "decode", d23). `plain` (d5's score launch):
// __ldg; `streaming` (d25 on, the fused kernel): ld.global.cs (__ldcs), which PTX defines as
// evict-first allocation in L1 and L2. The bytes and the arithmetic are the same in both (d24's
// L2 cache-policy operand, the third way, was removed in session 17: gpu/NOTES.md).
enum class ScanLoads { plain, streaming };

template <ScanLoads kLoads>
__device__ __forceinline__ uint4 scan_load(const uint4* p) {
  if constexpr (kLoads == ScanLoads::streaming) return __ldcs(p);
  return __ldg(p);
}

template <ScanLoads kLoads>
__device__ __forceinline__ float scan_load(const float* p) {
  if constexpr (kLoads == ScanLoads::streaming) return __ldcs(p);
  return __ldg(p);
}

// ---- d39: the int4 score tile's dot products on the tensor cores (gpu/NOTES.md "d39") ----
// One mma.sync m16n8k16 (bf16 in, fp32 accumulate) takes 16 chunks x 16 dimensions: A's row g is
// chunk X = 16 i + g of the warp's share, row g + 8 chunk Y = X + 8 (g = lane / 4), and lane
// (g, t = lane % 4) holds bytes 8t .. 8t + 7 of both rows (dimensions 16t .. 16t + 15, two
// 8-byte loads: u.x, u.y of X, u.z, u.w of Y). Word w of those bytes holds dimensions
// 16t + 8w + n in its nibble n; the pair (nibble n, nibble n + 4) becomes one bf16x2 register.
// mma j = 2w + s takes pairs n = s (k slots 2t, 2t + 1) and n = s + 2 (slots 2t + 8, 2t + 9) of
// word w, so B (q~, the same in all 8 columns) holds q~ at dimensions 16t + 8w + s + {0, 4} and
// + {2, 6} in lane t's slots; four mmas cover the 64 dimensions. The products are exact (a bf16
// q~ times a code in [-8, 7]); the sums are the tensor core's, not d36's fma chain.

// Nibbles n and n + 4 of `word` as the bf16 pair (code, code): 0x4300 | nibble is 128 + nibble
// exactly, less 136 is the code nibble - 8 exactly.
__device__ __forceinline__ uint32_t int4_code_pair(uint32_t word, int n) {
  const uint32_t biased = ((word >> (4 * n)) & 0x000f000fu) | 0x43004300u;
  uint32_t code;
  asm("sub.rn.bf16x2 %0, %1, %2;" : "=r"(code) : "r"(biased), "r"(0x43084308u));
  return code;
}

// The B fragments of the four mmas for lane t from the bf16 query q~ (`qr`, d = 64).
__device__ __forceinline__ void int4_query_fragments(const __nv_bfloat16* qr, int t,
                                                     uint32_t (&qb)[4][2]) {
  const unsigned short* q = reinterpret_cast<const unsigned short*>(qr) + 16 * t;
  auto at = [&](int i) { return static_cast<uint32_t>(__ldg(q + i)); };
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int first = 8 * (j / 2) + j % 2;
    qb[j][0] = at(first) | at(first + 4) << 16;
    qb[j][1] = at(first + 2) | at(first + 6) << 16;
  }
}

// The dots of chunks X (c[0]) and Y (c[2]) from lane (g, t)'s bytes of both rows (u).
__device__ __forceinline__ void int4_mma_dots(const uint4& u, const uint32_t (&qb)[4][2],
                                              float (&c)[4]) {
  const uint32_t x[2] = {u.x, u.y}, y[2] = {u.z, u.w};
  c[0] = c[1] = c[2] = c[3] = 0.0f;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int w = j / 2, s = j % 2;
    const uint32_t a[4] = {int4_code_pair(x[w], s), int4_code_pair(y[w], s),
                           int4_code_pair(x[w], s + 2), int4_code_pair(y[w], s + 2)};
    mma_16816(c, a, qb[j][0], qb[j][1]);
  }
}

// ---- 2. score tiles: 256 chunks per tile, one block (kWarps warps) per (tile, b, h) --------
// d = 64 (`coalesced`): 16-byte lanes cover one chunk's row (8 lanes for a 128-byte bf16 row, 4
// for a 64-byte fp8 row), so a warp load covers 512 contiguous bytes; every load of a warp's
// share of the tile is issued before the first use (bytes in flight); a short shuffle sums the
// partial dots. Other d: one thread per chunk. Writes s_hat and the tile's (max, sum exp).
constexpr int kCoalescedDim = 64;
// kEarly (the fused kernel): every global load of the tile (its rows, b' and the fp8 scales)
// is issued before q~ is staged, so that a block waits for one memory round trip, not three
// (d5, kEarly false, stages q~ first and reads b' after the dot). kTiles (kEarly only): the
// block scores tiles first_tile .. first_tile + kTiles - 1 of `item` (those below
// n_score_tiles), every tile's loads issued before the first is scored (d34: two, so that a
// block has twice the bytes in flight); each tile's arithmetic is the one-tile block's.
// kMma (d39, int4, coalesced only): the dots by int4_mma_dots, each lane loading 8 bytes of two
// rows per step (the same 16 bytes per lane and step as the widening path's one row).
// kPair (d40, int4_h summaries): each chunk's scale and b' come from one __half2 (s16, b'16) of
// summary_scale_bias, 4 bytes in place of the two fp32 arrays' 8 (gpu/NOTES.md "d40").
template <class Summary, int kWarps, bool kEarly, ScanLoads kLoads = ScanLoads::plain, int kTiles = 1,
          bool kMma = false, bool kPair = false>
__device__ void score_tile(const DecodeParams& p, int64_t item, int64_t first_tile, bool vectorised,
                           bool coalesced, float* q, float* scores, float2* score_part) {
  static_assert(kTiles == 1 || kEarly, "several tiles per block only with their loads issued early");
  static_assert(!kMma || (kEarly && kLoads == ScanLoads::streaming &&
                          std::is_same<Summary, Int4Summary>::value && kWarps * 64 == kScoreThreads),
                "d39's mma dots: int4, streaming loads issued early, 64 chunks per warp");
  static_assert(!kPair || (kEarly && kLoads == ScanLoads::streaming &&
                           std::is_same<Summary, Int4Summary>::value),
                "d40's (s16, b'16) pairs: int4_h, streaming loads issued early");
  constexpr int kThreads = kWarps * kWarp;
  constexpr int kLanesPerRow = kCoalescedDim / Summary::kPerLoad;
  constexpr int kRowsPerStep = kWarp / kLanesPerRow;
  constexpr int kSteps = kScoreThreads / kRowsPerStep / kWarps;
  constexpr int kPerThread = kScoreThreads / kThreads;
  __shared__ float red[kWarps];
  __shared__ float tile_scores[kScoreThreads];
  const int d = static_cast<int>(p.d);
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int64_t row_elems = p.d / Summary::kPerElem;
  const auto* keys = static_cast<const typename Summary::Elem*>(p.summary_key) + item * p.chunk_cap * row_elems;
  const int part = lane % kLanesPerRow;
  const uint4* rows = reinterpret_cast<const uint4*>(keys);
  uint4 u[kTiles][kSteps];
  auto load_rows = [&](int t) {
    const int64_t tile_first = (first_tile + t) * kScoreThreads;
    if constexpr (kMma) {  // step i: chunks X = 64 warp + 16 i + lane / 4 and Y = X + 8
      const uint2* rows8 = reinterpret_cast<const uint2*>(keys);
#pragma unroll
      for (int step = 0; step < kSteps; ++step) {
        const int64_t x = tile_first + warp * 64 + step * 16 + lane / 4, y = x + 8;
        const uint2 zero = make_uint2(0, 0);
        const uint2 ux = x < p.n_cand ? __ldcs(rows8 + x * 4 + lane % 4) : zero;
        const uint2 uy = y < p.n_cand ? __ldcs(rows8 + y * 4 + lane % 4) : zero;
        u[t][step] = make_uint4(ux.x, ux.y, uy.x, uy.y);
      }
    } else {
#pragma unroll
      for (int step = 0; step < kSteps; ++step) {
        const int64_t cc = tile_first + warp * (kSteps * kRowsPerStep) + step * kRowsPerStep +
                           lane / kLanesPerRow;
        u[t][step] = cc < p.n_cand ? scan_load<kLoads>(rows + cc * kLanesPerRow + part)
                                   : make_uint4(0, 0, 0, 0);
      }
    }
  };
  // b' and the row scale of the chunks thread t owns (tile_first + t, + kThreads, ...).
  float bias[kTiles][kPerThread], row_scale[kTiles][kPerThread];
  auto load_bias = [&](int t) {
    const int64_t tile_first = (first_tile + t) * kScoreThreads;
#pragma unroll
    for (int r = 0; r < kPerThread; ++r) {
      const int64_t c = tile_first + threadIdx.x + r * kThreads, row = item * p.chunk_cap + c;
      if constexpr (kPair) {  // one 4-byte load: (s16, b'16), both exact in fp32
        const __half2 pair = c < p.n_cand ? __ldcs(p.summary_scale_bias + row)
                                          : __halves2half2(__ushort_as_half(0x3c00), __ushort_as_half(0));
        row_scale[t][r] = __low2float(pair), bias[t][r] = __high2float(pair);
        continue;
      }
      bias[t][r] = c < p.n_cand ? scan_load<kLoads>(p.summary_bias + row) : 0.0f;
      row_scale[t][r] =
          c < p.n_cand && p.summary_scale ? scan_load<kLoads>(p.summary_scale + row) : 1.0f;
    }
  };
  if (kEarly) {
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
      if (coalesced) load_rows(t);
      load_bias(t);
    }
  }
  const __nv_bfloat16* qr = p.q_retrieval + item * p.d;
  uint32_t qb[4][2];
  if constexpr (kMma) {
    int4_query_fragments(qr, lane % 4, qb);
  } else {
    for (int i = threadIdx.x; i < d; i += kThreads) q[i] = __bfloat162float(qr[i]);
    __syncthreads();
  }
#pragma unroll
  for (int t = 0; t < kTiles; ++t) {
    const int64_t tile = first_tile + t;
    if (tile >= p.n_score_tiles) break;  // the same for every thread of the block
    if (t > 0) __syncthreads();           // red and tile_scores are the previous tile's until here
    const int64_t tile_first = tile * kScoreThreads;
    if constexpr (kMma) {
#pragma unroll
      for (int step = 0; step < kSteps; ++step) {
        float c[4];
        int4_mma_dots(u[t][step], qb, c);
        const int x = warp * 64 + step * 16 + lane / 4;
        if (lane % 4 == 0) tile_scores[x] = c[0], tile_scores[x + 8] = c[2];
      }
      __syncthreads();
    } else if (coalesced) {
      float qp[Summary::kPerLoad];
#pragma unroll
      for (int j = 0; j < Summary::kPerLoad; ++j) qp[j] = q[Summary::kPerLoad * part + j];
      if (!kEarly) load_rows(t);
#pragma unroll
      for (int step = 0; step < kSteps; ++step) {
        float f[Summary::kPerLoad];
        Summary::widen(u[t][step], f);
        float acc = 0.0f;
#pragma unroll
        for (int j = 0; j < Summary::kPerLoad; ++j) acc = fmaf(qp[j], f[j], acc);
#pragma unroll
        for (int off = 1; off < kLanesPerRow; off *= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
        if (part == 0)
          tile_scores[warp * (kSteps * kRowsPerStep) + step * kRowsPerStep + lane / kLanesPerRow] = acc;
      }
      __syncthreads();
    }
    if (!kEarly) load_bias(t);
    // Thread t owns chunks tile_first + t, + kThreads, ...
    float s[kPerThread];
    float m = kNegInf;
#pragma unroll
    for (int r = 0; r < kPerThread; ++r) {
      const int local = threadIdx.x + r * kThreads;
      const int64_t c = tile_first + local;
      s[r] = kNegInf;
      if (c < p.n_cand) {
        const float dot = coalesced ? tile_scores[local]
                                    : score_row<Summary>(q, keys + c * row_elems, d, vectorised);
        s[r] = p.scale * row_scale[t][r] * dot + bias[t][r];
        // A non-finite score (a row its quantizer marked, a NaN b', an infinite bf16 row) is
        // NaN: the tile's sum exp below becomes NaN, which the fuse reads (group_poisoned).
        if (!isfinite(s[r])) s[r] = kNaN;
      }
      if (c < p.n_chunks) scores[item * p.n_chunks + c] = s[r];
      m = fmaxf(m, s[r]);
    }
    // The tile's (max, sum exp(s - max)) for log Z_hat.
    m = warp_max(m);
    if (lane == 0) red[warp] = m;
    __syncthreads();
    m = kNegInf;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) m = fmaxf(m, red[w]);
    __syncthreads();
    float l = 0.0f;
#pragma unroll
    for (int r = 0; r < kPerThread; ++r) l += exp_diff(s[r], m);
    l = warp_sum(l);
    if (lane == 0) red[warp] = l;
    __syncthreads();
    if (threadIdx.x == 0) {
      l = 0.0f;
      for (int w = 0; w < kWarps; ++w) l += red[w];
      score_part[item * p.n_score_tiles + tile] = make_float2(m, l);
    }
  }
}

// d5's score launch: 256 threads, one block per (tile, b, h).
template <class Summary>
__global__ void decode_score_kernel(DecodeParams p, bool vectorised, bool coalesced,
                                    float* scores, float2* score_part) {
  extern __shared__ float q[];
  score_tile<Summary, kScoreThreads / kWarp, false>(p, blockIdx.y, blockIdx.x, vectorised,
                                                    coalesced, q, scores, score_part);
}

// ---- the fused step (DecodeKernel::fused) ----------------------------------------------------
// Launch 1, 128 threads: window tiles (blocks [0, n_win_tiles * B * Hkv)), then score tiles
// (n_score_tiles per (b, h), kTiles of them per block, their stream loaded ld.global.cs: d25); the
// two stages are independent, so one grid runs both. kMma (d39): score_tile's int4 dots on the
// tensor cores; kPair (d40): its (s16, b'16) pairs.
template <class Summary, int kTiles, bool kMma = false, bool kPair = false>
__device__ __forceinline__ void window_score_block(const DecodeParams& p, const DecodeScratch& w,
                                                   bool fast, bool staged, bool vectorised,
                                                   bool coalesced) {
  extern __shared__ float smem[];
  const int64_t n_win_blocks = p.n_win_tiles * p.B * p.Hkv, block = blockIdx.x;
  if (block < n_win_blocks) {
    window_tile<true>(p, fast, staged, w.win_part, block % p.n_win_tiles, block / p.n_win_tiles,
                      smem);
  } else {
    const int64_t j = block - n_win_blocks, blocks_per_item = (p.n_score_tiles + kTiles - 1) / kTiles;
    score_tile<Summary, kFastThreads / kWarp, true, ScanLoads::streaming, kTiles, kMma, kPair>(
        p, j / blocks_per_item, j % blocks_per_item * kTiles, vectorised, coalesced, smem, w.scores,
        w.score_part);
  }
  allow_next_grid();
}

template <class Summary, int kTiles = 1, bool kMma = false, bool kPair = false>
__global__ void fused_window_score_kernel(DecodeParams p, DecodeScratch w, bool fast, bool staged,
                                          bool vectorised, bool coalesced) {
  window_score_block<Summary, kTiles, kMma, kPair>(p, w, fast, staged, vectorised, coalesced);
}

// d40's launch 1 (int4_h pairs, two tiles per block; kMma: the dots on the tensor cores where
// the rows are coalesced) held to six blocks of kFastThreads per SM by its launch bounds: ptxas
// fits it in 80 registers (92 without: five blocks per SM), spilling a few bytes in the mma
// form. The same arithmetic, so the same bits. Measured against five per SM (gpu/NOTES.md
// "d40", session 18): B = 32 -2.5 us, B = 8 unchanged; d39's launch 1 held alike was 1.2 us
// slower at B = 8 and unchanged at B = 32, so d39's keeps no bounds.
template <bool kMma>
__global__ void __launch_bounds__(kFastThreads, 6)
    fused_window_score_pairs_kernel(DecodeParams p, DecodeScratch w, bool fast, bool staged,
                                    bool vectorised, bool coalesced) {
  window_score_block<Int4Summary, 2, kMma, true>(p, w, fast, staged, vectorised, coalesced);
}

}  // namespace
}  // namespace detail
}  // namespace hils::gpu
