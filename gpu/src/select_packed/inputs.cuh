// What the kernels read besides q~, written by to_bf16_kernel before each selection
// (launch_select_g): the bf16 copy of k' (for the copy engine and the tensor cores), bias2 =
// bias log2 e, and v25's rows for pass 2's fifth k16 step. With them, the rest of v25's fold: its
// shared-memory stages (kFoldStageBytes, kFoldPanelFloats), its margin on pass 1's bound
// (kFoldMargin), the bf16 pieces of x and y (bf16_pieces, fold_row) and the rows' place in the
// selection's scratch (fold_rows_offset, fold_scratch_floats).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "select_packed/common.cuh"

namespace hils::gpu::detail {
namespace {

// v25: a stage of the bias k16 step's k side (64 rows of 16 bytes) and its shared-memory area.
constexpr int kFoldStageBytes = kTileDim * 16;
constexpr int kFoldPanelFloats = (2 * kFoldStageBytes + 128) / 4;
// v25's margin on pass 1's bound. v25 ranks r' = fl(scale2 max_h acc_h) (acc the fifth k-step's
// sum) where v16 ranks v = max_h fl(fl(fma(s, scale2, b2)) - z), and pass 1's bound B (a lower
// bound of the K-th largest v over the chunks) is v16's. Per (row, head, chunk), |r' - v| gathers
// v16's two roundings (2^-24 (|s2| + |v|)), the pieces of x and y after their divisions (2^-23
// (|z| + |b2|)), the tensor core's sum of s and six exact products (aligned to its largest term
// and truncated: a few units of 2^-23 of |s| + |z| / scale2 + |b2| / scale2) and the final product
// (2^-24 |r'|). For a chunk with v >= B (v <= 0 up to lg2.approx's error, so |v| <= |B| + 1),
// |s2| <= |v| + |z| and |s scale2| <= |s2| + |b2|: |r' - v| < 2^-18 (|B| + 1 + 2 |z| + 3 |b2|).
// The margin takes 2^-12 times that sum with |z| the row's largest over its heads and |b2| the
// largest over all chunks (64 times the count, for the tensor core's accumulation, which NVIDIA
// does not document). The K chunks with v >= B have r' >= B - eps, so every chunk of the top K
// by r' has r' >= B - eps and is appended; a larger margin only appends more candidates.
constexpr float kFoldMargin = 0x1p-12f;

// v25's fifth k16 step of pass 2 (max_normalized). Its 16 k columns: q side (A, registers)
// [x_hi, x_mid, x_lo, 1, 1, 1, 0 ...] with x = -log2 Z_hat / scale2 of the (row, head); k side
// (B, one 16-byte row per chunk, FoldRow) [1, 1, 1, y_hi, y_mid, y_lo, 0, 0] with y = b2 / scale2
// of the (head, chunk), columns 8-15 unused (A's are zero). The pieces are x (y) rounded to bf16
// three times in turn (each remainder exact in fp32): x_hi + x_mid + x_lo = x within 2^-24 |x|.
// So the product adds x + y to s: acc = s + (b2 - z) / scale2, and scale2 acc is v16's
// s2 - z = fma(s, scale2, b2) - z up to the roundings (bounded in kFoldMargin's comment).
struct Bf16Pieces {
  uint32_t hi, mid, lo;  // bf16 bits
};
__device__ __forceinline__ Bf16Pieces bf16_pieces(float x) {
  const __nv_bfloat16 hi = __float2bfloat16_rn(x);
  const float r1 = x - __bfloat162float(hi);
  const __nv_bfloat16 mid = __float2bfloat16_rn(r1);
  const __nv_bfloat16 lo = __float2bfloat16_rn(r1 - __bfloat162float(mid));
  return {__bfloat16_as_ushort(hi), __bfloat16_as_ushort(mid), __bfloat16_as_ushort(lo)};
}
constexpr uint32_t kBf16One = 0x3F80u;
// The k side's row of a chunk with y = b2 / scale2: columns 0-7 (16 bytes).
__device__ __forceinline__ uint4 fold_row(float y) {
  const Bf16Pieces b = bf16_pieces(y);
  return make_uint4(kBf16One | kBf16One << 16, kBf16One | b.hi << 16, b.mid | b.lo << 16, 0u);
}
// v25's rows after bias2 in the selection's scratch: bias2's n_bias floats rounded up to 16 bytes,
// then n_bias FoldRows ([Hq][n_chunks]), then max |b2| over them (one float).
__host__ __device__ constexpr int64_t fold_rows_offset(int64_t n_bias) { return (n_bias + 3) / 4 * 4; }
__host__ __device__ constexpr int64_t fold_scratch_floats(int64_t n_bias) {
  return fold_rows_offset(n_bias) + 4 * n_bias + 4;
}

// fp32 summaries -> bf16 copy for the copy engine and the tensor cores; bias -> bias log2 e.
// v25 (fold_rows not null): each bias's FoldRow, and max |b2| into *fold_bias_max (zeroed before).
// v27 (dst16 not null): an fp16 copy too, for the selected scores (to nearest; beyond fp16's range
// it holds inf, which the scores kernel replaces by the fp32 value).
__global__ void to_bf16_kernel(const float* src, __nv_bfloat16* dst, int64_t n, const float* bias,
                               float* bias2, int64_t n_bias, uint4* fold_rows, float* fold_bias_max,
                               float scale2, __half* dst16) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) dst[i] = __float2bfloat16_rn(src[i]);
  if (dst16 != nullptr && i < n) dst16[i] = __float2half_rn(src[i]);
  float b2 = 0.0f;
  if (i < n_bias) bias2[i] = b2 = bias[i] * kLog2e;
  if (fold_rows == nullptr || i - static_cast<int64_t>(threadIdx.x % kWarp) >= n_bias) return;
  if (i < n_bias) fold_rows[i] = fold_row(b2 / scale2);
  float m = fabsf(b2);
  for (int off = kWarp / 2; off > 0; off /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  // |b2| >= 0: its bits order as unsigned integers.
  if (threadIdx.x % kWarp == 0) atomicMax(reinterpret_cast<unsigned*>(fold_bias_max), __float_as_uint(m));
}

}  // namespace
}  // namespace hils::gpu::detail
