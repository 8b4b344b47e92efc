// The sparse stage's last step, o = o16 after a segment's chunk kernel: v21's fp32 conversion
// (convert_o16_kernel) and v24's 16 bytes per thread into fp32 or bf16 rows, each o16 line
// discarded from the L2 after its read (convert_discard_o16_kernel; v30, v35, v36).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "sparse_chunked/common.cuh"

namespace hils::gpu::detail {
namespace {

// chunked_v21, after the segment's chunk kernel: o = o16 in fp32 (one thread per half2).
__global__ void __launch_bounds__(256) convert_o16_kernel(LaunchParams p, int64_t t0, int64_t tn,
                                                          const __half* o16, float* o) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * 256 + threadIdx.x;  // half2 index
  const int64_t per_head = tn * kTileDim / 2;
  if (i >= p.Hq * per_head) return;
  const int64_t h = i / per_head, at = (h * p.T + t0) * kTileDim / 2 + i % per_head;
  const float2 v = __half22float2(reinterpret_cast<const __half2*>(o16)[at]);
  reinterpret_cast<float2*>(o)[at] = v;
}

// chunked_v24 on (v30, v35, v36), after the segment's chunk kernel: o = o16 with 16 bytes of o16 per thread (8
// lanes per 128-byte row), Out = float (the API's o) or __nv_bfloat16 (RowType::bf16); each o16
// row read is then discarded from the L2 (discard.global.L2: the line is dropped without its
// write-back to DRAM; o16 is dead until the next call's weights kernel writes every row again).
// kChained: chunked_v35 (wait_previous_then_allow_next).
template <typename Out, bool kChained = false>
__global__ void __launch_bounds__(256) convert_discard_o16_kernel(LaunchParams p, int64_t t0, int64_t tn,
                                                                  __half* o16, Out* o) {
  wait_previous_then_allow_next<kChained>();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * 256 + threadIdx.x;  // 8-half index
  const int64_t per_head = tn * kTileDim / 8;
  const bool active = i < p.Hq * per_head;  // a 128-byte row's 8 lanes are all active or none
  const int64_t h = active ? i / per_head : 0, at = (h * p.T + t0) * kTileDim / 8 + i % per_head;
  if (active) {
    const uint4 in = reinterpret_cast<const uint4*>(o16)[at];
    const __half2* from = reinterpret_cast<const __half2*>(&in);
    if constexpr (std::is_same_v<Out, float>) {
      const float2 a = __half22float2(from[0]), b = __half22float2(from[1]);
      const float2 c = __half22float2(from[2]), d = __half22float2(from[3]);
      reinterpret_cast<float4*>(o)[2 * at] = make_float4(a.x, a.y, b.x, b.y);
      reinterpret_cast<float4*>(o)[2 * at + 1] = make_float4(c.x, c.y, d.x, d.y);
    } else {
      uint4 out;
      __nv_bfloat162* to = reinterpret_cast<__nv_bfloat162*>(&out);
#pragma unroll
      for (int e = 0; e < 4; ++e) to[e] = __float22bfloat162_rn(__half22float2(from[e]));
      reinterpret_cast<uint4*>(o)[at] = out;
    }
  }
  __syncwarp();  // the row's 8 loads have returned (their values are stored) before its discard
  if (active && at % 8 == 0) asm volatile("discard.global.L2 [%0], 128;" ::"l"(o16 + at * 8) : "memory");
}

}  // namespace
}  // namespace hils::gpu::detail
