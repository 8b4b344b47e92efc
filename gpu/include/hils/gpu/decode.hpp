// Decode step (gpu/NOTES.md "decode"): one new query per sequence against a bf16 KV cache of T
// slots that also keeps the chunk summaries (k', b' per complete chunk, appended when the chunk
// completes). A step scores the T/S summaries, selects K chunks per KV group and attends
// K*S + W keys, split over many blocks (flash-decoding style). Same contract as the prefill
// (reference/SEMANTICS.md §2–5) for the query at slot T-1 of each sequence.
// C++17 and free of Eigen so that nvcc and plain C++ callers both include it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "hils/spec.hpp"

namespace hils::gpu {

// How the cache stores k' (gpu/NOTES.md "decode": the choice and its byte counts).
//   bf16:     the oracle's `score_precision = bf16`
//   fp8_e4m3: e4m3(k'_c,i / s_c) with s_c the row's power-of-two scale in summary_scale
//             (oracle::fp8_row_scale: the smallest 2^e with max_i |k'_c,i| / 2^e <= 448), the
//             oracle's `score_precision = fp8_e4m3` (data/verify_format.md)
//   int4:     codes n_c,i in [-7, 7], two per byte (value i of a row in the low nibble of byte
//             i / 2 for even i, the high one for odd i, stored as n + 8), with the row's fp32
//             scale s_c = max_i |k'_c,i| / 7 in summary_scale (oracle::int4_row_scale,
//             int4_code): half the bytes of fp8 and more selection changes (gpu/NOTES.md
//             "decode", session 15), the oracle's `score_precision = int4`; d even
//   int4_h:   int4's codes computed against s16, the fp16 number at or above int4's fp32 scale
//             (oracle::int4h_row_scale), and beside them one __half2 (s16, b'16) per row in
//             summary_scale_bias (b'16 = b' rounded to the nearest fp16): the scan reads 4 bytes
//             of side data per row instead of 8 (gpu/NOTES.md "d40"); the fp32 b' in
//             summary_bias stays for the fusion logits. The oracle's `score_precision = int4_h`;
//             d even; scanned by DecodeKernel::d40 only (the other kernels refuse it)
enum class SummaryType { bf16 = 0, fp8_e4m3 = 1, int4 = 2, int4_h = 3 };

// B sequences of T slots each; the new token is slot T-1 (its key and value already appended).
// Layouts, head-major per sequence, bf16 unless noted:
//   k             [B, Hkv, slot_capacity, d]     v [B, Hkv, slot_capacity, dv]
//   summary_key   [B, Hq, chunk_capacity, d]     (k'_c of every complete chunk c < T / S),
//                                                 bf16 or fp8 e4m3 (summary_type); int4:
//                                                 [B, Hq, chunk_capacity, d / 2] bytes
//   summary_scale [B, Hq, chunk_capacity] fp32   (fp8, int4: s_c; k'_c = s_c x the stored row)
//   summary_bias  [B, Hq, chunk_capacity] fp32   (b'_c; zeros for bias rule none)
//   summary_scale_bias [B, Hq, chunk_capacity] __half2 (int4_h only: (s16_c, b'16_c))
// Summaries are per query head (the landmark-query prior differs per head); the scores are
// fp32 dot products of the stored values.
struct DecodeCache {
  int64_t B = 0, T = 0, Hq = 0, Hkv = 0, d = 0, dv = 0;
  int64_t slot_capacity = 0;   // rows per (sequence, KV head); 0 means T
  int64_t chunk_capacity = 0;  // summary rows per (sequence, head); 0 means T / S
  const void* k = nullptr;
  const void* v = nullptr;
  const void* summary_key = nullptr;
  const float* summary_bias = nullptr;
  SummaryType summary_type = SummaryType::bf16;
  const float* summary_scale = nullptr;
  // Hierarchical fusion, every store: the same summaries in fp32 [B, Hq, chunk_capacity, d] (the
  // summarize stage's values). The scan scores every chunk from summary_key; the fusion logits
  // s_hat of the K selected chunks (Eq. 10) are read from these rows, so that the store's rounding
  // (bf16 2^-8, fp8 2^-4, int4) moves the selection but not the fused output: bf16 rows moved o
  // past its floor at |s_hat| ~ 150 (gpu/NOTES.md "decode", session 25). Unused otherwise.
  const float* summary_key_fp32 = nullptr;
  // int4_h: (s16, b'16) per row as __half2 [B, Hq, chunk_capacity] (quantize_summaries_int4h);
  // the scan reads these 4 bytes in place of summary_scale and summary_bias. Unused otherwise.
  const void* summary_scale_bias = nullptr;
};

// The new queries: q [B, Hq, d] bf16 (already rotated), q_retrieval the same or null (q~ = q).
struct DecodeQuery {
  const void* q = nullptr;
  const void* q_retrieval = nullptr;
};

// fp32 / int32 outputs; null pointers (all but o and lse) are skipped.
struct DecodeOutputs {
  float* o = nullptr;               // [B, Hq, dv]
  float* lse = nullptr;             // [B, Hq]
  int32_t* selection = nullptr;     // [B, Hkv, K], ascending, -1 padded
  float* o_window = nullptr;        // [B, Hq, dv]
  float* lse_window = nullptr;      // [B, Hq]
  float* surrogate = nullptr;       // [B, Hq, T / S], -inf outside V(T-1)
  float* fusion_weights = nullptr;  // [B, Hq, K + 2]
};

// Which launch sequence runs the step (gpu/NOTES.md "decode", versions). The values are the codes
// of hils_gpu_decode::kernel and stay as they are; the versions removed in session 17 (d8, d13,
// d16-d19, d21, d23-d25, d37, d38: codes 2-11, 23, 24) are refused with an error naming them
// (gpu/NOTES.md "Kernels removed in session 17"; their code is at commit 5a3f9d2). Codes 12-14
// (d26-d28, session 12) and 16-19 (d30-d33, session 13) went earlier, measured slower.
//   fused: the default, d39 (below; d36 in sessions 16-17, d29 before)
//   d29:   window and score tiles in one grid (launch 1, its stream of summary rows, b' and row
//          scales loaded ld.global.cs: d25), then group scores, select, chunk tiles and fuse by
//          programmatic dependent launch, K <= 32 ranked by warp sorts, the chunk tiles on the
//          tensor cores (mma.sync, one warp per selected chunk, testing only the landmark slot)
//          for d = dv = 64, G <= 16, S <= 64, their K/V rows (read once per step) copied with an
//          L2 evict-first policy (the default in sessions 12-15; the same bits as the removed d21)
//   d34:   d29 with two score tiles per launch-1 block, both tiles' loads issued before the first
//          is scored (twice the bytes in flight per block, half the blocks; for int4 summaries,
//          whose 256-chunk tile is half fp8's bytes); the same bits as d29 (session 15)
//   d35:   d29 (with int4 summaries d34) with two tails shortened: the select's warps take the
//          group-score tiles' kept lists as the sorted lists they are (K = 32), and the
//          tensor-core chunk tiles run on four warps per selected chunk (16 slots each) instead
//          of one; the same bits as d29 and d34 (session 16)
//   d36:   d35 without the select launch (K = 32 and the fuse merging the window): every chunk
//          tile of a KV group merges the group-score tiles' sorted kept lists itself (four warps,
//          eight lists per warp) and takes its chunk; the same bits as d35 and d29 (the default
//          since session 16: B = 8, 512K fp8 54.7-56.2 us against d29's 59.5-59.8, int4 48.0)
//   d39:   d36 with the int4 score tiles' dot products on the tensor cores (mma.sync m16n8k16,
//          bf16 codes exact, fp32 accumulation; 16-byte aligned rows of d = 64, else d36): the
//          products are exact, the sums the tensor core's, so not d36's bits; d36 with fp8 or
//          bf16 summaries (session 17, gpu/NOTES.md "d39": B = 8, 512K int4 47.3-47.8 us against
//          d36's 48.4-48.5, the scan launch 24.2 against 24.9; the default since session 18,
//          when its multi-tile tests passed on a device)
//   d40:   d39 whose int4_h score tiles read each row's scale and b' as one __half2 (4 bytes in
//          place of two fp32 arrays' 8; session 18, gpu/NOTES.md "d40"); the only kernel that
//          takes int4_h summaries; d39 with the other summary types
//   d5:    six launches (window, score, group scores, select, chunk, fuse), each stage's first
//          form: radix selects, warp-per-head chunk tiles, a fuse that loads one o_c row per
//          step; kept as the structurally independent GPU path the tests check the others
//          against the oracle beside (gpu/NOTES.md "Kernels removed in session 17")
enum class DecodeKernel { fused = 0, d5 = 1, d29 = 15, d34 = 20, d35 = 21, d36 = 22, d39 = 25, d40 = 26 };
// The kept kernels in code order, each named by decode_kernel_name, and the versions removed in
// session 17 with their codes and names (decode_step refuses those, naming them): the one table,
// which hils_gpu_enum_names("decode_kernel") and ("decode_kernel_removed") list as name=code
// for callers without these headers (gpu/bench/decode_ctypes.py).
inline constexpr DecodeKernel kDecodeKernels[] = {DecodeKernel::fused, DecodeKernel::d5,
                                                  DecodeKernel::d29,   DecodeKernel::d34,
                                                  DecodeKernel::d35,   DecodeKernel::d36,
                                                  DecodeKernel::d39,   DecodeKernel::d40};
constexpr const char* decode_kernel_name(DecodeKernel kernel) {
  switch (kernel) {
    case DecodeKernel::fused: return "fused";
    case DecodeKernel::d5: return "d5";
    case DecodeKernel::d29: return "d29";
    case DecodeKernel::d34: return "d34";
    case DecodeKernel::d35: return "d35";
    case DecodeKernel::d36: return "d36";
    case DecodeKernel::d39: return "d39";
    case DecodeKernel::d40: return "d40";
  }
  return "unknown";
}
struct RemovedDecodeKernel {
  int32_t code;
  const char* name;
};
inline constexpr RemovedDecodeKernel kRemovedDecodeKernels[] = {
    {2, "d8"},  {3, "d13"},  {4, "d16"},  {5, "d17"},  {6, "d18"},  {7, "d19"},
    {8, "d21"}, {9, "d23"}, {10, "d24"}, {11, "d25"}, {23, "d37"}, {24, "d38"}};

// A measurement probe for the benchmark (gpu/bench/bench_decode.py --scan-floor, --handoffs), not
// a step: launch 1 of the step alone, or a kernel that only reads launch 1's bytes, writing
// nothing but scratch in `workspace` (decode_workspace_bytes). d = dv = 64 only. Codes 0
// (d21_scan) and 1 (d24_scan) were removed in session 17 (refused, naming them).
//   d25_scan:   launch 1 (window + score tiles) of d25, which d29 and d36 (one tile per block) run
//   loads_only: launch 1's grid and loads (every block's rows, b', scales, window K/V rows),
//               none of its arithmetic, shared memory or stores: the floor of its layout
//   flat_read:  the summary rows, b' and scales read as three flat arrays by a grid-stride
//               kernel with 4 16-byte loads per thread in flight (the window's K/V left out):
//               the floor of the bytes
//   (both load the summary arrays as d25 does, ld.global.cs)
//   tail_handoffs: d25's launch 1, then four empty kernels launched as d29 launches its tails
//               (programmatic dependent launch, the same grids and blocks; each only waits for
//               the previous grid and lets the next launch): the step without the tails' work,
//               i.e. what the four kernel boundaries after the scan cost
enum class ScanProbe { d25_scan = 2, loads_only = 3, flat_read = 4, tail_handoffs = 5 };
void decode_scan_probe(const MechanismSpec& spec, const DecodeCache& cache, const DecodeQuery& q,
                       void* workspace, ScanProbe probe, cudaStream_t stream = nullptr);

// Throws std::invalid_argument naming the first bad field. Supported: bf16 K/V, bf16, fp8
// e4m3 or int4 summaries, d, dv <= 256, a spec whose fusion is flat or hierarchical with summaries (key
// rule not exact), K <= 1024.
void validate_decode(const MechanismSpec& spec, const DecodeCache& cache, const DecodeQuery& q);
// Device scratch bytes of one decode_step (either kernel).
size_t decode_workspace_bytes(const MechanismSpec& spec, const DecodeCache& cache);
// One decode step for all B sequences; `workspace` holds decode_workspace_bytes device bytes
// (no initialisation needed). Non-finite summaries (K > 0): where a candidate chunk's score
// q~ . k' + b' of any head of KV group g of sequence b is not finite (a row its quantizer marked,
// a NaN b', an infinite bf16 row), o and lse of every head of that group are NaN (o_window too
// where K is below the candidate count), its surrogate scores NaN at those chunks and its
// selection unspecified (it ranked a NaN); every other group gets the bits it gets without that
// row. No synchronisation (gpu/NOTES.md "Non-finite summary rows (session 22)").
void decode_step(const MechanismSpec& spec, const DecodeCache& cache, const DecodeQuery& q,
                 const DecodeOutputs& out, void* workspace, cudaStream_t stream = nullptr,
                 DecodeKernel kernel = DecodeKernel::fused);

// Stores summaries as the fp8 cache keeps them: key_fp8 [rows, d] e4m3 and scale [rows] fp32
// from key [rows, d] fp32 (per row: s = the smallest power of two with max |k'| / s <= 448,
// e4m3(k' / s) to nearest; oracle::fp8_row_scale, round_to_fp8_e4m3). Appending a completed
// chunk's summary is one row. A row holding a NaN or an infinity is stored marked, not refused
// (that would synchronise `stream`): scale NaN, every code 0, so that its scores are NaN and
// decode_step's o and lse of its KV group are NaN (gpu/NOTES.md "Non-finite summary rows
// (session 22)"); the other rows are stored as they would be without it.
void quantize_summaries_fp8(const float* key, int64_t rows, int64_t d, void* key_fp8,
                            float* scale, cudaStream_t stream = nullptr);

// Stores summaries as the int4 cache keeps them: key_int4 [rows, d / 2] bytes and scale [rows]
// fp32 from key [rows, d] fp32 (per row: s = max |k'| / 7 in fp32, the codes round(k' / s) to
// nearest, ties to even, in [-7, 7], stored as n + 8, value 2j in the low nibble of byte j;
// oracle::int4_row_scale, int4_code). d even. A row holding a NaN or an infinity is stored
// marked as quantize_summaries_fp8's: scale NaN, every code 0 (bytes 0x88).
void quantize_summaries_int4(const float* key, int64_t rows, int64_t d, void* key_int4,
                             float* scale, cudaStream_t stream = nullptr);

// Stores summaries as the int4_h cache keeps them: key_int4 [rows, d / 2] bytes and scale_bias
// [rows] __half2 from key [rows, d] fp32 and bias [rows] fp32 (per row: s16 = the fp16 number
// at or above int4's fp32 scale float(max |k'|) / 7, the codes round(k' / s16) to nearest, ties
// to even, in [-7, 7], stored as int4's; the pair (s16, b' to the nearest fp16);
// oracle::int4h_row_scale, int4_code, round_to_fp16). Throws std::invalid_argument naming the
// first refused row: summary_key's scale outside fp16's normal range (s < 2^-14 or s16 >
// 65504) or not finite, or summary_bias not finite or beyond fp16's range; for that it
// synchronises `stream`. d even.
void quantize_summaries_int4h(const float* key, const float* bias, int64_t rows, int64_t d,
                              void* key_int4, void* scale_bias, cudaStream_t stream = nullptr);

}  // namespace hils::gpu
