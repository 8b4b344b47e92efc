/* C ABI over hils::gpu for ctypes and other foreign callers. Every function returns 0 on
   success, 2 on bad input and 3 on an internal (CUDA) error; hils_gpu_last_error() then says
   what went wrong. Enum fields take the integer values of the hils:: enums in spec.hpp. Bad input
   is refused before anything is launched: shapes and spec numbers (each buffer of at most 2^59
   bytes, Hkv <= 65535 where the packed kernels run), enum values, and a null pointer among the
   inputs and outputs a call reads or writes (hils::gpu::validate; gpu/NOTES.md "Careless-user
   audit (session 21)"). The sizes of the buffers behind the pointers cannot be checked: they
   must hold the shapes the problem names. */
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
   (e.g. "exact mean landmark_key taylor"). For the kernel codes below, field "select_kernel",
   "sparse_kernel" or "window_kernel": each kept kernel as name=code (e.g. "two_pass_v4=0
   one_pass_v5=1 two_pass_v8=4 ..."; the codes are not consecutive), and with "_removed" appended
   (e.g. "select_kernel_removed") the codes that session 17 removed, as name=code. The same for
   the decode step's kernels (hils_gpu_decode::kernel, hils/gpu/decode_c_api.h): "decode_kernel"
   ("fused=0 d5=1 d29=15 ...") and "decode_kernel_removed" ("d8=2 d13=3 ..."). NULL for another
   field. */
const char* hils_gpu_enum_names(const char* field);
/* The bytes of hils_gpu_run's workspace; 2 (and *bytes untouched) for a problem whose shapes or
   spec numbers every stage would refuse (no pointer of p is read). */
int hils_gpu_workspace_bytes(const hils_gpu_problem* p, size_t* bytes);
int hils_gpu_run(const hils_gpu_problem* p, float* o, float* lse, void* workspace, void* stream);
int hils_gpu_window(const hils_gpu_problem* p, float* o_swa, float* lse_swa, void* stream);
/* hils_gpu_window with o_swa stored as o_swa_type: 0 = fp32, 1 = fp16 (hils::gpu::
   window_attention_rows: the packed window kernels). */
int hils_gpu_window_rows(const hils_gpu_problem* p, void* o_swa, int32_t o_swa_type, float* lse_swa,
                         void* stream);
int hils_gpu_full(const hils_gpu_problem* p, float* o, float* lse, void* stream);
int hils_gpu_exact(const hils_gpu_problem* p, float* exact, void* stream);
int hils_gpu_summarize(const hils_gpu_problem* p, float* key, float* bias, void* stream);
int hils_gpu_select(const hils_gpu_problem* p, const float* key, const float* bias,
                    const float* exact, const float* lse_swa, int32_t* selection,
                    float* selected_score, void* stream);
/* Kernel codes (select_kernel, sparse_kernel, window_kernel) are the values of hils::gpu::
   SelectKernel, SparseKernel and WindowKernel, stable across versions: the kernels removed in
   session 17 left their codes unused (gpu/NOTES.md "Kernels removed in session 17"), and such a
   code is refused (2) with an error that names it, says it was removed and lists the kept ones.
   select_kernel: 0 = two_pass_v4, 1 = one_pass_v5, 4 = two_pass_v8, 11 = two_pass_v15,
   17 = two_pass_v21, 18 = two_pass_v22, 19 = two_pass_v25, 20 = two_pass_v26, 21 = two_pass_v27
   (removed: 2, 3, 5-10, 12-16)
   (hils_gpu_select runs the default, hils::gpu::default_select_kernel). */
int hils_gpu_select_with(const hils_gpu_problem* p, int32_t select_kernel, const float* key,
                         const float* bias, const float* exact, const float* lse_swa,
                         int32_t* selection, float* selected_score, void* stream);
/* The sparse stage of hils_gpu_fuse / hils_gpu_run on the packed shapes, process-wide:
   17 = chunked_v21, 26 = chunked_v30, 29 = chunked_v35, 30 = chunked_v36 (removed: 0-16, 18-25,
   27, 28) (until set: hils::gpu::default_sparse_kernel(), i.e. chunked_v36, or chunked_v21 where
   wgmma cannot run; gpu/NOTES.md). Returns 2 for another value. */
int hils_gpu_set_sparse_kernel(int32_t sparse_kernel);
/* The sparse stage that runs now (the default until set), as the numbers above. */
int32_t hils_gpu_sparse_kernel(void);
/* The window kernel of hils_gpu_window / hils_gpu_run on the packed shapes, process-wide:
   1 = mma_v9, 10 = wgmma_v18, 11 = wgmma_v19, 12 = wgmma_v20 (removed: 0, 2-9) (the default is
   hils::gpu::default_window_kernel(): wgmma_v20 where wgmma can run, else mma_v9;
   gpu/NOTES.md). Returns 2 for another value; a wgmma kernel (10 to 12) set where wgmma cannot
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
   chunked_v30, chunked_v35 or chunked_v36 on the packed shapes). */
int hils_gpu_fuse_rows(const hils_gpu_problem* p, const int32_t* selection,
                       const float* selected_score, const void* o_swa, int32_t o_swa_type,
                       const float* lse_swa, void* o, int32_t o_type, float* lse, void* stream);

#ifdef __cplusplus
}
#endif

#endif
