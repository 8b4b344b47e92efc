// The flat parameter block every kernel launcher takes (internal to gpu/src).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "hils/gpu/attention.hpp"
#include "hils/spec.hpp"

namespace hils::gpu::detail {

// Shapes, geometry and pointers of one launch; unused pointers stay null.
struct LaunchParams {
  int64_t T = 0, Hq = 0, Hkv = 0, d = 0, dv = 0;
  int64_t S = 1, W = 1, K = 0;
  bool landmarks = false;
  bool bf16 = false;
  float scale = 1.0f;
  // The spec's own enums (the spec type is shared with the reference by design).
  KeyRule key_rule = KeyRule::exact;
  BiasRule bias_rule = BiasRule::none;
  PriorRule prior_rule = PriorRule::landmark_query;
  GroupRule group_rule = GroupRule::max_normalized;
  bool softmax1 = false;
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const void* q_retrieval = nullptr;  // never null inside launchers (q when absent)
  const void* prior = nullptr;
  int64_t prior_rows = 0;
  // The element type the packed window kernels store o_swa in (their o_swa pointer then points
  // at __half for f16; hils::gpu::window_attention_rows).
  RowType o_swa_rows = RowType::f32;
};

// Whether this build's code for the current GPU has the wgmma kernels (sm_90a code on an sm_90
// GPU; wgmma_probe.cu): probed once per device by a one-thread kernel, at the first call.
bool wgmma_runs_on_current_device();
// Tests: makes wgmma_runs_on_current_device() false (true again with false), so that the
// fallback and the refusal run on a GPU that has wgmma.
void disable_wgmma_for_testing(bool disabled);
// The error for a named wgmma kernel that cannot run here (std::invalid_argument).
[[noreturn]] void refuse_wgmma_kernel(const char* field, const char* kernel, const char* instead);

// Each launcher enqueues one kernel on `stream`; errors surface through cudaGetLastError.
void launch_window(const LaunchParams& p, float* o, float* lse, cudaStream_t stream);
void launch_full(const LaunchParams& p, float* o, float* lse, cudaStream_t stream);
void launch_exact(const LaunchParams& p, float* exact, cudaStream_t stream);
void launch_summarize(const LaunchParams& p, float* key, float* bias, cudaStream_t stream);
// The summaries on the packed shapes (bf16, d = S = 64, taylor key): one block per (chunk, group).
bool summarize_packed_applies(const LaunchParams& p);
void launch_summarize_packed(const LaunchParams& p, float* key, float* bias, cudaStream_t stream);
void launch_surrogate(const LaunchParams& p, const float* key, const float* bias, float* scores,
                      cudaStream_t stream);
void launch_select(const LaunchParams& p, const float* key, const float* bias,
                   const float* exact, const float* lse_swa, int32_t* selection,
                   float* selected_score, cudaStream_t stream);
void launch_fuse_hierarchical(const LaunchParams& p, const int32_t* selection,
                              const float* selected_score, const float* o_swa,
                              const float* lse_swa, float* o, float* lse, cudaStream_t stream);
void launch_fuse_flat(const LaunchParams& p, const int32_t* selection, float* o, float* lse,
                      cudaStream_t stream);

}  // namespace hils::gpu::detail

namespace hils::gpu::detail {

// The packed tensor-core kernels (packed_kernels.cu, their device code under
// gpu/src/packed_kernels/) cover bf16, d = dv = S = 64, G | 16.
bool packed_path_applies(const LaunchParams& p);
// WindowKernel::mma_v9 (packed_kernels/window_mma_v9.cuh): 128 rows per block, masks on edge
// tiles only.
void launch_window_v9(const LaunchParams& p, float* o, float* lse, cudaStream_t stream);
// WindowKernel::wgmma_v18, v19, v20: mma_v9's block as two warpgroups issuing wgmma (sm_90a;
// packed_kernels/window_wgmma_v18.cuh, window_wgmma_v19.cuh).
void launch_window_wgmma(const LaunchParams& p, WindowKernel kernel, float* o, float* lse,
                         cudaStream_t stream);
void launch_fuse_packed(const LaunchParams& p, const int32_t* selection,
                        const float* selected_score, const float* o_swa, const float* lse_swa,
                        float* o, float* lse, cudaStream_t stream);

}  // namespace hils::gpu::detail

namespace hils::gpu::detail {

// Tensor-core scoring + top-K (select_packed.cu; its kernels in select_packed/): bf16 q~, d = 64,
// G | 16, 1 <= K <= 64.
using PackedSelect = hils::gpu::SelectKernel;
bool packed_select_applies(const LaunchParams& p);
void launch_select_packed(const LaunchParams& p, const float* key, const float* bias,
                          const float* lse_swa, int32_t* selection, float* selected_score,
                          PackedSelect kernel, cudaStream_t stream);

}  // namespace hils::gpu::detail

namespace hils::gpu::detail {

// Chunk-major hierarchical fusion (sparse_chunked.cu; its kernels in sparse_chunked/) for the packed
// shapes, 1 <= K <= 64.
bool chunked_fuse_applies(const LaunchParams& p);
// o_swa as the fusion reads it and o as it writes it ([Hq, T, 64] each, of the RowTypes named).
struct FusionRows {
  const void* o_swa = nullptr;
  RowType o_swa_type = RowType::f32;
  void* o = nullptr;
  RowType o_type = RowType::f32;
};
// Whether the chunk-major variant reads or writes rows other than fp32 (hils::gpu::fuse_rows):
// chunked_v30, v35, v36. chunked_v21 takes RowType::f32 only (the caller checks).
bool fusion_rows_apply(SparseKernel kernel);
void launch_fuse_chunked(const LaunchParams& p, const int32_t* selection,
                         const float* selected_score, const FusionRows& rows, const float* lse_swa,
                         float* lse, cudaStream_t stream);
// Queries per segment of the chunk-major fusion (0: from its scratch or L2 budget).
void set_sparse_segment_queries(int64_t queries);
// The chunk-major variant launch_fuse_chunked runs (hils::gpu::set_sparse_kernel): the one
// set, else default_sparse_kernel().
void set_sparse_kernel(std::optional<SparseKernel> kernel);
SparseKernel sparse_kernel();

}  // namespace hils::gpu::detail
