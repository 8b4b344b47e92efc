// Summary quantizers (decode.hpp: quantize_summaries_fp8, quantize_summaries_int4,
// quantize_summaries_int4h), a warp per row: k' rows into the stores the decode step scans (fp8
// e4m3 with power-of-two row scales; int4 codes with fp32 scales; int4_h codes with (s16, b'16)
// pairs), laid out as decode/scan.cuh's Fp8Summary and Int4Summary read them. They share nothing
// else with the step (gpu/NOTES.md "decode_kernels.cu split (session 18)").
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "decode/host_checks.hpp"
#include "device_common.cuh"
#include "hils/gpu/decode.hpp"

namespace hils::gpu {
namespace detail {
namespace {

// The largest |x[i]| of a row of d values, read by one warp's lanes (each lane gets it), and
// whether every x[i] is finite: the fp8 and int4 quantizers' row maximum (int4_h's own loop
// refuses a non-finite row).
struct RowAmax {
  float amax;
  bool finite;
};
__device__ __forceinline__ RowAmax warp_row_amax(const float* x, int64_t d, int lane) {
  float amax = 0.0f;
  bool finite = true;
  for (int64_t i = lane; i < d; i += kWarp) amax = fmaxf(amax, fabsf(x[i])), finite &= isfinite(x[i]);
  return {warp_max(amax), __all_sync(0xffffffffu, finite) != 0};
}

// A row with a NaN or an infinity is stored marked, not refused (refusing would need the host to
// read a flag back, a synchronisation per append): its scale NaN and its codes those of 0, so
// that every score the step makes from it is NaN and the step's outputs for its KV group are NaN
// (decode.hpp quantize_summaries_fp8; gpu/NOTES.md "Non-finite summary rows (session 22)").
constexpr float kMarkedRowScale = kNaN;

// ---- fp8 summaries: a warp per row ----------------------------------------------------------
// The row's power-of-two scale s (the smallest with amax / s <= 448) and e4m3(k' / s).
__global__ void quantize_fp8_kernel(const float* key, int64_t rows, int64_t d,
                                    __nv_fp8_storage_t* out, float* scale) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  if (row >= rows) return;
  const int lane = threadIdx.x % kWarp;
  const float* x = key + row * d;
  const RowAmax row_max = warp_row_amax(x, d, lane);
  if (!row_max.finite) {
    for (int64_t i = lane; i < d; i += kWarp) out[row * d + i] = 0;
    if (lane == 0) scale[row] = kMarkedRowScale;
    return;
  }
  const float amax = row_max.amax;
  float s = 1.0f;
  if (amax > 0.0f) {
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
  const RowAmax row_max = warp_row_amax(x, d, lane);
  if (!row_max.finite) {
    for (int64_t j = lane; j < d / 2; j += kWarp) out[row * (d / 2) + j] = 0x88;  // codes 0
    if (lane == 0) scale[row] = kMarkedRowScale;
    return;
  }
  const float amax = row_max.amax;
  float s = amax > 0.0f ? __fdiv_rn(amax, 7.0f) : 1.0f;
  if (s == 0.0f) s = 1.0f;
  auto code = [s](float v) {
    const float ratio = __fdiv_rn(v, s);
    const int n = min(7, max(-7, __float2int_rn(fminf(fmaxf(ratio, -8.0f), 8.0f))));
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

}  // namespace
}  // namespace detail

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