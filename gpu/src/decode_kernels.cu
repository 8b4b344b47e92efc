// Decode step (gpu/include/hils/gpu/decode.hpp, gpu/NOTES.md "decode"): the query at slot T-1
// of B sequences against a bf16 cache with chunk summaries (bf16, or fp8 e4m3 with row scales).
// Memory-bound, so every stage is split over many blocks (flash-decoding style) and each byte of
// the cache is read once (DecodeKernel::fused runs 1 and 2 in one grid; d5 launches each):
//   1. window tiles: partial softmax (m, l, o) of 64 window slots per (sequence, head);
//   2. score tiles: s_hat = sigma q~ . k'_c + b'_c for 256 chunks per (sequence, head), one
//      thread per chunk (16-byte loads of its bf16 row), plus the tile's (max, sum exp);
//   3. select, one block per (sequence, KV group): log Z_hat per head from the partials
//      (Eq. 8), the group score r (Eq. 2) per candidate, an exact radix select of the K largest
//      (ties to the lower chunk), written ascending;
//   4. chunk tiles: softmax of q over each selected chunk's tokens per head (o_c, lse_c);
//   5. fuse, one warp per (sequence, head): hierarchical (Eq. 10) or flat (Eq. 3); in the fused
//      kernel (d13) it also merges the window tiles, which the select does otherwise.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "device_common.cuh"
#include "mma_common.cuh"
#include "hils/gpu/decode.hpp"

namespace hils::gpu {
namespace detail {
namespace {

constexpr int kDecodeTileSlots = 64;    // window slots per window block item
constexpr int kScoreThreads = 256;      // chunks per score block (one per thread)
constexpr int kSelectThreads = 256;
constexpr int kSelectSmemKeys = 10240;  // keys in 40 KiB of shared memory (+ static < 48 KiB)
constexpr int kRadixBins = 256;

// Everything a decode kernel needs, by value.
struct DecodeParams {
  int64_t B, T, Hq, Hkv, G, d, dv, S, W, K;
  int64_t slot_cap, chunk_cap, n_chunks, n_cand;  // n_cand = |V(T-1)|
  int64_t win_lo, n_win_tiles, n_score_tiles;
  float scale;
  bool landmarks, softmax1, hierarchical;
  int group_rule;  // hils::GroupRule value
  const __nv_bfloat16 *q, *q_retrieval, *k, *v;
  const void* summary_key;      // bf16 or fp8 e4m3 (SummaryType)
  const float* summary_bias;
  const float* summary_scale;   // fp8: the row scales; null for bf16 (scale 1)
  const __nv_bfloat16* summary_key_bf16;  // fp8 + hierarchical: bf16 rows for the fusion logits
  const __half2* summary_scale_bias;      // int4_h: (s16, b'16) per row, read by d40's scan
};

// Scratch pointers of one step (decode_workspace_bytes sizes them).
struct DecodeScratch {
  float* scores;        // [B, Hq, n_chunks] (the caller's surrogate output when given)
  float2* score_part;   // [B, Hq, n_score_tiles] (max, sum exp) of each score tile
  float* win_part;      // [B, Hq, n_win_tiles, dv + 2] (m, l, unnormalised o)
  float* win_o;         // [B, Hq, dv]
  float* win_lse;       // [B, Hq]
  int32_t* selection;   // [B, Hkv, K] (the caller's output when given)
  float* chunk_part;    // [B, Hq, K, dv + 1] (lse_c, normalised o_c)
  uint32_t* cand_key;   // [B, Hkv, n_score_tiles, min(K, 256)] each tile's K best r (as keys)
  int32_t* cand_idx;    // same shape: their chunk indices, ascending within each tile
  float* fusion_logit;  // [B, Hq, K] s_hat of the selected chunks from summary_key_bf16
};

// The shortened tails of the fused kernel (since d12) for K <= kShortK selected chunks; since
// d13 its fuse also merges the window tiles when dv <= kShortDim and there are at most
// kShortWinTiles of them (fuse_merges_window), and the select then leaves the window alone.
constexpr int kShortK = 32;
constexpr int kShortDim = 64;
constexpr int kShortWinTiles = 16;
constexpr int kShortSelectThreads = 1024;  // the select's block for K <= 32 (one list per warp)

__host__ __device__ inline bool fuse_merges_window(const DecodeParams& p) {
  return p.K <= kShortK && p.dv <= kShortDim && p.n_win_tiles <= kShortWinTiles;
}
// The select ranks by warp sorts (select_group_short) rather than radix passes.
__host__ __device__ inline bool select_by_sorts(const DecodeParams& p) {
  return p.K > 0 && p.K <= kShortK && p.n_cand > p.K;
}

// Candidates each 256-chunk tile keeps for the final selection.
__host__ __device__ inline int64_t tile_keep(const DecodeParams& p) {
  return p.K < kScoreThreads ? p.K : kScoreThreads;
}

// The select's warps may take the kept lists as sorted (d35): one tile's list of 32 per warp.
__host__ __device__ inline bool select_presorted(const DecodeParams& p) {
  return select_by_sorts(p) && tile_keep(p) == kWarp;
}
// d36's chunk tiles select themselves: presorted lists, and the fuse merges the window (the
// select would otherwise).
__host__ __device__ inline bool chunks_can_select(const DecodeParams& p) {
  return select_presorted(p) && fuse_merges_window(p);
}

// Candidates the select block ranks: `keep` from every full tile, fewer from the last.
__host__ __device__ inline int64_t kept_candidates(const DecodeParams& p) {
  const int64_t tiles = (p.n_cand + kScoreThreads - 1) / kScoreThreads;
  const int64_t last = p.n_cand - (tiles - 1) * kScoreThreads;
  return (tiles - 1) * tile_keep(p) + (last < tile_keep(p) ? last : tile_keep(p));
}

__device__ __forceinline__ float logaddexp(float a, float b) {
  const float m = fmaxf(a, b);
  return m == kNegInf ? kNegInf : m + __logf(__expf(a - m) + __expf(b - m));
}

// Monotone map of a float to uint32: a > b  <=>  key(a) > key(b).
__device__ __forceinline__ uint32_t order_key(float x) {
  const uint32_t u = __float_as_uint(x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Programmatic dependent launch (Hopper; the tails of the fused kernel and d29-d35): a kernel
// launched with cudaLaunchAttributeProgrammaticStreamSerialization may start while the previous
// kernel of the stream still runs; wait_for_previous_grid() returns once that kernel has completed
// and its writes are visible, so every read of an earlier stage's output and every global write
// comes after it. allow_next_grid() lets the next kernel launch once every block of this one has
// called it (or exited): each block calls it after its last store (session 9 run 1 called it first,
// and the early-resident tails slowed the running kernel). Both are no-ops for a kernel launched
// without the attribute (d5's), and compile to nothing below sm_90.
__device__ __forceinline__ void wait_for_previous_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void allow_next_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Exclusive prefix sum over the block (blockDim.x multiple of 32, <= 1024); total in *total.
__device__ int block_exclusive_scan(int x, int* total) {
  __shared__ int warp_sums[32];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int warps = blockDim.x / kWarp;
  int incl = x;
  for (int off = 1; off < kWarp; off *= 2) {
    const int y = __shfl_up_sync(0xffffffffu, incl, off);
    if (lane >= off) incl += y;
  }
  if (lane == kWarp - 1) warp_sums[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    int w = lane < warps ? warp_sums[lane] : 0;
    for (int off = 1; off < kWarp; off *= 2) {
      const int y = __shfl_up_sync(0xffffffffu, w, off);
      if (lane >= off) w += y;
    }
    if (lane < warps) warp_sums[lane] = w;  // inclusive over warps
  }
  __syncthreads();
  const int before = (warp > 0 ? warp_sums[warp - 1] : 0) + incl - x;
  *total = warp_sums[warps - 1];
  __syncthreads();
  return before;
}

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

// An L2 evict-first cache policy (createpolicy) for the chunk tiles' K/V copies (d29 on).
__device__ __forceinline__ uint64_t evict_first_policy() {
  uint64_t policy = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
#endif
  return policy;
}

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
// Warp-wide LSE over the candidates of head `item` from the score tiles' (max, sum exp).
__device__ float candidate_lse(const DecodeParams& p, const DecodeScratch& w, int64_t item) {
  const int lane = threadIdx.x % kWarp;
  const float2* part = w.score_part + item * p.n_score_tiles;
  float m = kNegInf;
  for (int64_t i = lane; i < p.n_score_tiles; i += kWarp) m = fmaxf(m, part[i].x);
  m = warp_max(m);
  float l = 0.0f;
  for (int64_t i = lane; i < p.n_score_tiles; i += kWarp) l += part[i].y * exp_diff(part[i].x, m);
  l = warp_sum(l);
  return l > 0.0f ? m + __logf(l) : kNegInf;
}

// Warp-wide (max, sum) of head `item`'s window tiles: lse_swa = m + log l.
__device__ float2 window_stats(const DecodeParams& p, const DecodeScratch& w, int64_t item) {
  const int lane = threadIdx.x % kWarp;
  const float* part = w.win_part + item * p.n_win_tiles * (p.dv + 2);
  float m = kNegInf;
  for (int64_t i = lane; i < p.n_win_tiles; i += kWarp) m = fmaxf(m, part[i * (p.dv + 2)]);
  m = warp_max(m);
  float l = 0.0f;
  for (int64_t i = lane; i < p.n_win_tiles; i += kWarp)
    l += part[i * (p.dv + 2) + 1] * exp_diff(part[i * (p.dv + 2)], m);
  return make_float2(m, warp_sum(l));
}

__device__ float lse_of(float2 stats) {
  return stats.y > 0.0f ? stats.x + __logf(stats.y) : kNegInf;
}

// Warp-wide: merges head `item`'s window tiles into o_swa, lse_swa (scratch and outputs).
__device__ void write_window(const DecodeParams& p, const DecodeScratch& w, int64_t item,
                             float* o_window, float* lse_window) {
  const int lane = threadIdx.x % kWarp;
  const float2 stats = window_stats(p, w, item);
  const float* part = w.win_part + item * p.n_win_tiles * (p.dv + 2);
  const float inv = stats.y > 0.0f ? 1.0f / stats.y : 0.0f;
  for (int64_t dim = lane; dim < p.dv; dim += kWarp) {
    float acc = 0.0f;
    for (int64_t i = 0; i < p.n_win_tiles; ++i)
      acc += part[i * (p.dv + 2) + 2 + dim] * exp_diff(part[i * (p.dv + 2)], stats.x);
    w.win_o[item * p.dv + dim] = acc * inv;
    if (o_window) o_window[item * p.dv + dim] = acc * inv;
  }
  if (lane == 0) {
    w.win_lse[item] = lse_of(stats);
    if (lse_window) lse_window[item] = lse_of(stats);
  }
}

// The digit (bits [shift, shift+8)) holding the `rank`-th largest key (rank from 1) among the
// histogram; returns it and sets *above to the count in higher digits. Warp 0 only.
__device__ int find_digit(const int* hist, int rank, int* above) {
  const int lane = threadIdx.x % kWarp;
  // Lane owns the 8 digits 255 - 8 lane ... 248 - 8 lane (descending).
  int own = 0;
  for (int i = 0; i < 8; ++i) own += hist[255 - 8 * lane - i];
  int incl = own;
  for (int off = 1; off < kWarp; off *= 2) {
    const int y = __shfl_up_sync(0xffffffffu, incl, off);
    if (lane >= off) incl += y;
  }
  const int excl = incl - own;
  const bool mine = excl < rank && incl >= rank;
  const unsigned who = __ballot_sync(0xffffffffu, mine);
  const int src = __ffs(who) - 1;
  int digit = 0, count_above = 0;
  if (lane == src) {
    int acc = excl;
    for (int i = 0; i < 8; ++i) {
      const int dgt = 255 - 8 * lane - i;
      if (acc + hist[dgt] >= rank) {
        digit = dgt;
        break;
      }
      acc += hist[dgt];
    }
    count_above = acc;
  }
  *above = __shfl_sync(0xffffffffu, count_above, src);
  return __shfl_sync(0xffffffffu, digit, src);
}

// Block-wide exact top-k of n keys (larger first, equal keys: lower position first): calls
// emit(pos, c) for each chosen position c, pos = 0, 1, ... in ascending c; returns min(n, k).
// `work` receives the keys shifted and scaled (may alias src).
template <class Emit>
__device__ int block_top_k(const uint32_t* src, uint32_t* work, int64_t n, int64_t k, Emit emit) {
  __shared__ int hist[kRadixBins];
  __shared__ int digit_info[2];
  const int warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;
  if (n <= k) {
    for (int64_t c = threadIdx.x; c < n; c += blockDim.x) emit(static_cast<int>(c), c);
    return static_cast<int>(n);
  }
  // Keys shifted to start at the smallest and scaled so that their range fills 32 bits (a
  // monotone, one-to-one map): the first radix digit then splits the candidates instead of
  // holding the nearly constant sign and exponent bits of all of them.
  __shared__ uint32_t range[2 * kSelectThreads / kWarp];
  uint32_t lo_key = 0xffffffffu, hi_key = 0u;
  for (int64_t c = threadIdx.x; c < n; c += blockDim.x) {
    const uint32_t u = src[c];
    lo_key = min(lo_key, u), hi_key = max(hi_key, u);
  }
  lo_key = __reduce_min_sync(0xffffffffu, lo_key), hi_key = __reduce_max_sync(0xffffffffu, hi_key);
  if (threadIdx.x % kWarp == 0) range[2 * warp] = lo_key, range[2 * warp + 1] = hi_key;
  __syncthreads();
  for (int i = 0; i < warps; ++i) lo_key = min(lo_key, range[2 * i]), hi_key = max(hi_key, range[2 * i + 1]);
  const int spread = hi_key > lo_key ? __clz(hi_key - lo_key) : 0;
  for (int64_t c = threadIdx.x; c < n; c += blockDim.x) work[c] = (src[c] - lo_key) << spread;
  __syncthreads();
  const uint32_t* keys = work;
  // Radix select of the K-th largest key, 8 bits per pass from the top.
  uint32_t prefix = 0, mask = 0;
  int rank = static_cast<int>(k);
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < kRadixBins; i += blockDim.x) hist[i] = 0;
    __syncthreads();
    // Warp-aggregated: lanes with the same digit add once (the top digits of float keys are
    // nearly all equal, and 32 same-address shared atomics serialise).
    for (int64_t c0 = 0; c0 < n; c0 += blockDim.x) {
      const int64_t c = c0 + threadIdx.x;
      const uint32_t u = c < n ? keys[c] : 0u;
      const bool live = c < n && (u & mask) == prefix;
      const int bin = live ? static_cast<int>((u >> shift) & 0xffu) : kRadixBins;
      const unsigned peers = __match_any_sync(0xffffffffu, bin);
      if (live && static_cast<int>(threadIdx.x % kWarp) == __ffs(peers) - 1)
        atomicAdd(&hist[bin], __popc(peers));
    }
    __syncthreads();
    if (warp == 0) {
      int above = 0;
      const int digit = find_digit(hist, rank, &above);
      if (threadIdx.x == 0) digit_info[0] = digit, digit_info[1] = above;
    }
    __syncthreads();
    prefix |= static_cast<uint32_t>(digit_info[0]) << shift;
    mask |= 0xffu << shift;
    rank -= digit_info[1];
    __syncthreads();
  }
  // Keys above the threshold, then the `rank` lowest-index keys equal to it. Thread i walks
  // the contiguous range [i * per, (i + 1) * per) so that the output stays ascending.
  const uint32_t threshold = prefix;
  const int64_t per = (n + blockDim.x - 1) / blockDim.x;
  const int64_t lo = min(n, threadIdx.x * per), hi = min(n, lo + per);
  int n_eq = 0;
  for (int64_t c = lo; c < hi; ++c) n_eq += keys[c] == threshold;
  int total = 0;
  int eq_before = block_exclusive_scan(n_eq, &total);
  int n_sel = 0;
  for (int64_t c = lo, e = eq_before; c < hi; ++c) {
    const uint32_t u = keys[c];
    if (u > threshold) ++n_sel;
    else if (u == threshold && e++ < rank) ++n_sel;
  }
  int pos = block_exclusive_scan(n_sel, &total);
  for (int64_t c = lo, e = eq_before; c < hi; ++c) {
    const uint32_t u = keys[c];
    const bool take = u > threshold || (u == threshold && e++ < rank);
    if (take) emit(pos++, c);
  }
  __syncthreads();
  return total;
}

// ---- short chains (the fused kernel since d12): exact top-K for K <= 32 by warp sorts -------
// A candidate as one 64-bit rank: its order key above, 0xffffffff - chunk below, so that a larger
// rank is a larger key or, on equal keys, the lower chunk (the tie rule). 0 is "no candidate"
// (below every candidate). A warp holds 32 ranks (one per lane); a bitonic sort orders them in
// 15 shuffle steps, a merge of two sorted lists keeps the 32 largest in 6, with no block barrier:
// the radix select above needs 4 passes of 3-4 barriers each.

__device__ __forceinline__ uint64_t candidate_rank(uint32_t key, int64_t chunk) {
  return (static_cast<uint64_t>(key) << 32) | (0xffffffffu - static_cast<uint32_t>(chunk));
}
__device__ __forceinline__ int32_t rank_chunk(uint64_t rank) {
  return static_cast<int32_t>(0xffffffffu - static_cast<uint32_t>(rank));
}
__device__ __forceinline__ uint32_t rank_key(uint64_t rank) { return static_cast<uint32_t>(rank >> 32); }

// The warp's 32 values sorted descending (lane 0 the largest).
__device__ __forceinline__ uint64_t warp_sort_desc(uint64_t x) {
  const int lane = threadIdx.x % kWarp;
#pragma unroll
  for (int k = 2; k <= kWarp; k *= 2) {
#pragma unroll
    for (int j = k / 2; j > 0; j /= 2) {
      const uint64_t y = __shfl_xor_sync(0xffffffffu, x, j);
      const bool keep_max = ((lane & j) == 0) == ((lane & k) == 0);
      x = keep_max ? max(x, y) : min(x, y);
    }
  }
  return x;
}

// warp_sort_desc of N lists at once (their shuffles interleaved: one sort's latency, not N).
template <int N>
__device__ __forceinline__ void warp_sort_desc_batch(uint64_t (&x)[N]) {
  const int lane = threadIdx.x % kWarp;
#pragma unroll
  for (int k = 2; k <= kWarp; k *= 2) {
#pragma unroll
    for (int j = k / 2; j > 0; j /= 2) {
      const bool keep_max = ((lane & j) == 0) == ((lane & k) == 0);
      uint64_t y[N];
#pragma unroll
      for (int u = 0; u < N; ++u) y[u] = __shfl_xor_sync(0xffffffffu, x[u], j);
#pragma unroll
      for (int u = 0; u < N; ++u) x[u] = keep_max ? max(x[u], y[u]) : min(x[u], y[u]);
    }
  }
}

// The 32 largest of two descending lists, descending; `b_reversed` holds b[31 - lane].
// max(a[i], b[31 - i]) is bitonic and holds the 32 largest; half-cleaners sort it.
__device__ __forceinline__ uint64_t warp_merge_desc(uint64_t a, uint64_t b_reversed) {
  const int lane = threadIdx.x % kWarp;
  uint64_t x = max(a, b_reversed);
#pragma unroll
  for (int j = kWarp / 2; j > 0; j /= 2) {
    const uint64_t y = __shfl_xor_sync(0xffffffffu, x, j);
    x = (lane & j) == 0 ? max(x, y) : min(x, y);
  }
  return x;
}

__device__ __forceinline__ uint64_t lane_reversed(uint64_t x) {
  return __shfl_sync(0xffffffffu, x, kWarp - 1 - threadIdx.x % kWarp);
}

// Block-wide: every warp holds a descending list; returns on warp 0 the 32 largest of all of
// them, descending (other warps: their own list or a partial merge). `lists` holds 32 per warp.
// Each slot is written once (by the warp that gives its list away), so one barrier per level.
__device__ uint64_t block_merge_desc(uint64_t x, uint64_t* lists) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;
  for (int stride = 1; stride < warps; stride *= 2) {
    if (warp % (2 * stride) == stride) lists[warp * kWarp + lane] = x;
    __syncthreads();
    if (warp % (2 * stride) == 0 && warp + stride < warps)
      x = warp_merge_desc(x, lists[(warp + stride) * kWarp + kWarp - 1 - lane]);
  }
  return x;
}

// Warp-wide log Z_hat of head `item` (Eq. 8, the window and the candidates) in one pass: lane i
// loads window tile i's and score tile i's (max, sum) together, one round trip per 32 tiles
// (window_stats and candidate_lse take two each, one after the other).
__device__ float head_log_z(const DecodeParams& p, const DecodeScratch& w, int64_t item) {
  const int lane = threadIdx.x % kWarp;
  const float* win = w.win_part + item * p.n_win_tiles * (p.dv + 2);
  const float2* part = w.score_part + item * p.n_score_tiles;
  const int64_t n = p.n_win_tiles > p.n_score_tiles ? p.n_win_tiles : p.n_score_tiles;
  float m = kNegInf, l = 0.0f;
  for (int64_t i = lane; i < n; i += kWarp) {
    const bool in_win = i < p.n_win_tiles;
    const float wm = in_win ? win[i * (p.dv + 2)] : kNegInf;
    const float wl = in_win ? win[i * (p.dv + 2) + 1] : 0.0f;
    const float2 sp = i < p.n_score_tiles ? part[i] : make_float2(kNegInf, 0.0f);
    const float mn = fmaxf(m, fmaxf(wm, sp.x));
    l = l * exp_diff(m, mn) + wl * exp_diff(wm, mn) + sp.y * exp_diff(sp.x, mn);
    m = mn;
  }
  const float top = warp_max(m);
  const float sum = warp_sum(l * exp_diff(m, top));
  return sum > 0.0f ? top + __logf(sum) : kNegInf;
}

// ---- 2b. group scores: r (Eq. 2) of 256 candidates per block, one block per (tile, b, g) ---
// log Z_hat per head (Eq. 8) is recomputed by every tile from the partials (a few KB).
// kShort with K <= 32: the tile's K best by warp sorts and a merge tree (no radix passes); the
// kept candidates are then in no particular order (the select of kShort ranks them by chunk too).
template <bool kShort>
__device__ void group_score_tile(const DecodeParams& p, const DecodeScratch& w, int64_t tile,
                                 int64_t bg) {
  __shared__ float log_z[64];
  const int64_t b = bg / p.Hkv, g = bg % p.Hkv;
  const int warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;
  const int64_t tile_first = tile * kScoreThreads;
  const int64_t c = tile_first + threadIdx.x;
  const bool valid = c < p.n_cand;
  const float* scores = w.scores + (b * p.Hq + g * p.G) * p.n_chunks + c;
  // kShort, G <= 16: the candidate's scores are loaded before log Z_hat, which takes one pass.
  const bool preload = kShort && p.G <= kFastMaxGroup;
  float pre[kFastMaxGroup];
  if (preload) {
#pragma unroll
    for (int j = 0; j < kFastMaxGroup; ++j) pre[j] = valid && j < p.G ? scores[j * p.n_chunks] : kNegInf;
  }
  for (int64_t j = warp; j < p.G; j += warps) {
    const int64_t item = b * p.Hq + g * p.G + j;
    const float z = kShort ? head_log_z(p, w, item)
                           : logaddexp(lse_of(window_stats(p, w, item)), candidate_lse(p, w, item));
    if (threadIdx.x % kWarp == 0) log_z[j] = z;
  }
  __syncthreads();
  float r = p.group_rule == static_cast<int>(GroupRule::sum_probabilities) ? 0.0f : kNegInf;
  auto add_head = [&](int64_t j, float s) {
    if (p.group_rule == static_cast<int>(GroupRule::max_normalized)) r = fmaxf(r, s - log_z[j]);
    else if (p.group_rule == static_cast<int>(GroupRule::sum_probabilities))
      r += __expf(s - log_z[j]);
    else r = fmaxf(r, s);
  };
  if (preload) {
#pragma unroll
    for (int j = 0; j < kFastMaxGroup; ++j)
      if (valid && j < p.G) add_head(j, pre[j]);
  } else {
    for (int64_t j = 0; valid && j < p.G; ++j) add_head(j, scores[j * p.n_chunks]);
  }
  // The tile keeps its `keep` best (ties: lower chunk); the select block picks among them.
  const int64_t keep = tile_keep(p), rest = p.n_cand - tile_first;
  const int64_t n_tile = rest < kScoreThreads ? rest : kScoreThreads;
  uint32_t* out_key = w.cand_key + (bg * p.n_score_tiles + tile) * keep;
  int32_t* out_idx = w.cand_idx + (bg * p.n_score_tiles + tile) * keep;
  if (kShort && keep <= kShortK) {
    __shared__ uint64_t lists[kScoreThreads];
    uint64_t x = warp_sort_desc(valid ? candidate_rank(order_key(r), c) : 0u);
    x = block_merge_desc(x, lists);
    const int lane = threadIdx.x % kWarp;
    if (threadIdx.x < kWarp && lane < keep && lane < n_tile)
      out_key[lane] = rank_key(x), out_idx[lane] = rank_chunk(x);
    return;
  }
  __shared__ uint32_t orig[kScoreThreads], work[kScoreThreads];
  orig[threadIdx.x] = valid ? order_key(r) : 0u;
  __syncthreads();
  block_top_k(orig, work, n_tile, keep, [&](int pos, int64_t i) {
    out_key[pos] = orig[i];
    out_idx[pos] = static_cast<int32_t>(tile_first + i);
  });
}

template <bool kShort>
__global__ void decode_group_score_kernel(DecodeParams p, DecodeScratch w) {
  wait_for_previous_grid();
  group_score_tile<kShort>(p, w, blockIdx.x, blockIdx.y);
  allow_next_grid();
}

// ---- 3. select: one block per (b, g), over the tiles' kept candidates -----------------------
// merge_window: o_swa and lse_swa from the window tiles here (false: the fuse merges them).
__device__ void select_group(const DecodeParams& p, const DecodeScratch& w, int64_t bg,
                             float* o_window, float* lse_window, uint32_t* smem_keys,
                             bool merge_window = true) {
  const int64_t b = bg / p.Hkv, g = bg % p.Hkv;
  const int warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;
  for (int64_t j = warp; merge_window && j < p.G; j += warps)
    write_window(p, w, b * p.Hq + g * p.G + j, o_window, lse_window);
  int32_t* sel = w.selection + bg * p.K;
  const int64_t n = p.n_cand;
  if (p.K == 0) return;
  if (n <= p.K) {  // every candidate is selected
    for (int64_t i = threadIdx.x; i < p.K; i += blockDim.x)
      sel[i] = i < n ? static_cast<int32_t>(i) : -1;
    return;
  }
  // Every tile but the last kept `keep` candidates; they lie in ascending chunk order.
  const int64_t keep = tile_keep(p), m = kept_candidates(p);
  uint32_t* src = w.cand_key + bg * p.n_score_tiles * keep;
  const int32_t* idx = w.cand_idx + bg * p.n_score_tiles * keep;
  uint32_t* work = m <= kSelectSmemKeys ? smem_keys : src;
  const int total = block_top_k(src, work, m, p.K, [&](int pos, int64_t c) {
    if (pos < p.K) sel[pos] = idx[c];
  });
  for (int64_t i = total + threadIdx.x; i < p.K; i += blockDim.x) sel[i] = -1;
}

// kShort with select_by_sorts, kThreads threads (kShortSelectThreads since d13, d12 ran 256; 128 in
// d36's chunk tiles): warp w ranks the kept candidates w * 32 + lane, + kThreads, ... (sorts and
// merges in registers; kBatch lists of 32 loaded at once), a merge tree gives the K best, a last
// sort orders them by chunk. The first candidates' loads are issued before the window merge (when
// this block does it) so that they overlap. kPresorted (d35, when tile_keep is 32): warp w's 32
// candidates are group-score tile w's kept list, which that tile wrote in descending rank order
// (lane 0 the largest; a partial last tile padded below by 0), so the warp's sort is skipped: the
// same lists reach the same merges. emit(slot, chunk) takes the K chunks in ascending order
// (SelectionOut: the group's selection).
struct SelectionOut {
  int32_t* at;
  __device__ void operator()(int slot, int32_t chunk) const { at[slot] = chunk; }
};

template <int kThreads, int kBatch, bool kPresorted = false, class Emit>
__device__ void select_group_short(const DecodeParams& p, const DecodeScratch& w, int64_t bg,
                                   float* o_window, float* lse_window, bool merge_window,
                                   Emit emit) {
  __shared__ uint64_t lists[kThreads];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = kThreads / kWarp;
  const int64_t b = bg / p.Hkv, g = bg % p.Hkv;
  const int64_t keep = tile_keep(p), m = kept_candidates(p);
  const uint32_t* src = w.cand_key + bg * p.n_score_tiles * keep;
  const int32_t* idx = w.cand_idx + bg * p.n_score_tiles * keep;
  const int64_t step = static_cast<int64_t>(warps) * kWarp;
  uint64_t x[kBatch];
  auto load = [&](int64_t base) {
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int64_t i = base + u * step + lane;
      x[u] = i < m ? candidate_rank(__ldg(src + i), __ldg(idx + i)) : 0u;
    }
  };
  int64_t base = warp * kWarp;
  load(base);
  for (int64_t j = warp; merge_window && j < p.G; j += warps)
    write_window(p, w, b * p.Hq + g * p.G + j, o_window, lse_window);
  uint64_t best = 0;
  if constexpr (kPresorted) {
#pragma unroll 1  // unrolled, ptxas spilled 156 bytes at 64 registers
    while (base < m) {
#pragma unroll
      for (int width = 1; width < kBatch; width *= 2)  // a merge tree over the batch's lists
#pragma unroll
        for (int u = 0; u + width < kBatch; u += 2 * width)
          x[u] = warp_merge_desc(x[u], lane_reversed(x[u + width]));
      best = warp_merge_desc(best, lane_reversed(x[0]));
      base += kBatch * step;
      if (base < m) load(base);
    }
  }
  while (!kPresorted && base < m) {
    warp_sort_desc_batch(x);
#pragma unroll
    for (int width = 1; width < kBatch; width *= 2)  // a merge tree over the batch's lists
#pragma unroll
      for (int u = 0; u + width < kBatch; u += 2 * width)
        x[u] = warp_merge_desc(x[u], lane_reversed(x[u + width]));
    best = warp_merge_desc(best, lane_reversed(x[0]));
    base += kBatch * step;
    if (base < m) load(base);
  }
  best = block_merge_desc(best, lists);
  if (warp == 0) {
    // The K best by chunk: sort their low words (0xffffffff - chunk) descending.
    const uint64_t low = lane < p.K ? (best & 0xffffffffu) : 0u;
    const int32_t chunk = rank_chunk(warp_sort_desc(low));
    if (lane < p.K) emit(lane, chunk);
  }
}

template <bool kShort>
__global__ void decode_select_kernel(DecodeParams p, DecodeScratch w, float* o_window,
                                     float* lse_window) {
  extern __shared__ uint32_t smem_keys[];
  wait_for_previous_grid();
  const bool merge_window = !(kShort && fuse_merges_window(p));  // else the fuse merges it
  select_group(p, w, blockIdx.x, o_window, lse_window, smem_keys, merge_window);
  allow_next_grid();
}

// The fused kernel's select when select_by_sorts (kShortSelectThreads threads); kPresorted
// (d35) only where select_presorted.
template <bool kPresorted = false>
__global__ void __launch_bounds__(kShortSelectThreads)
    decode_select_sorted_kernel(DecodeParams p, DecodeScratch w, float* o_window,
                                float* lse_window) {
  wait_for_previous_grid();
  select_group_short<kShortSelectThreads, 1, kPresorted>(
      p, w, blockIdx.x, o_window, lse_window, !fuse_merges_window(p),
      SelectionOut{w.selection + blockIdx.x * p.K});
  allow_next_grid();
}

// ---- 4. chunk tiles: one block per (selected slot i, b, g), a warp per head ---------------
// s_hat(c) = sigma q~ . k'_c + b'_c from the bf16 row of chunk c for every head of group bg (a
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
                 __bfloat162float(p.summary_key_bf16[row * p.d + e]), acc);
    acc = warp_sum(acc);
    if (lane == 0) fusion_logit[item * p.K + i] = c >= 0 ? p.scale * acc + p.summary_bias[row] : kNegInf;
  }
}

// sigma q~ . k'_c + b'_c of `item` against the bf16 summary row `row` (d = 64) by 8 lanes: lane
// `piece` loads 16 bytes of q~ and of the row, xor shuffles sum the 8 pieces. Every lane of the
// warp must call it (lanes with live == false add zeros); the value is meant for piece 0.
__device__ __forceinline__ float fusion_logit_by_8_lanes(const DecodeParams& p, int64_t item,
                                                         int64_t row, int piece, bool live) {
  constexpr int kLanes = kFastDim / 8;
  const uint4 qu = live ? __ldg(reinterpret_cast<const uint4*>(p.q_retrieval + item * kFastDim) + piece)
                        : make_uint4(0, 0, 0, 0);
  const uint4 ku = live ? __ldg(reinterpret_cast<const uint4*>(p.summary_key_bf16 + row * kFastDim) + piece)
                        : make_uint4(0, 0, 0, 0);
  const float bias = live && piece == 0 ? __ldg(p.summary_bias + row) : 0.0f;
  float qf[8], kf[8];
  Bf16Summary::widen(qu, qf);
  Bf16Summary::widen(ku, kf);
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
         reinterpret_cast<uintptr_t>(p.summary_key_bf16) % 16 == 0;
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
  if (p.summary_key_bf16 && c >= 0 && !overlap) selected_logits(p, fusion_logit, c, i, bg);
  if (fast && c >= 0) {
    auto logits = [&] {
      if (!overlap || !p.summary_key_bf16) return;
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
         reinterpret_cast<uintptr_t>(p.summary_key_bf16) % 16 == 0;
}

// fusion_logit[item, i] = sigma q~ . k'_c + b'_c (bf16 rows) for the G heads of group (b, g):
// lane (head t / 8, piece t % 8) loads 16 bytes of q~ and of the row; 8 lanes sum.
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
    if (p.summary_key_bf16) selected_logits_warp(p, fusion_logit, c, i, first);
    cp_async_wait_one();  // the key rows
    __syncwarp();
    float s[8][4];
    qk_tile(s, qa, tile.k);
    // Logits of rows r0 (s[nt][0..1]) and r1 (s[nt][2..3]) at slots nt * 8 + 2 * quad + e.
    const int landmark = p.landmarks ? n_rows - 1 : n_rows;
    float m0 = kNegInf, m1 = kNegInf;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int slot = nt * 8 + 2 * quad + e;
        const bool valid = slot < n_rows && slot != landmark;
        s[nt][e] = valid ? p.scale * s[nt][e] : kNegInf;
        s[nt][2 + e] = valid ? p.scale * s[nt][2 + e] : kNegInf;
        m0 = fmaxf(m0, s[nt][e]);
        m1 = fmaxf(m1, s[nt][2 + e]);
      }
    m0 = quad_max(m0), m1 = quad_max(m1);
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
  if (p.summary_key_bf16) selected_logits_packed(p, fusion_logit, c, i, bg);
  cp_async_wait_one();  // this warp's key rows
  __syncwarp();
  // s[t]: chunk_mma_warp's s[2 warp + t] (slots 16 warp + 8 t + 2 quad + e).
  float s[8][4];
  qk_tile(s, qa, sh.tile.k + row0, 2);
  const int landmark = p.landmarks ? n_rows - 1 : n_rows;
  float m0 = kNegInf, m1 = kNegInf;
#pragma unroll
  for (int t = 0; t < 2; ++t)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int slot = row0 + t * 8 + 2 * quad + e;
      const bool valid = slot < n_rows && slot != landmark;
      s[t][e] = valid ? p.scale * s[t][e] : kNegInf;
      s[t][2 + e] = valid ? p.scale * s[t][2 + e] : kNegInf;
      m0 = fmaxf(m0, s[t][e]);
      m1 = fmaxf(m1, s[t][2 + e]);
    }
  m0 = quad_max(m0), m1 = quad_max(m1);
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

// ---- 5. fuse: one warp per (b, h) -----------------------------------------------------------
// Logits a_i: hierarchical s_hat(c_i) (Eq. 10), flat lse_{c_i} (Eq. 3 as a merge of
// (lse, o) pairs); then the window (lse_swa) and, hierarchical with softmax1, a zero logit.
// Lane i handles selected slot i (32 at a time); its weight is broadcast for the output sums.
// kBatched (the fused kernel): the selected chunks' o_c rows are loaded kFuseBatch at a time
// before their sums, so that one head's fusion is not a chain of K dependent L2 round trips (d5,
// kBatched false, loads one row per step). Hierarchical with `fusion_logit`: the logits of the
// selected chunks come from there (the bf16 rows next to fp8 summaries) instead of the scores.
constexpr int kFuseBatch = 8;
template <bool kBatched>
__device__ void fuse_head(const DecodeParams& p, const DecodeScratch& w, int64_t item, float* o,
                          float* lse, float* fusion_weights) {
  const int lane = threadIdx.x % kWarp;
  const int64_t b = item / p.Hq, h = item % p.Hq, g = h / p.G;
  const int32_t* sel = w.selection + (b * p.Hkv + g) * p.K;
  const float* part = w.chunk_part + item * p.K * (p.dv + 1);
  auto logit = [&](int64_t i) {
    if (i >= p.K) return kNegInf;
    const int32_t c = sel[i];
    if (c < 0) return kNegInf;
    if (!p.hierarchical) return part[i * (p.dv + 1)];
    return p.summary_key_bf16 ? w.fusion_logit[item * p.K + i] : w.scores[item * p.n_chunks + c];
  };
  const float a_win = w.win_lse[item];
  const bool zero_logit = p.hierarchical && p.softmax1;
  float m = kNegInf;
  for (int64_t i = lane; i < p.K; i += kWarp) m = fmaxf(m, logit(i));
  m = fmaxf(fmaxf(warp_max(m), a_win), zero_logit ? 0.0f : kNegInf);
  float l = 0.0f;
  for (int64_t i = lane; i < p.K; i += kWarp) l += exp_diff(logit(i), m);
  l = warp_sum(l) + exp_diff(a_win, m) + (zero_logit ? __expf(-m) : 0.0f);
  const float total = m == kNegInf ? kNegInf : m + __logf(l);
  auto weight = [&](float a) { return total == kNegInf ? 0.0f : exp_diff(a, total); };
  float acc[kDimRegs];
  const float w_win = weight(a_win);
#pragma unroll
  for (int r = 0; r < kDimRegs; ++r) {
    const int dim = lane + kWarp * r;
    acc[r] = dim < p.dv ? w_win * w.win_o[item * p.dv + dim] : 0.0f;
  }
  float* fw = fusion_weights ? fusion_weights + item * (p.K + 2) : nullptr;
  for (int64_t base = 0; base < p.K; base += kWarp) {
    const float wi = weight(logit(base + lane));
    if (fw && base + lane < p.K) fw[base + lane] = wi;
    const int n = p.K - base < kWarp ? static_cast<int>(p.K - base) : kWarp;
    if constexpr (kBatched) {
      for (int jj0 = 0; jj0 < n; jj0 += kFuseBatch) {
        float wj[kFuseBatch], v[kFuseBatch][kDimRegs];
#pragma unroll
        for (int u = 0; u < kFuseBatch; ++u) {
          wj[u] = __shfl_sync(0xffffffffu, wi, (jj0 + u) % kWarp);
          const float* row = part + (base + jj0 + u) * (p.dv + 1) + 1;
#pragma unroll
          for (int r = 0; r < kDimRegs; ++r) {
            const int dim = lane + kWarp * r;
            v[u][r] = jj0 + u < n && dim < p.dv ? row[dim] : 0.0f;
          }
        }
#pragma unroll
        for (int u = 0; u < kFuseBatch; ++u)
#pragma unroll
          for (int r = 0; r < kDimRegs; ++r) acc[r] = fmaf(jj0 + u < n ? wj[u] : 0.0f, v[u][r], acc[r]);
      }
    } else {
      for (int jj = 0; jj < n; ++jj) {
        const float wj = __shfl_sync(0xffffffffu, wi, jj);
        const float* row = part + (base + jj) * (p.dv + 1) + 1;
#pragma unroll
        for (int r = 0; r < kDimRegs; ++r) {
          const int dim = lane + kWarp * r;
          if (dim < p.dv) acc[r] = fmaf(wj, row[dim], acc[r]);
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kDimRegs; ++r) {
    const int dim = lane + kWarp * r;
    if (dim < p.dv) o[item * p.dv + dim] = acc[r];
  }
  if (lane == 0) {
    lse[item] = total;
    if (fw) fw[p.K] = w_win, fw[p.K + 1] = zero_logit ? weight(0.0f) : 0.0f;
  }
}

// kShort when fuse_merges_window: every load of the head is issued at once (lane i: selected
// slot i's chunk and logit, window tile i's (m, l); all K rows of o_c and all window tiles' o,
// dims lane and lane + 32), then the sums: one round trip (two for hierarchical fusion with bf16
// summaries: the logit is read at its chunk). The window merge (o_swa, lse_swa) happens here.
__device__ void fuse_head_short(const DecodeParams& p, const DecodeScratch& w, int64_t item,
                                float* o, float* lse, float* fusion_weights, float* o_window,
                                float* lse_window) {
  const int lane = threadIdx.x % kWarp;
  const int64_t b = item / p.Hq, h = item % p.Hq, g = h / p.G;
  const int32_t* sel = w.selection + (b * p.Hkv + g) * p.K;
  const float* part = w.chunk_part + item * p.K * (p.dv + 1);
  const bool mine = lane < p.K;
  const int32_t c = mine ? sel[lane] : -1;
  const bool logit_given = p.hierarchical && p.summary_key_bf16;
  const float given = mine && logit_given ? w.fusion_logit[item * p.K + lane] : kNegInf;
  const float flat = mine && !p.hierarchical ? part[lane * (p.dv + 1)] : kNegInf;
  float v0[kShortK], v1[kShortK];
#pragma unroll
  for (int i = 0; i < kShortK; ++i) {
    const float* row = part + i * (p.dv + 1) + 1;
    v0[i] = i < p.K && lane < p.dv ? row[lane] : 0.0f;
    v1[i] = i < p.K && lane + kWarp < p.dv ? row[lane + kWarp] : 0.0f;
  }
  const float* win = w.win_part + item * p.n_win_tiles * (p.dv + 2);
  const bool my_tile = lane < p.n_win_tiles;
  const float tile_m = my_tile ? win[lane * (p.dv + 2)] : kNegInf;
  const float tile_l = my_tile ? win[lane * (p.dv + 2) + 1] : 0.0f;
  float t0[kShortWinTiles], t1[kShortWinTiles];
#pragma unroll
  for (int t = 0; t < kShortWinTiles; ++t) {
    const float* row = win + t * (p.dv + 2) + 2;
    t0[t] = t < p.n_win_tiles && lane < p.dv ? row[lane] : 0.0f;
    t1[t] = t < p.n_win_tiles && lane + kWarp < p.dv ? row[lane + kWarp] : 0.0f;
  }
  // The window (write_window's merge): lse_swa and o_swa.
  const float win_m = warp_max(tile_m);
  const float factor = exp_diff(tile_m, win_m);
  const float win_l = warp_sum(tile_l * factor);
  const float a_win = win_l > 0.0f ? win_m + __logf(win_l) : kNegInf;
  const float win_inv = win_l > 0.0f ? 1.0f / win_l : 0.0f;
  float wo0 = 0.0f, wo1 = 0.0f;
#pragma unroll
  for (int t = 0; t < kShortWinTiles; ++t) {
    const float ft = __shfl_sync(0xffffffffu, factor, t);
    wo0 = fmaf(t0[t], ft, wo0);
    wo1 = fmaf(t1[t], ft, wo1);
  }
  wo0 *= win_inv, wo1 *= win_inv;
  if (o_window && lane < p.dv) o_window[item * p.dv + lane] = wo0;
  if (o_window && lane + kWarp < p.dv) o_window[item * p.dv + lane + kWarp] = wo1;
  if (lse_window && lane == 0) lse_window[item] = a_win;
  float a = kNegInf;
  if (mine && c >= 0)
    a = !p.hierarchical ? flat : logit_given ? given : w.scores[item * p.n_chunks + c];
  const bool zero_logit = p.hierarchical && p.softmax1;
  const float m = fmaxf(fmaxf(warp_max(a), a_win), zero_logit ? 0.0f : kNegInf);
  const float l = warp_sum(exp_diff(a, m)) + exp_diff(a_win, m) + (zero_logit ? __expf(-m) : 0.0f);
  const float total = m == kNegInf ? kNegInf : m + __logf(l);
  auto weight = [&](float x) { return total == kNegInf ? 0.0f : exp_diff(x, total); };
  const float wi = weight(a), w_win = weight(a_win);
  float* fw = fusion_weights ? fusion_weights + item * (p.K + 2) : nullptr;
  if (fw && mine) fw[lane] = wi;
  float acc0 = w_win * wo0, acc1 = w_win * wo1;
#pragma unroll
  for (int i = 0; i < kShortK; ++i) {
    const float wj = __shfl_sync(0xffffffffu, wi, i);
    acc0 = fmaf(wj, v0[i], acc0);
    acc1 = fmaf(wj, v1[i], acc1);
  }
  if (lane < p.dv) o[item * p.dv + lane] = acc0;
  if (lane + kWarp < p.dv) o[item * p.dv + lane + kWarp] = acc1;
  if (lane == 0) {
    lse[item] = total;
    if (fw) fw[p.K] = w_win, fw[p.K + 1] = zero_logit ? weight(0.0f) : 0.0f;
  }
}

template <bool kBatched, bool kShort>
__global__ void decode_fuse_kernel(DecodeParams p, DecodeScratch w, float* o, float* lse,
                                   float* fusion_weights, float* o_window, float* lse_window) {
  wait_for_previous_grid();
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  if (item >= p.B * p.Hq) return;
  if (kShort && fuse_merges_window(p))
    fuse_head_short(p, w, item, o, lse, fusion_weights, o_window, lse_window);
  else
    fuse_head<kBatched>(p, w, item, o, lse, fusion_weights);
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

// ---- the scan's read floor (decode_scan_probe, ScanProbe) ---------------------------------------
// Folds the words of u into x (what the probes read must not be dead code).
__device__ __forceinline__ void fold(uint32_t& x, const uint4& u) { x ^= u.x ^ u.y ^ u.z ^ u.w; }
// The probes store only when the fold hits this value (they read, they do not write).
constexpr uint32_t kProbeNeverValue = 0x9e3779b9u;
// The probes load the summary arrays as d25 does (ld.global.cs): with plain loads they were
// ~10% slower than d25's launch 1 itself on the H100 (session 12 run 2), no floor then.
constexpr ScanLoads kStream = ScanLoads::streaming;

// ScanProbe::loads_only: fused_window_score_kernel's grid and global loads (the fast window tile
// with its value rows, kEarly; the coalesced score tile: rows, b', row scales, as d25 loads
// them), nothing else.
template <class Summary>
__global__ void __launch_bounds__(kFastThreads) scan_loads_only_kernel(DecodeParams p,
                                                                       uint32_t* sink) {
  constexpr int D = kFastDim;
  const int64_t n_win_blocks = p.n_win_tiles * p.B * p.Hkv, block = blockIdx.x;
  uint32_t x = 0;
  if (block < n_win_blocks) {
    constexpr int kPieces = kDecodeTileSlots * D / 8 / kFastThreads;
    const int64_t tile = block % p.n_win_tiles, bg = block / p.n_win_tiles;
    const int64_t lo = p.win_lo + tile * kDecodeTileSlots;
    const int64_t hi = min(p.T - 1, lo + kDecodeTileSlots - 1);
    const __nv_bfloat16* k = p.k + bg * p.slot_cap * D;
    const __nv_bfloat16* v = p.v + bg * p.slot_cap * D;
    const int64_t slot = lo + threadIdx.x % D;
    uint4 u[D / 8 + kPieces];
#pragma unroll
    for (int i = 0; i < D / 8; ++i)
      u[i] = slot <= hi ? __ldg(reinterpret_cast<const uint4*>(k + slot * D) + i) : uint4{};
#pragma unroll
    for (int e = 0; e < kPieces; ++e) {
      const int piece = threadIdx.x + kFastThreads * e, row = piece / (D / 8);
      u[D / 8 + e] = lo + row <= hi
                         ? __ldg(reinterpret_cast<const uint4*>(v + (lo + row) * D) + piece % (D / 8))
                         : uint4{};
    }
#pragma unroll
    for (const uint4& piece : u) fold(x, piece);
  } else {
    constexpr int kLanesPerRow = kCoalescedDim / Summary::kPerLoad;
    constexpr int kRowsPerStep = kWarp / kLanesPerRow;
    constexpr int kWarps = kFastThreads / kWarp;
    constexpr int kSteps = kScoreThreads / kRowsPerStep / kWarps;
    constexpr int kPerThread = kScoreThreads / kFastThreads;
    const int64_t j = block - n_win_blocks, item = j / p.n_score_tiles;
    const int64_t tile_first = j % p.n_score_tiles * kScoreThreads;
    const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, part = lane % kLanesPerRow;
    const uint4* rows = reinterpret_cast<const uint4*>(
        static_cast<const typename Summary::Elem*>(p.summary_key) + item * p.chunk_cap * p.d / Summary::kPerElem);
    uint4 u[kSteps];
    float extra[2 * kPerThread];
#pragma unroll
    for (int step = 0; step < kSteps; ++step) {
      const int64_t cc = tile_first + warp * (kSteps * kRowsPerStep) + step * kRowsPerStep +
                         lane / kLanesPerRow;
      u[step] = cc < p.n_cand ? scan_load<kStream>(rows + cc * kLanesPerRow + part) : uint4{};
    }
#pragma unroll
    for (int r = 0; r < kPerThread; ++r) {
      const int64_t c = tile_first + threadIdx.x + r * kFastThreads, row = item * p.chunk_cap + c;
      extra[2 * r] = c < p.n_cand ? scan_load<kStream>(p.summary_bias + row) : 0.0f;
      extra[2 * r + 1] =
          c < p.n_cand && p.summary_scale ? scan_load<kStream>(p.summary_scale + row) : 1.0f;
    }
#pragma unroll
    for (const uint4& piece : u) fold(x, piece);
#pragma unroll
    for (float f : extra) x ^= __float_as_uint(f);
  }
  if (x == kProbeNeverValue) sink[0] = x;
}

// ScanProbe::flat_read: n 16-byte words from `a`, 4 loads per thread in flight per step.
__device__ void read_flat(const uint4* a, int64_t n, uint32_t& x) {
  constexpr int kInFlight = 4;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + (kInFlight - 1) * stride < n; i += kInFlight * stride) {
    uint4 u[kInFlight];
#pragma unroll
    for (int e = 0; e < kInFlight; ++e) u[e] = scan_load<kStream>(a + i + e * stride);
#pragma unroll
    for (int e = 0; e < kInFlight; ++e) fold(x, u[e]);
  }
  for (; i < n; i += stride) fold(x, scan_load<kStream>(a + i));
}

// ScanProbe::tail_handoffs: a tail kernel without work (waits for the previous grid, lets the
// next one launch).
__global__ void empty_tail_kernel() {
  wait_for_previous_grid();
  allow_next_grid();
}

__global__ void flat_read_kernel(const uint4* a, int64_t na, const uint4* b, int64_t nb,
                                 const uint4* c, int64_t nc, uint32_t* sink) {
  uint32_t x = 0;
  read_flat(a, na, x);
  read_flat(b, nb, x);
  read_flat(c, nc, x);
  if (x == kProbeNeverValue) sink[0] = x;
}

// ---- fp8 summaries: a warp per row ----------------------------------------------------------
// The row's power-of-two scale s (the smallest with amax / s <= 448) and e4m3(k' / s).
__global__ void quantize_fp8_kernel(const float* key, int64_t rows, int64_t d,
                                    __nv_fp8_storage_t* out, float* scale) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  if (row >= rows) return;
  const int lane = threadIdx.x % kWarp;
  const float* x = key + row * d;
  float amax = 0.0f;
  for (int64_t i = lane; i < d; i += kWarp) amax = fmaxf(amax, fabsf(x[i]));
  amax = warp_max(amax);
  float s = 1.0f;
  if (amax > 0.0f && isfinite(amax)) {
    int e = 0;
    frexpf(amax / 448.0f, &e);  // amax / 448 in [2^(e-1), 2^e)
    s = ldexpf(1.0f, e);
    if (amax <= 224.0f * s) s *= 0.5f;  // exact products: fix a rounded quotient either way
    if (amax > 448.0f * s) s *= 2.0f;
  }
  for (int64_t i = lane; i < d; i += kWarp)
    out[row * d + i] = __nv_cvt_float_to_fp8(x[i] / s, __NV_SATFINITE, __NV_E4M3);
  if (lane == 0) scale[row] = s;
}

// One warp per row: s = amax / 7 and the codes round(x / s) in [-7, 7] by correctly rounded fp32
// divisions (the build's --use_fast_math would make `/` approximate), stored as Int4Summary
// reads them (oracle::int4_row_scale, int4_code). d even.
__global__ void quantize_int4_kernel(const float* key, int64_t rows, int64_t d, uint8_t* out,
                                     float* scale) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  if (row >= rows) return;
  const int lane = threadIdx.x % kWarp;
  const float* x = key + row * d;
  float amax = 0.0f;
  for (int64_t i = lane; i < d; i += kWarp) amax = fmaxf(amax, fabsf(x[i]));
  amax = warp_max(amax);
  float s = amax > 0.0f && isfinite(amax) ? __fdiv_rn(amax, 7.0f) : 1.0f;
  if (s == 0.0f) s = 1.0f;
  auto code = [s](float v) {
    const float ratio = __fdiv_rn(v, s);
    const int n = isnan(ratio) ? 0 : min(7, max(-7, __float2int_rn(fminf(fmaxf(ratio, -8.0f), 8.0f))));
    return static_cast<uint32_t>(n + 8);
  };
  for (int64_t j = lane; j < d / 2; j += kWarp)
    out[row * (d / 2) + j] = static_cast<uint8_t>(code(x[2 * j]) | code(x[2 * j + 1]) << 4);
  if (lane == 0) scale[row] = s;
}

// One warp per row of int4_h (quantize_summaries_int4h): s = amax / 7 as int4's, s16 = s rounded
// up to fp16 (__float2half_ru: amax / s16 <= 7, so the codes stay in [-7, 7]), the codes
// round(x / s16) stored as int4's, the pair (s16, b' to the nearest fp16). A refused row (s
// outside fp16's normal range or not finite; b' not finite or beyond fp16's range) writes
// 2 row + (0: summary_key, 1: summary_bias) into *refused by atomicMin (the host reports the
// first one).
__global__ void quantize_int4h_kernel(const float* key, const float* bias, int64_t rows, int64_t d,
                                      uint8_t* out, __half2* pairs, unsigned long long* refused) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  if (row >= rows) return;
  const int lane = threadIdx.x % kWarp;
  const float* x = key + row * d;
  float amax = 0.0f;
  bool finite = true;
  for (int64_t i = lane; i < d; i += kWarp) amax = fmaxf(amax, fabsf(x[i])), finite &= isfinite(x[i]);
  amax = warp_max(amax);
  finite = __all_sync(0xffffffffu, finite);
  const float s = amax > 0.0f ? __fdiv_rn(amax, 7.0f) : 1.0f;  // an all-zero row: 1, as int4's
  const __half s16 = __float2half_ru(s);
  const float s16f = __half2float(s16);
  const bool key_ok = finite && s >= 0x1p-14f && s16f <= 65504.0f;
  const float b = bias[row];
  const __half b16 = __float2half_rn(b);
  const bool bias_ok = isfinite(b) && !__hisinf(b16);
  if (!key_ok || !bias_ok) {
    if (lane == 0) atomicMin(refused, 2ull * static_cast<unsigned long long>(row) + (key_ok ? 1ull : 0ull));
    return;
  }
  auto code = [s16f](float v) {
    const float ratio = __fdiv_rn(v, s16f);
    const int n = min(7, max(-7, __float2int_rn(fminf(fmaxf(ratio, -8.0f), 8.0f))));
    return static_cast<uint32_t>(n + 8);
  };
  for (int64_t j = lane; j < d / 2; j += kWarp)
    out[row * (d / 2) + j] = static_cast<uint8_t>(code(x[2 * j]) | code(x[2 * j + 1]) << 4);
  if (lane == 0) pairs[row] = __halves2half2(s16, b16);
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// int4 codes either way (int4: fp32 scale and b'; int4_h: the (s16, b'16) pairs beside them).
bool is_int4(SummaryType type) { return type == SummaryType::int4 || type == SummaryType::int4_h; }

// Host copies of the slot geometry (reference/SEMANTICS.md §1–2, Eq. 1) for the query at T-1.
int64_t window_edge_chunk(int64_t t, int64_t W, int64_t S) {
  const int64_t num = t - W + 1;
  return num >= 0 ? num / S : -((-num + S - 1) / S);
}

DecodeParams params_of(const MechanismSpec& spec, const DecodeCache& cache, const DecodeQuery& q) {
  DecodeParams p{};
  p.B = cache.B, p.T = cache.T, p.Hq = cache.Hq, p.Hkv = cache.Hkv, p.G = cache.Hq / cache.Hkv;
  p.d = cache.d, p.dv = cache.dv, p.S = spec.S, p.W = spec.W, p.K = spec.K;
  p.slot_cap = cache.slot_capacity > 0 ? cache.slot_capacity : cache.T;
  p.n_chunks = cache.T / spec.S;
  p.chunk_cap = cache.chunk_capacity > 0 ? cache.chunk_capacity : p.n_chunks;
  const int64_t t = cache.T - 1, tau = window_edge_chunk(t, spec.W, spec.S);
  p.n_cand = std::max<int64_t>(0, std::min(tau, p.n_chunks));
  p.win_lo = tau > 0 ? tau * spec.S : 0;
  p.n_win_tiles = ceil_div(t - p.win_lo + 1, kDecodeTileSlots);
  p.n_score_tiles = std::max<int64_t>(1, ceil_div(p.n_chunks, kScoreThreads));
  p.scale = spec.scale != 0.0 ? static_cast<float>(spec.scale)
                              : static_cast<float>(1.0 / std::sqrt(static_cast<double>(cache.d)));
  p.landmarks = spec.landmarks, p.softmax1 = spec.softmax1;
  p.hierarchical = spec.fusion == Fusion::hierarchical;
  p.group_rule = static_cast<int>(spec.group_rule);
  p.q = static_cast<const __nv_bfloat16*>(q.q);
  p.q_retrieval = static_cast<const __nv_bfloat16*>(q.q_retrieval ? q.q_retrieval : q.q);
  p.k = static_cast<const __nv_bfloat16*>(cache.k);
  p.v = static_cast<const __nv_bfloat16*>(cache.v);
  p.summary_key = cache.summary_key;
  p.summary_bias = cache.summary_bias;
  const bool scaled = cache.summary_type != SummaryType::bf16;
  p.summary_scale = scaled && cache.summary_type != SummaryType::int4_h ? cache.summary_scale : nullptr;
  p.summary_key_bf16 = scaled && p.hierarchical
                           ? static_cast<const __nv_bfloat16*>(cache.summary_key_bf16)
                           : nullptr;
  p.summary_scale_bias = cache.summary_type == SummaryType::int4_h
                             ? static_cast<const __half2*>(cache.summary_scale_bias)
                             : nullptr;
  return p;
}

// Byte sizes of the scratch arrays, in DecodeScratch order (each rounded to 256 bytes).
constexpr int kScratchArrays = 10;
struct ScratchSizes {
  size_t bytes[kScratchArrays];
};
ScratchSizes scratch_sizes(const DecodeParams& p) {
  const size_t BH = p.B * p.Hq, BG = p.B * p.Hkv;
  return {{BH * p.n_chunks * 4, BH * p.n_score_tiles * 8, BH * p.n_win_tiles * (p.dv + 2) * 4,
           BH * p.dv * 4, BH * 4, BG * p.K * 4, BH * p.K * (p.dv + 1) * 4,
           BG * p.n_score_tiles * tile_keep(p) * 4, BG * p.n_score_tiles * tile_keep(p) * 4,
           BH * p.K * 4}};
}
size_t round_up(size_t x) { return (x + 255) / 256 * 256; }

void require(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument(message);
}

void check_launch(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    throw std::runtime_error(std::string("decode_step: ") + what + ": " + cudaGetErrorString(err));
}

}  // namespace
}  // namespace detail

void validate_decode(const MechanismSpec& spec, const DecodeCache& cache, const DecodeQuery& q) {
  using detail::require;
  const auto field = [](const char* name, int64_t got, const char* expected) {
    return std::string("decode: ") + name + " = " + std::to_string(got) + ", expected " + expected;
  };
  require(cache.B >= 1, field("B", cache.B, ">= 1"));
  require(cache.T >= 1, field("T", cache.T, ">= 1"));
  require(cache.Hkv >= 1 && cache.Hq >= cache.Hkv && cache.Hq % cache.Hkv == 0,
          field("Hq", cache.Hq, "a positive multiple of Hkv"));
  require(cache.B * cache.Hq <= 65535, field("B * Hq", cache.B * cache.Hq, "<= 65535"));
  require(cache.Hq / cache.Hkv <= 64, field("Hq / Hkv", cache.Hq / cache.Hkv, "<= 64"));
  require(cache.d >= 1 && cache.d <= detail::kMaxDim, field("d", cache.d, "1..256"));
  require(cache.dv >= 1 && cache.dv <= detail::kMaxDim, field("dv", cache.dv, "1..256"));
  require(spec.S >= 1, field("S", spec.S, ">= 1"));
  require(!spec.landmarks || spec.S >= 2, field("S", spec.S, ">= 2 with landmarks"));
  require(spec.W >= 1, field("W", spec.W, ">= 1"));
  require(spec.K >= 0 && spec.K <= 1024, field("K", spec.K, "0..1024"));
  require(spec.fusion == Fusion::flat || spec.fusion == Fusion::hierarchical,
          "decode: fusion must be flat or hierarchical (a selecting mechanism)");
  require(spec.key_rule != KeyRule::exact,
          "decode: key_rule exact has no summaries to keep in the cache");
  require(cache.slot_capacity == 0 || cache.slot_capacity >= cache.T,
          field("slot_capacity", cache.slot_capacity, "0 or >= T"));
  require(cache.chunk_capacity == 0 || cache.chunk_capacity >= cache.T / spec.S,
          field("chunk_capacity", cache.chunk_capacity, "0 or >= T / S"));
  require(cache.k && cache.v && q.q, "decode: k, v and q must be device pointers, got null");
  require(cache.T / spec.S == 0 || (cache.summary_key && cache.summary_bias),
          "decode: summary_key and summary_bias must be device pointers, got null");
  require(cache.summary_type == SummaryType::bf16 || cache.summary_type == SummaryType::fp8_e4m3 ||
              cache.summary_type == SummaryType::int4 || cache.summary_type == SummaryType::int4_h,
          field("summary_type", static_cast<int64_t>(cache.summary_type),
                "0 (bf16), 1 (fp8_e4m3), 2 (int4) or 3 (int4_h)"));
  const bool scaled = cache.summary_type != SummaryType::bf16;
  const bool pairs = cache.summary_type == SummaryType::int4_h;
  require(!scaled || pairs || cache.T / spec.S == 0 || cache.summary_scale,
          "decode: summary_scale must be a device pointer with fp8_e4m3 or int4 summaries, got null");
  require(!pairs || cache.T / spec.S == 0 || cache.summary_scale_bias,
          "decode: summary_scale_bias must be a device pointer with int4_h summaries, got null");
  require(!scaled || spec.fusion != Fusion::hierarchical || cache.T / spec.S == 0 ||
              cache.summary_key_bf16,
          "decode: summary_key_bf16 must be a device pointer with fp8_e4m3, int4 or int4_h summaries "
          "and hierarchical fusion (its s_hat are fusion logits: gpu/NOTES.md \"decode\"), got null");
  require(!detail::is_int4(cache.summary_type) || cache.d % 2 == 0,
          field("d", cache.d, "even with int4 or int4_h summaries (two codes per byte)"));
}

size_t decode_workspace_bytes(const MechanismSpec& spec, const DecodeCache& cache) {
  const detail::DecodeParams p = detail::params_of(spec, cache, DecodeQuery{});
  size_t total = 0;
  for (size_t b : detail::scratch_sizes(p).bytes) total += detail::round_up(b);
  return total;
}

namespace detail {
namespace {

// The launch shapes both kernels share.
struct LaunchShape {
  bool fast, win_staged, vectorised, coalesced, fast_chunk, chunk_staged;
  size_t win_smem, chunk_smem, key_smem;
  size_t win_smem_early, chunk_smem_early;  // the fused kernel's tiles (value rows staged)
};

LaunchShape launch_shape(const DecodeParams& p, SummaryType type) {
  LaunchShape s{};
  const size_t q_smem = kWarpsPerBlock * p.d * sizeof(float);
  // The fast tiles (d = dv = 64, G <= 16, 16-byte aligned rows) or the generic warp tiles.
  s.fast = p.d == kFastDim && p.dv == kFastDim && p.G <= kFastMaxGroup &&
           reinterpret_cast<uintptr_t>(p.k) % 16 == 0 && reinterpret_cast<uintptr_t>(p.v) % 16 == 0;
  const size_t win_stage = stage_bytes(kDecodeTileSlots, p.d, p.dv);
  s.win_staged = win_stage > 0;
  s.win_smem = s.fast ? fast_tile_smem(p.G) : q_smem + win_stage;
  s.win_smem_early = s.fast ? fast_tile_smem(p.G, true) : q_smem + win_stage;
  // 16-byte loads need 16-byte aligned rows of whole loads.
  const int per_load = is_int4(type)                    ? Int4Summary::kPerLoad
                       : type == SummaryType::fp8_e4m3 ? Fp8Summary::kPerLoad
                                                       : Bf16Summary::kPerLoad;
  s.vectorised = p.d % per_load == 0 && reinterpret_cast<uintptr_t>(p.summary_key) % 16 == 0;
  s.coalesced = s.vectorised && p.d == kCoalescedDim;
  const size_t chunk_stage = stage_bytes(p.S, p.d, p.dv);
  s.chunk_staged = chunk_stage > 0;
  s.fast_chunk = s.fast && p.S <= kDecodeTileSlots;
  s.chunk_smem = std::max(s.fast_chunk ? fast_tile_smem(p.G) : 0, q_smem + chunk_stage);
  s.chunk_smem_early =
      std::max(s.fast_chunk ? fast_tile_smem(p.G, true) : 0, q_smem + chunk_stage);
  const int64_t kept = p.n_cand > p.K ? kept_candidates(p) : 0;
  s.key_smem = kept <= kSelectSmemKeys ? kept * sizeof(uint32_t) : 0;
  return s;
}

// Calls f(Summary{}) with the element type of `type` (one instantiation per summary type).
template <class F>
void with_summary(SummaryType type, F&& f) {
  if (type == SummaryType::fp8_e4m3) f(Fp8Summary{});
  else if (type == SummaryType::int4 || type == SummaryType::int4_h) f(Int4Summary{});
  else f(Bf16Summary{});
}

// d5: seven launches (window, score, group scores, select, chunk, fuse).
template <class Summary>
void launch_d5(const DecodeParams& p, const LaunchShape& s, const DecodeScratch& w,
               const DecodeOutputs& out, cudaStream_t stream) {
  const unsigned bh = static_cast<unsigned>(p.B * p.Hq);
  const unsigned bg = static_cast<unsigned>(p.B * p.Hkv);
  static_assert(kWarpsPerBlock * kWarp == kFastThreads, "tile kernels run 128 threads");
  decode_window_kernel<<<dim3(static_cast<unsigned>(p.n_win_tiles), bg), kFastThreads,
                         s.win_smem, stream>>>(p, s.fast, s.win_staged, w.win_part);
  check_launch("window");
  decode_score_kernel<Summary><<<dim3(static_cast<unsigned>(p.n_score_tiles), bh), kScoreThreads,
                                 p.d * sizeof(float), stream>>>(p, s.vectorised, s.coalesced,
                                                                w.scores, w.score_part);
  check_launch("score");
  if (p.K > 0 && p.n_cand > p.K) {
    decode_group_score_kernel<false><<<dim3(static_cast<unsigned>(ceil_div(p.n_cand, kScoreThreads)),
                                     bg),
                                kScoreThreads, 0, stream>>>(p, w);
    check_launch("group score");
  }
  decode_select_kernel<false><<<bg, kSelectThreads, s.key_smem, stream>>>(p, w, out.o_window,
                                                                   out.lse_window);
  check_launch("select");
  if (p.K > 0) {
    decode_chunk_kernel<false, false><<<dim3(static_cast<unsigned>(p.K), bg), kFastThreads,
                                 s.chunk_smem, stream>>>(p, s.fast_chunk, s.chunk_staged,
                                                         w.selection, w.chunk_part,
                                                         w.fusion_logit);
    check_launch("chunk");
  }
  decode_fuse_kernel<false, false><<<static_cast<unsigned>(ceil_div(bh, kWarpsPerBlock)),
                              kWarpsPerBlock * kWarp, 0, stream>>>(p, w, out.o, out.lse,
                                                                   out.fusion_weights,
                                                                   out.o_window, out.lse_window);
  check_launch("fuse");
}

// Launches kernel<<<grid, block, smem, stream>>>(args...); `after_previous` (the fused kernel's
// tails) with programmatic stream serialization, so that its blocks launch while the previous
// kernel finishes and wait in wait_for_previous_grid() (CUDA graphs capture the edge).
template <class... Params, class... Args>
void launch_kernel(const char* what, void (*kernel)(Params...), dim3 grid, unsigned block,
                   size_t smem, cudaStream_t stream, bool after_previous, Args... args) {
  const cudaError_t err =
      launch_programmatic(after_previous, kernel, grid, block, smem, stream, args...);
  if (err != cudaSuccess)
    throw std::runtime_error(std::string("decode_step: ") + what + ": " + cudaGetErrorString(err));
  check_launch(what);
}

// Launch 1 (window + score tiles in one grid, the stream loaded ld.global.cs as d25 loads it),
// `tiles` (1, or 2: d34) score tiles per block; `mma_dots` (d39) the int4 score tiles' dots on
// the tensor cores where the rows are coalesced (two tiles per block); `pairs` (d40, int4_h
// summaries, two tiles per block) the rows' (s16, b'16) pairs in place of scale and b'.
template <class Summary>
void launch_window_score(const DecodeParams& p, const LaunchShape& s, const DecodeScratch& w,
                         cudaStream_t stream, int tiles = 1, bool mma_dots = false,
                         bool pairs = false) {
  const int64_t blocks1 =
      p.n_win_tiles * p.B * p.Hkv + ceil_div(p.n_score_tiles, tiles) * p.B * p.Hq;
  require(blocks1 < (int64_t{1} << 31), "decode: too many tiles for one grid");
  auto* kernel = tiles == 2 ? fused_window_score_kernel<Summary, 2>
                            : fused_window_score_kernel<Summary>;
  if constexpr (std::is_same<Summary, Int4Summary>::value)
    if (pairs) {
      require(tiles == 2, "decode: int4_h summaries are scanned two tiles per block (d40)");
      kernel = mma_dots && s.coalesced ? fused_window_score_kernel<Int4Summary, 2, true, true>
                                       : fused_window_score_kernel<Int4Summary, 2, false, true>;
    } else if (mma_dots && s.coalesced && tiles == 2) {
      kernel = fused_window_score_kernel<Int4Summary, 2, true>;
    }
  launch_kernel("window + score", kernel, dim3(static_cast<unsigned>(blocks1)), kFastThreads,
                std::max(s.win_smem_early, p.d * sizeof(float)), stream, false, p, w, s.fast,
                s.win_staged, s.vectorised, s.coalesced);
}

// The scratch arrays of one step, laid out in `workspace` (decode_workspace_bytes).
DecodeScratch scratch_at(const DecodeParams& p, void* workspace) {
  const ScratchSizes sizes = scratch_sizes(p);
  char* base = static_cast<char*>(workspace);
  void* parts[kScratchArrays];
  for (int i = 0; i < kScratchArrays; ++i) parts[i] = base, base += round_up(sizes.bytes[i]);
  return DecodeScratch{static_cast<float*>(parts[0]), static_cast<float2*>(parts[1]),
                       static_cast<float*>(parts[2]), static_cast<float*>(parts[3]),
                       static_cast<float*>(parts[4]), static_cast<int32_t*>(parts[5]),
                       static_cast<float*>(parts[6]), static_cast<uint32_t*>(parts[7]),
                       static_cast<int32_t*>(parts[8]), static_cast<float*>(parts[9])};
}

// d29, d34, d35, d36 (the fused kernel): launch 1 (window + score tiles in one grid), then the
// tails by programmatic dependent launch: group scores (d12's warp sorts for K <= 32), select,
// chunk tiles (on the tensor cores where their shape allows: d17, with d19's landmark mask and
// d29's evict-first K/V copies; d13's warp tiles otherwise), fuse (merging the window where
// fuse_merges_window: d13). `score_tiles` (d34: 2) the score tiles per launch-1 block;
// `short_tails` (d35) the select without its warp sorts where select_presorted and the
// tensor-core chunk tiles on four warps; `select_in_chunks` (d36) no select launch where
// chunks_can_select: each chunk tile selects; `mma_dots` (d39) the int4 score tiles' dots on
// the tensor cores; `pairs` (d40) the int4_h rows' (s16, b'16) pairs (launch_window_score).
template <class Summary>
void launch_fused(const DecodeParams& p, const LaunchShape& s, const DecodeScratch& w,
                  const DecodeOutputs& out, cudaStream_t stream, int score_tiles,
                  bool short_tails, bool select_in_chunks, bool mma_dots = false,
                  bool pairs = false) {
  const unsigned bh = static_cast<unsigned>(p.B * p.Hq);
  const unsigned bg = static_cast<unsigned>(p.B * p.Hkv);
  const bool mma_chunks = p.K > 0 && chunk_by_mma(p, s.fast_chunk);
  const bool quad_chunks = mma_chunks && short_tails;
  const bool chunks_select = quad_chunks && select_in_chunks && chunks_can_select(p);
  launch_window_score<Summary>(p, s, w, stream, score_tiles, mma_dots, pairs);
  if (p.K > 0 && p.n_cand > p.K)
    launch_kernel("group score", decode_group_score_kernel<true>,
                  dim3(static_cast<unsigned>(ceil_div(p.n_cand, kScoreThreads)), bg),
                  kScoreThreads, 0, stream, true, p, w);
  if (chunks_select)
    launch_kernel("chunk (selecting)", decode_chunk_mma4_kernel<true>,
                  dim3(static_cast<unsigned>(p.K), bg), kQuadChunkWarps * kWarp, 0, stream, true,
                  p, w);
  else if (select_by_sorts(p))
    launch_kernel("select",
                  short_tails && select_presorted(p) ? decode_select_sorted_kernel<true>
                                                     : decode_select_sorted_kernel<false>,
                  dim3(bg), kShortSelectThreads, 0, stream, true, p, w, out.o_window,
                  out.lse_window);
  else
    launch_kernel("select", decode_select_kernel<true>, dim3(bg), kSelectThreads, s.key_smem,
                  stream, true, p, w, out.o_window, out.lse_window);
  if (chunks_select) {
    // the chunk tiles ran above
  } else if (quad_chunks)
    launch_kernel("chunk", decode_chunk_mma4_kernel<false>, dim3(static_cast<unsigned>(p.K), bg),
                  kQuadChunkWarps * kWarp, 0, stream, true, p, w);
  else if (mma_chunks)
    launch_kernel("chunk", decode_chunk_mma_kernel,
                  dim3(static_cast<unsigned>(ceil_div(p.K, kMmaChunkWarps)), bg),
                  kMmaChunkWarps * kWarp, 0, stream, true, p,
                  static_cast<const int32_t*>(w.selection), w.chunk_part, w.fusion_logit);
  else if (p.K > 0)
    launch_kernel("chunk", decode_chunk_kernel<true, true>,
                  dim3(static_cast<unsigned>(p.K), bg), kFastThreads, s.chunk_smem_early, stream,
                  true, p, s.fast_chunk, s.chunk_staged, static_cast<const int32_t*>(w.selection),
                  w.chunk_part, w.fusion_logit);
  launch_kernel("fuse", decode_fuse_kernel<true, true>,
                dim3(static_cast<unsigned>(ceil_div(bh, kWarpsPerBlock))), kWarpsPerBlock * kWarp,
                0, stream, true, p, w, out.o, out.lse, out.fusion_weights, out.o_window,
                out.lse_window);
}

// The removed versions (gpu/NOTES.md "Kernels removed in session 17"; kRemovedDecodeKernels,
// decode.hpp): refused with a message that names them, the commit that holds their code and the
// kept ones.
constexpr const char* kRemovedIn17 =
    " was removed in session 17 (gpu/NOTES.md \"Kernels removed in session 17\"; its code is at "
    "commit 5a3f9d2); expected one of ";
const char* removed_kernel_name(int code) {
  for (const RemovedDecodeKernel& removed : kRemovedDecodeKernels)
    if (removed.code == code) return removed.name;
  return nullptr;
}

void require_kept_kernel(DecodeKernel kernel) {
  constexpr const char* kKept =
      "0 (fused = d39), 1 (d5), 15 (d29), 20 (d34), 21 (d35), 22 (d36), 25 (d39) or 26 (d40)";
  const int code = static_cast<int>(kernel);
  if (const char* name = removed_kernel_name(code))
    throw std::invalid_argument("decode: kernel " + std::to_string(code) + " (" + name + ")" +
                                kRemovedIn17 + kKept);
  require(kernel == DecodeKernel::fused || kernel == DecodeKernel::d5 ||
              kernel == DecodeKernel::d29 || kernel == DecodeKernel::d34 ||
              kernel == DecodeKernel::d35 || kernel == DecodeKernel::d36 ||
              kernel == DecodeKernel::d39 || kernel == DecodeKernel::d40,
          "decode: kernel = " + std::to_string(code) + ", expected " + kKept);
}

}  // namespace
}  // namespace detail

void decode_step(const MechanismSpec& spec, const DecodeCache& cache, const DecodeQuery& q,
                 const DecodeOutputs& out, void* workspace, cudaStream_t stream,
                 DecodeKernel kernel) {
  using namespace detail;
  require_kept_kernel(kernel);
  validate_decode(spec, cache, q);
  require(out.o && out.lse, "decode: outputs o and lse must be device pointers, got null");
  require(workspace != nullptr || decode_workspace_bytes(spec, cache) == 0,
          "decode: workspace must be a device pointer, got null");
  const DecodeParams p = params_of(spec, cache, q);
  require(cache.summary_type != SummaryType::int4_h || kernel == DecodeKernel::d40,
          "decode: summary_type 3 (int4_h) is scanned by kernel 26 (d40) only, got kernel " +
              std::to_string(static_cast<int>(kernel)));
  DecodeScratch w = scratch_at(p, workspace);
  if (out.surrogate) w.scores = out.surrogate;
  if (out.selection) w.selection = out.selection;
  const LaunchShape shape = launch_shape(p, cache.summary_type);
  if (kernel == DecodeKernel::d5) {
    with_summary(cache.summary_type, [&](auto summary) {
      launch_d5<decltype(summary)>(p, shape, w, out, stream);
    });
    return;
  }
  // fused = d39 (since session 18, once its multi-tile tests had passed on a device; d36 in
  // sessions 16-17, d29 before; gpu/NOTES.md "d39"); d29: d25's launch 1 (ld.global.cs) with the chunk
  // tiles' K/V rows loaded evict-first; d34: d29 with two score tiles per launch-1 block; d35: d29 (int4: d34) with the
  // select's sorts skipped and the chunk tiles on four warps (the same bits); d36: d35 whose
  // chunk tiles select; d39: d36 with the int4 score tiles' dots on the tensor cores (coalesced
  // rows); d40: d39 whose int4_h score tiles read (s16, b'16) pairs.
  const DecodeKernel k = kernel == DecodeKernel::fused ? DecodeKernel::d39 : kernel;
  const bool pairs = k == DecodeKernel::d40;  // int4_h comes only with d40 (required above)
  const bool d39 = k == DecodeKernel::d39 || k == DecodeKernel::d40;
  const bool d36 = k == DecodeKernel::d36 || d39, d35 = k == DecodeKernel::d35 || d36;
  // d34: two score tiles per launch-1 block; d35 only for int4 summaries (fp8's two-tile
  // block needs 127 registers and was 0.1-1.1 us slower than d29 at B = 8 in session 15).
  const int score_tiles =
      k == DecodeKernel::d34 || (d35 && is_int4(cache.summary_type)) ? 2 : 1;
  with_summary(cache.summary_type, [&](auto summary) {
    launch_fused<decltype(summary)>(p, shape, w, out, stream, score_tiles, d35, d36, d39,
                                    pairs && cache.summary_type == SummaryType::int4_h);
  });
}

void decode_scan_probe(const MechanismSpec& spec, const DecodeCache& cache, const DecodeQuery& q,
                       void* workspace, ScanProbe probe, cudaStream_t stream) {
  using namespace detail;
  const int code = static_cast<int>(probe);
  constexpr const char* kKeptProbes =
      "2 (d25_scan), 3 (loads_only), 4 (flat_read) or 5 (tail_handoffs)";
  if (code == 0 || code == 1)
    throw std::invalid_argument(std::string("decode_scan_probe: probe ") + std::to_string(code) +
                                (code == 0 ? " (d21_scan)" : " (d24_scan)") + kRemovedIn17 +
                                kKeptProbes);
  validate_decode(spec, cache, q);
  require(workspace != nullptr, "decode_scan_probe: workspace must be a device pointer, got null");
  const DecodeParams p = params_of(spec, cache, q);
  require(p.d == kFastDim && p.dv == kFastDim,
          "decode_scan_probe: d = dv = 64 expected, got d = " + std::to_string(p.d) +
              ", dv = " + std::to_string(p.dv));
  const DecodeScratch w = scratch_at(p, workspace);
  const LaunchShape shape = launch_shape(p, cache.summary_type);
  const SummaryType type = cache.summary_type;
  require(type != SummaryType::int4_h || probe == ScanProbe::flat_read,
          "decode_scan_probe: int4_h summaries have the flat_read probe only (probe 4)");
  auto* sink = reinterpret_cast<uint32_t*>(w.scores);
  switch (probe) {
    case ScanProbe::d25_scan:  // d25's launch 1, d29's
      with_summary(type, [&](auto summary) {
        launch_window_score<decltype(summary)>(p, shape, w, stream);
      });
      return;
    case ScanProbe::loads_only: {
      require(shape.fast && shape.coalesced,
              "decode_scan_probe: loads_only needs 16-byte aligned K/V and summary rows");
      const int64_t blocks = p.n_win_tiles * p.B * p.Hkv + p.n_score_tiles * p.B * p.Hq;
      require(blocks < (int64_t{1} << 31), "decode_scan_probe: too many tiles for one grid");
      with_summary(type, [&](auto summary) {
        launch_kernel("loads only", scan_loads_only_kernel<decltype(summary)>,
                      dim3(static_cast<unsigned>(blocks)), kFastThreads, 0, stream, false, p, sink);
      });
      return;
    }
    case ScanProbe::flat_read: {
      const int64_t rows = p.B * p.Hq * p.chunk_cap;
      const int64_t key_bytes = is_int4(type)                   ? rows * p.d / 2
                                : type == SummaryType::fp8_e4m3 ? rows * p.d
                                                                : rows * p.d * 2;
      // int4_h: the codes and the (s16, b'16) pairs (d40's scan bytes), as two arrays
      const bool pairs = type == SummaryType::int4_h, scaled = type != SummaryType::bf16 && !pairs;
      const void* second = pairs ? cache.summary_scale_bias : static_cast<const void*>(cache.summary_bias);
      const void* third = pairs ? nullptr : static_cast<const void*>(cache.summary_scale);
      for (const void* a : {cache.summary_key, second, third})
        require(reinterpret_cast<uintptr_t>(a) % 16 == 0,
                "decode_scan_probe: flat_read needs 16-byte aligned summary arrays");
      const int sms = device_sm_count("decode_scan_probe");
      constexpr unsigned kThreads = 256, kBlocksPerSm = 8;
      launch_kernel("flat read", flat_read_kernel, dim3(static_cast<unsigned>(sms) * kBlocksPerSm),
                    kThreads, 0, stream, false, static_cast<const uint4*>(cache.summary_key),
                    key_bytes / 16, static_cast<const uint4*>(second), rows * 4 / 16,
                    static_cast<const uint4*>(third), scaled ? rows * 4 / 16 : int64_t{0}, sink);
      return;
    }
    case ScanProbe::tail_handoffs: {  // d29's tail grids (group scores, select, chunk, fuse)
      with_summary(type, [&](auto summary) {
        launch_window_score<decltype(summary)>(p, shape, w, stream);
      });
      const unsigned bg = static_cast<unsigned>(p.B * p.Hkv), bh = static_cast<unsigned>(p.B * p.Hq);
      const std::pair<dim3, unsigned> tails[] = {
          {dim3(static_cast<unsigned>(ceil_div(p.n_cand, kScoreThreads)), bg), kScoreThreads},
          {dim3(bg), kShortSelectThreads},
          {dim3(static_cast<unsigned>(ceil_div(std::max<int64_t>(p.K, 1), kMmaChunkWarps)), bg),
           kMmaChunkWarps * kWarp},
          {dim3(static_cast<unsigned>(ceil_div(bh, kWarpsPerBlock))), kWarpsPerBlock * kWarp}};
      for (const auto& [grid, block] : tails)
        launch_kernel("empty tail", empty_tail_kernel, grid, block, 0, stream, true);
      return;
    }
  }
  throw std::invalid_argument("decode_scan_probe: probe = " + std::to_string(code) +
                              ", expected " + kKeptProbes);
}

void quantize_summaries_fp8(const float* key, int64_t rows, int64_t d, void* key_fp8,
                            float* scale, cudaStream_t stream) {
  using namespace detail;
  require(rows >= 0 && d >= 1, "quantize_summaries_fp8: rows >= 0 and d >= 1 expected");
  if (rows == 0) return;
  require(key && key_fp8 && scale, "quantize_summaries_fp8: null device pointer");
  require(ceil_div(rows, kWarpsPerBlock) < (int64_t{1} << 31), "quantize_summaries_fp8: too many rows");
  quantize_fp8_kernel<<<static_cast<unsigned>(ceil_div(rows, kWarpsPerBlock)),
                        kWarpsPerBlock * kWarp, 0, stream>>>(
      key, rows, d, static_cast<__nv_fp8_storage_t*>(key_fp8), scale);
  check_launch("quantize fp8");
}

void quantize_summaries_int4(const float* key, int64_t rows, int64_t d, void* key_int4,
                             float* scale, cudaStream_t stream) {
  using namespace detail;
  require(rows >= 0 && d >= 2 && d % 2 == 0,
          "quantize_summaries_int4: rows >= 0 and an even d >= 2 expected, got rows = " +
              std::to_string(rows) + ", d = " + std::to_string(d));
  if (rows == 0) return;
  require(key && key_int4 && scale, "quantize_summaries_int4: null device pointer");
  require(ceil_div(rows, kWarpsPerBlock) < (int64_t{1} << 31), "quantize_summaries_int4: too many rows");
  quantize_int4_kernel<<<static_cast<unsigned>(ceil_div(rows, kWarpsPerBlock)),
                         kWarpsPerBlock * kWarp, 0, stream>>>(key, rows, d,
                                                              static_cast<uint8_t*>(key_int4), scale);
  check_launch("quantize int4");
}

void quantize_summaries_int4h(const float* key, const float* bias, int64_t rows, int64_t d,
                              void* key_int4, void* scale_bias, cudaStream_t stream) {
  using namespace detail;
  require(rows >= 0 && d >= 2 && d % 2 == 0,
          "quantize_summaries_int4h: rows >= 0 and an even d >= 2 expected, got rows = " +
              std::to_string(rows) + ", d = " + std::to_string(d));
  if (rows == 0) return;
  require(key && bias && key_int4 && scale_bias, "quantize_summaries_int4h: null device pointer");
  require(ceil_div(rows, kWarpsPerBlock) < (int64_t{1} << 31), "quantize_summaries_int4h: too many rows");
  unsigned long long* refused = nullptr;
  if (cudaMallocAsync(&refused, sizeof *refused, stream) != cudaSuccess)
    throw std::runtime_error("quantize_summaries_int4h: cudaMallocAsync of 8 bytes failed");
  cudaMemsetAsync(refused, 0xff, sizeof *refused, stream);
  quantize_int4h_kernel<<<static_cast<unsigned>(ceil_div(rows, kWarpsPerBlock)),
                          kWarpsPerBlock * kWarp, 0, stream>>>(
      key, bias, rows, d, static_cast<uint8_t*>(key_int4), static_cast<__half2*>(scale_bias), refused);
  unsigned long long first = 0;
  cudaMemcpyAsync(&first, refused, sizeof first, cudaMemcpyDeviceToHost, stream);
  cudaFreeAsync(refused, stream);
  const cudaError_t err = cudaStreamSynchronize(stream);
  check_launch("quantize int4_h");
  if (err != cudaSuccess)
    throw std::runtime_error(std::string("quantize_summaries_int4h: ") + cudaGetErrorString(err));
  if (first == ~0ull) return;
  const std::string row = std::to_string(first / 2);
  if (first % 2 == 0)
    throw std::invalid_argument(
        "quantize_summaries_int4h: summary_key row " + row +
        ": its scale max |k'| / 7 must be a finite number in fp16's normal range [2^-14, 65504] "
        "(row entries finite, max |k'| in [7 x 2^-14, 7 x 65504] or 0)");
  throw std::invalid_argument("quantize_summaries_int4h: summary_bias row " + row +
                              ": b' must be finite and within fp16's range (|b'| < 65520)");
}

}  // namespace hils::gpu
