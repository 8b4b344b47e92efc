// Decode step (gpu/NOTES.md "decode"): one new query per sequence against a bf16 KV cache of T
// slots that also keeps the chunk summaries (k', b' per complete chunk, appended when the chunk
// completes). A step scores the T/S summaries, selects K chunks per KV group and attends
// K*S + W keys, split over many blocks (flash-decoding style). Same contract as the prefill
// (reference/SEMANTICS.md) for the query at slot T-1 of each sequence.
// C++17 and free of Eigen so that nvcc and plain C++ callers both include it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "hils/spec.hpp"

namespace hils::gpu {

// B sequences of T slots each; the new token is slot T-1 (its key and value already appended).
// Layouts, head-major per sequence, bf16 unless noted:
//   k            [B, Hkv, slot_capacity, d]     v [B, Hkv, slot_capacity, dv]
//   summary_key  [B, Hq, chunk_capacity, d]     (k'_c of every complete chunk c < T / S)
//   summary_bias [B, Hq, chunk_capacity] fp32   (b'_c; zeros for bias rule none)
// Summaries are per query head (the landmark-query prior differs per head) and bf16: the scores
// are fp32 dot products of bf16 values, the oracle's `score_precision = bf16` case.
struct DecodeCache {
  int64_t B = 0, T = 0, Hq = 0, Hkv = 0, d = 0, dv = 0;
  int64_t slot_capacity = 0;   // rows per (sequence, KV head); 0 means T
  int64_t chunk_capacity = 0;  // summary rows per (sequence, head); 0 means T / S
  const void* k = nullptr;
  const void* v = nullptr;
  const void* summary_key = nullptr;
  const float* summary_bias = nullptr;
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

// Throws std::invalid_argument naming the first bad field. Supported: bf16 cache, d, dv <= 256,
// a spec whose fusion is flat or hierarchical with summaries (key rule not exact), K <= 1024.
void validate_decode(const MechanismSpec& spec, const DecodeCache& cache, const DecodeQuery& q);
// Device scratch bytes of one decode_step.
size_t decode_workspace_bytes(const MechanismSpec& spec, const DecodeCache& cache);
// One decode step for all B sequences; `workspace` holds decode_workspace_bytes device bytes.
void decode_step(const MechanismSpec& spec, const DecodeCache& cache, const DecodeQuery& q,
                 const DecodeOutputs& out, void* workspace, cudaStream_t stream = nullptr);

}  // namespace hils::gpu
