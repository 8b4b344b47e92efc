/* C ABI of the decode step (hils/gpu/decode.hpp) for ctypes callers (gpu/bench/bench_decode.py).
 * Return codes as in c_api.h: 0 ok, 2 invalid argument, 3 CUDA or other failure; the message of
 * the last failure is hils_gpu_decode_last_error(). */
#ifndef HILS_GPU_DECODE_C_API_H
#define HILS_GPU_DECODE_C_API_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One decode step's shapes, spec fields (hils enum values) and device pointers. */
typedef struct hils_gpu_decode {
  int64_t B, T, Hq, Hkv, d, dv, S, W, K;
  int32_t landmarks, key_rule, bias_rule, group_rule, fusion, softmax1;
  double scale; /* 0: 1/sqrt(d) */
  int64_t slot_capacity, chunk_capacity;
  const void *k, *v, *summary_key; /* bf16 */
  const float* summary_bias;
  const void *q, *q_retrieval; /* bf16 [B, Hq, d]; q_retrieval may be null */
  int32_t summary_type;        /* 0 bf16, 1 fp8 e4m3, 2 int4, 3 int4_h (hils::gpu::SummaryType) */
  int32_t kernel;              /* 0 fused (the default: d39), 1 d5, 15 d29, 20 d34, 21 d35, 22 d36, 25 d39, 26 d40 (hils::gpu::DecodeKernel);
                                  2-11 (d8, d13, d16-d19, d21, d23-d25), 23 (d37) and 24 (d38) were removed in session 17
                                  and are refused (2) naming them (gpu/NOTES.md "Kernels removed in session 17") */
  const float* summary_scale;  /* fp8, int4: [B, Hq, chunk_capacity] row scales; else null */
  const float* summary_key_fp32; /* hierarchical fusion (every store): the summaries in fp32
                                    [B, Hq, chunk_capacity, d], the selected chunks' fusion logits;
                                    else null */
  const void* summary_scale_bias; /* int4_h: [B, Hq, chunk_capacity] __half2 (s16, b'16), read by d40; else null */
} hils_gpu_decode;

/* Outputs (fp32 / int32); only o and lse are required. */
typedef struct hils_gpu_decode_outputs {
  float *o, *lse;
  int32_t* selection;
  float *o_window, *lse_window, *surrogate, *fusion_weights;
} hils_gpu_decode_outputs;

const char* hils_gpu_decode_last_error(void);
int hils_gpu_decode_workspace_bytes(const hils_gpu_decode* p, size_t* bytes);
int hils_gpu_decode_step(const hils_gpu_decode* p, const hils_gpu_decode_outputs* out,
                         void* workspace, void* stream);
/* A measurement probe, not a step (hils::gpu::decode_scan_probe): probe 2 d25's launch 1 (d29's),
 * 3 launch 1's loads only, 4 a flat read of the summary arrays, 5 d25's launch 1 and four empty
 * tail kernels (hils::gpu::ScanProbe); 0 (d21's launch 1) and 1 (d24's) were removed in session
 * 17 and are refused (2) naming them. */
int hils_gpu_decode_scan_probe(const hils_gpu_decode* p, int32_t probe, void* workspace,
                               void* stream);
/* key fp32 [rows, d] -> key_fp8 e4m3 [rows, d] and scale fp32 [rows] (hils::gpu::quantize_summaries_fp8;
 * a row with a NaN or an infinity is stored marked: scale NaN, codes 0; no synchronisation). */
int hils_gpu_quantize_summaries_fp8(const float* key, int64_t rows, int64_t d, void* key_fp8,
                                    float* scale, void* stream);
/* key fp32 [rows, d] -> key_int4 [rows, d / 2] bytes and scale fp32 [rows] (hils::gpu::quantize_summaries_int4;
 * a row with a NaN or an infinity is stored marked: scale NaN, codes 0; no synchronisation). */
int hils_gpu_quantize_summaries_int4(const float* key, int64_t rows, int64_t d, void* key_int4,
                                     float* scale, void* stream);

/* key fp32 [rows, d], bias fp32 [rows] -> key_int4 [rows, d / 2] bytes and scale_bias __half2 [rows]
 * (hils::gpu::quantize_summaries_int4h; 2 naming the first refused row; synchronises the stream). */
int hils_gpu_quantize_summaries_int4h(const float* key, const float* bias, int64_t rows, int64_t d,
                                      void* key_int4, void* scale_bias, void* stream);

#ifdef __cplusplus
}
#endif

#endif
