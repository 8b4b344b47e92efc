/* C ABI over hils::gpu for ctypes and other foreign callers. Every function returns 0 on
   success, 2 on bad input and 3 on an internal (CUDA) error; hils_gpu_last_error() then says
   what went wrong. Enum fields take the integer values of the hils:: enums in spec.hpp. */
#ifndef HILS_GPU_C_API_H
#define HILS_GPU_C_API_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hils_gpu_problem {
  int64_t T, Hq, Hkv, d, dv, S, W, K;
  int32_t landmarks, bf16, key_rule, bias_rule, prior_rule, group_rule, fusion, softmax1;
  double scale; /* 0: 1/sqrt(d) */
  const void* q;
  const void* k;
  const void* v;
  const void* q_retrieval; /* may be NULL */
  const void* prior;       /* may be NULL */
  int64_t prior_rows;
} hils_gpu_problem;

const char* hils_gpu_last_error(void);
/* The names of a spec enum's values in integer order, space-separated, from the enum name
   tables of hils/spec.hpp: field is "key_rule", "bias_rule", "prior_rule", "group_rule" or "fusion"
   (e.g. "exact mean landmark_key taylor"); NULL for another field. */
const char* hils_gpu_enum_names(const char* field);
int hils_gpu_workspace_bytes(const hils_gpu_problem* p, size_t* bytes);
int hils_gpu_run(const hils_gpu_problem* p, float* o, float* lse, void* workspace, void* stream);
int hils_gpu_window(const hils_gpu_problem* p, float* o_swa, float* lse_swa, void* stream);
/* hils_gpu_window with o_swa stored as o_swa_type: 0 = fp32, 1 = fp16 (hils::gpu::
   window_attention_rows: the packed window kernels from mma_v9 on). */
int hils_gpu_window_rows(const hils_gpu_problem* p, void* o_swa, int32_t o_swa_type, float* lse_swa,
                         void* stream);
int hils_gpu_full(const hils_gpu_problem* p, float* o, float* lse, void* stream);
int hils_gpu_exact(const hils_gpu_problem* p, float* exact, void* stream);
int hils_gpu_summarize(const hils_gpu_problem* p, float* key, float* bias, void* stream);
int hils_gpu_select(const hils_gpu_problem* p, const float* key, const float* bias,
                    const float* exact, const float* lse_swa, int32_t* selection,
                    float* selected_score, void* stream);
/* select_kernel: 0 = two_pass_v4, 1 = one_pass_v5, 2 = two_pass_v6, 3 = two_pass_v7,
   4 = two_pass_v8, 5 = two_pass_v9, 6 = two_pass_v10, 7 = two_pass_v11, 8 = two_pass_v12,
   9 = two_pass_v13, 10 = two_pass_v14, 11 = two_pass_v15, 12 = two_pass_v16,
   13 = two_pass_v17, 14 = two_pass_v18, 15 = two_pass_v19, 16 = two_pass_v20,
   17 = two_pass_v21, 18 = two_pass_v22, 19 = two_pass_v25
   (hils_gpu_select runs the default, hils::gpu::default_select_kernel). */
int hils_gpu_select_with(const hils_gpu_problem* p, int32_t select_kernel, const float* key,
                         const float* bias, const float* exact, const float* lse_swa,
                         int32_t* selection, float* selected_score, void* stream);
/* The sparse stage of hils_gpu_fuse / hils_gpu_run on the packed shapes, process-wide:
   0 = chunked_v4, 1 = atomic_v5, 2 = chunked_v6, 3 = chunked_v7, 4 = chunked_v8,
   5 = chunked_v9, 6 = chunked_v10, 7 = chunked_v11, 8 = chunked_v12, 9 = chunked_v13,
   10 = chunked_v14, 11 = chunked_v15, 12 = chunked_v16, 13 = chunked_v17,
   14 = chunked_v18, 15 = chunked_v19, 16 = chunked_v20, 17 = chunked_v21, 18 = chunked_v22,
   19 = chunked_v23, 20 = chunked_v24, 21 = chunked_v25, 22 = chunked_v26, 23 = chunked_v27,
   24 = chunked_v28, 25 = chunked_v29, 26 = chunked_v30, 27 = chunked_v31,
   28 = chunked_v32, 29 = chunked_v35, 30 = chunked_v36 (until set:
   hils::gpu::default_sparse_kernel(), i.e. chunked_v36, or chunked_v21 where wgmma cannot run;
   gpu/NOTES.md). Returns 2 for another value. */
int hils_gpu_set_sparse_kernel(int32_t sparse_kernel);
/* The sparse stage that runs now (the default until set), as the numbers above. */
int32_t hils_gpu_sparse_kernel(void);
/* The window kernel of hils_gpu_window / hils_gpu_run on the packed shapes, process-wide:
   0 = mma_v4, 1 = mma_v9, 2 = mma_v10, 3 = wgmma_v11, 4 = wgmma_v12, 5 = wgmma_v13,
   6 = wgmma_v14, 7 = wgmma_v15, 8 = wgmma_v16, 9 = wgmma_v17, 10 = wgmma_v18, 11 = wgmma_v19,
   12 = wgmma_v20 (the default is
   hils::gpu::default_window_kernel(): wgmma_v20 where wgmma can run, else mma_v9;
   gpu/NOTES.md). Returns 2 for another value; a wgmma kernel (3 to 12) set where wgmma cannot
   run makes those calls fail. */
int hils_gpu_set_window_kernel(int32_t window_kernel);
/* The window kernel that runs now (the default until set), as the numbers above. */
int32_t hils_gpu_window_kernel(void);
/* 1 (default): the packed tensor-core kernels where they apply; 0: the SIMT kernels everywhere
   (hils::gpu::set_packed_kernels), process-wide. Returns 2 for another value. */
int hils_gpu_set_packed_kernels(int32_t enabled);
/* Queries per segment of that stage; 0 (default) sizes it from its budget. 2 when negative. */
int hils_gpu_set_sparse_segment_queries(int64_t queries);
int hils_gpu_fuse(const hils_gpu_problem* p, const int32_t* selection,
                  const float* selected_score, const float* o_swa, const float* lse_swa,
                  float* o, float* lse, void* stream);
/* hils_gpu_fuse with o_swa read as o_swa_type and o written as o_type: 0 = fp32, 1 = fp16 (o_swa
   only), 2 = bf16 (o only) (hils::gpu::fuse_rows: other than fp32 needs sparse kernel
   chunked_v24 to chunked_v36 on the packed shapes). */
int hils_gpu_fuse_rows(const hils_gpu_problem* p, const int32_t* selection,
                       const float* selected_score, const void* o_swa, int32_t o_swa_type,
                       const float* lse_swa, void* o, int32_t o_type, float* lse, void* stream);

#ifdef __cplusplus
}
#endif

#endif
