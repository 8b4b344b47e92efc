// What a row's fp16 reduction costs by layout (gpu/NOTES.md "sparse v16 and v17"): the chunk
// kernels of chunked_v12-v17 add each 128-byte fp16 row into o16 [Hq, T, 64] with 8 lanes of a
// warp-wide red.global.add.noftz.v4.f16x2 (4 rows per instruction), and the L2 counts 6 sectors
// per row for 4 of payload. This probe times warps doing the same reductions into an L2-resident
// buffer of 153600 rows (a 9600-query segment's o16 for Hq = 16), 8 rows per iteration (one
// pair's G = 8 heads), by layout:
//   scattered     8 random rows (the heads of a pair T rows apart, as in [Hq, T, 64])
//   blocks512     2 random 512-byte blocks of 4 adjacent rows
//   block1k       1 random 1 KB block of 8 adjacent rows (a pair's heads in [T, Hq, 64])
//   scalar        8 random rows, 32 lanes x 4-byte red.add.noftz.f16x2 per row
//   v8f16         8 random rows, red.global.add.noftz.v8.f16 (16 bytes per lane)
//   store         8 random rows, plain 16-byte stores (the same bytes written, no reduction)
// Build: nvcc -O3 -arch=sm_90a -o red_layout_probe red_layout_probe.cu; run: ./red_layout_probe
// (ns per kernel, ps per row). For the L2's view: ncu --metrics
// lts__t_sectors_op_red.sum,lts__t_requests_op_red.sum,lts__t_sectors_op_write.sum ./red_layout_probe 1
#include <cuda_fp16.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace {

constexpr int kRows = 153600, kRowBytes = 128, kIters = 2048, kThreads = 256;
enum Mode { scattered, blocks512, block1k, scalar, v8f16, store, kModes };
const char* const kNames[] = {"scattered", "blocks512", "block1k", "scalar", "v8f16", "store"};

__device__ __forceinline__ uint32_t hash(uint32_t x) {
  x ^= x >> 16, x *= 0x7feb352du, x ^= x >> 15, x *= 0x846ca68bu, x ^= x >> 16;
  return x;
}

__device__ __forceinline__ void red_v4_f16x2(__half* at, uint32_t v) {
  asm volatile("red.global.add.noftz.v4.f16x2 [%0], {%1, %1, %1, %1};\n" ::"l"(at), "r"(v) : "memory");
}
__device__ __forceinline__ void red_v8_f16(__half* at, uint16_t v) {
  asm volatile("red.global.add.noftz.v8.f16 [%0], {%1, %1, %1, %1, %1, %1, %1, %1};\n" ::"l"(at), "h"(v)
               : "memory");
}
__device__ __forceinline__ void red_f16x2(__half* at, uint32_t v) {
  asm volatile("red.global.add.noftz.f16x2 [%0], %1;\n" ::"l"(at), "r"(v) : "memory");
}

template <int kMode>
__global__ void __launch_bounds__(kThreads) probe(__half* o) {
  const uint32_t warp = (blockIdx.x * kThreads + threadIdx.x) / 32, lane = threadIdx.x % 32;
  const __half2 h = __float2half2_rn(1.0e-3f);
  const uint32_t v = *reinterpret_cast<const uint32_t*>(&h);
  const uint16_t v1 = *reinterpret_cast<const uint16_t*>(&h);
  for (uint32_t it = 0; it < kIters; ++it) {
    const uint32_t key = warp * kIters + it;
    if constexpr (kMode == scalar) {
#pragma unroll
      for (int r = 0; r < 8; ++r) red_f16x2(o + size_t(hash(8 * key + r) % kRows) * 64 + 2 * lane, v);
    } else {
#pragma unroll
      for (int j = 0; j < 2; ++j) {  // two warp instructions of 4 rows (8 lanes x 16 bytes each)
        const int r = 4 * j + lane / 8;
        uint32_t row;
        if constexpr (kMode == blocks512)
          row = hash(2 * key + j) % (kRows / 4) * 4 + lane / 8;
        else if constexpr (kMode == block1k)
          row = hash(key) % (kRows / 8) * 8 + r;
        else
          row = hash(8 * key + r) % kRows;
        __half* at = o + size_t(row) * 64 + 8 * (lane % 8);
        if constexpr (kMode == v8f16)
          red_v8_f16(at, v1);
        else if constexpr (kMode == store)
          *reinterpret_cast<uint4*>(at) = make_uint4(v, v, v, v);
        else
          red_v4_f16x2(at, v);
      }
    }
  }
}

using ProbeFn = void (*)(__half*);
const ProbeFn kProbes[] = {probe<scattered>, probe<blocks512>, probe<block1k>,
                           probe<scalar>,    probe<v8f16>,     probe<store>};

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 5;  // ncu: 1
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const unsigned blocks = 4u * static_cast<unsigned>(sms);
  const double rows = double(blocks) * kThreads / 32 * kIters * 8;
  __half* o = nullptr;
  if (cudaMalloc(&o, size_t(kRows) * kRowBytes) != cudaSuccess) return std::printf("cudaMalloc failed\n"), 1;
  cudaMemset(o, 0, size_t(kRows) * kRowBytes);
  cudaEvent_t a, b;
  cudaEventCreate(&a), cudaEventCreate(&b);
  std::printf("%d SMs, %u blocks of %d threads, %.3g rows of 128 bytes per kernel into %d rows\n", sms,
              blocks, kThreads, rows, kRows);
  double base = 0;
  for (int m = 0; m < kModes; ++m) {
    kProbes[m]<<<blocks, kThreads>>>(o);  // warm-up (and the buffer into the L2)
    cudaEventRecord(a);
    for (int r = 0; r < reps; ++r) kProbes[m]<<<blocks, kThreads>>>(o);
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    const double us = 1e3 * ms / reps;
    if (m == 0) base = us;
    std::printf("%-10s %9.1f us  %6.2f ps/row  %5.2fx scattered\n", kNames[m], us, 1e6 * us / rows, us / base);
  }
  const cudaError_t err = cudaDeviceSynchronize();
  std::printf("status: %s\n", cudaGetErrorString(err));
  return err == cudaSuccess ? 0 : 1;
}
