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
// The stages' device code is under gpu/src/decode/: common.cuh (parameters, scratch, shared
// helpers), tiles.cuh (the softmax tiles of 1 and 4), scan.cuh (1, 2 and the fused step's launch
// 1), select.cuh (2b, 3), chunks.cuh (4, 4b), fuse.cuh (5), scan_probes.cuh (the scan's read
// floor); this unit holds their launch code (decode_step, decode_scan_probe, validate_decode,
// decode_workspace_bytes), decode_quantize.cu the summary quantizers.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

// The stage headers in stage order (each includes those it builds on).
#include "decode/common.cuh"
#include "decode/tiles.cuh"
#include "decode/scan.cuh"
#include "decode/select.cuh"
#include "decode/chunks.cuh"
#include "decode/fuse.cuh"
#include "decode/scan_probes.cuh"
#include "decode/host_checks.hpp"
#include "device_common.cuh"
#include "hils/gpu/decode.hpp"

namespace hils::gpu {
namespace detail {
namespace {

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
  p.summary_key_fp32 = p.hierarchical ? cache.summary_key_fp32 : nullptr;
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
  require(spec.fusion != Fusion::hierarchical || cache.T / spec.S == 0 || cache.summary_key_fp32,
          "decode: summary_key_fp32 must be a device pointer with hierarchical fusion, every summary "
          "store (the selected chunks' s_hat, the fusion logits, are read from its fp32 rows: "
          "gpu/NOTES.md \"decode\"), got null");
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
      kernel = mma_dots && s.coalesced ? fused_window_score_pairs_kernel<true>
                                       : fused_window_score_pairs_kernel<false>;
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

}  // namespace hils::gpu
