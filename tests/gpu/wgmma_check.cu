// Device side of the wgmma test: one block (one warpgroup) computes a 64 x N x 64 bf16 product
// with gpu/src/wgmma_common.cuh and with mma.sync m16n8k16 (mma_common.cuh).
#include "wgmma_check.hpp"

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "mma_common.cuh"
#include "wgmma_common.cuh"

namespace hils::gpu::testing {
namespace {

namespace wg = detail::wg;
using detail::kWarp;

constexpr int kK = 64;             // the product's depth: 4 k16 steps
constexpr int kPanelBytes = 8192;  // 64 rows of 128 bytes
constexpr int kSmemBytes = kPanelBytes + 2 * kPanelBytes + wg::kAtomBytes;

__device__ void copy16(unsigned char* dst, const uint16_t* src) {
  *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
}

template <int kTiles, bool kASmem, bool kBNMajor>
__global__ void __launch_bounds__(128) product_kernel(const uint16_t* a, const uint16_t* b,
                                                      float* d_wgmma, float* d_mma_sync) {
  constexpr int n = 8 * kTiles;
  extern __shared__ unsigned char raw[];
  // Panels on a 1024-byte boundary (the swizzle's period).
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(raw));
  unsigned char* a_panel = raw + ((wg::kAtomBytes - base % wg::kAtomBytes) % wg::kAtomBytes);
  unsigned char* b_panels = a_panel + kPanelBytes;
  const int tid = threadIdx.x, warp = tid / kWarp, lane = tid % kWarp;

  for (int i = tid; i < 64 * 8; i += 128)
    copy16(a_panel + wg::sw128_offset(i / 8, (i % 8) * 8), a + (i / 8) * kK + (i % 8) * 8);
  if (kBNMajor) {  // b is [k][n]: panel p holds columns 64p .. 64p + 63, one row per k
    for (int i = tid; i < kK * (n / 8); i += 128) {
      const int k = i / (n / 8), chunk = i % (n / 8);
      copy16(b_panels + (chunk / 8) * kPanelBytes + wg::sw128_offset(k, (chunk % 8) * 8),
             b + k * n + chunk * 8);
    }
  } else {  // b is [n][k]: one row per n
    for (int i = tid; i < n * 8; i += 128)
      copy16(b_panels + wg::sw128_offset(i / 8, (i % 8) * 8), b + (i / 8) * kK + (i % 8) * 8);
  }
  wg::fence_proxy_async();
  __syncthreads();

  const uint16_t* row0 = a + (16 * warp + lane / 4) * kK;
  uint32_t qa[4][4];
  detail::load_q_fragments(qa, reinterpret_cast<const __nv_bfloat16*>(row0),
                           reinterpret_cast<const __nv_bfloat16*>(row0 + 8 * kK));

  float d[kTiles][4];
  wg::fence();
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    const uint64_t b_desc = kBNMajor
                                ? wg::desc_advance(wg::desc_n_major(b_panels, kPanelBytes),
                                                   16 * wg::kPanelRowBytes * s)
                                : wg::desc_advance(wg::desc_k_major(b_panels), 32 * s);
    if (kASmem)
      wg::mma_ss<kBNMajor>(d, wg::desc_advance(wg::desc_k_major(a_panel), 32 * s), b_desc, s > 0);
    else
      wg::mma_rs<kBNMajor>(d, qa[s], b_desc, s > 0);
  }
  wg::commit();
  wg::wait<0>();
  wg::fence_operands(d);

  float c[kTiles][4] = {};
#pragma unroll
  for (int s = 0; s < 4; ++s)
#pragma unroll
    for (int j = 0; j < kTiles; ++j) {
      const int col = 8 * j + lane / 4, k = 16 * s + 2 * (lane % 4);
      uint32_t b0, b1;
      if (kBNMajor) {
        b0 = b[k * n + col] | (uint32_t{b[(k + 1) * n + col]} << 16);
        b1 = b[(k + 8) * n + col] | (uint32_t{b[(k + 9) * n + col]} << 16);
      } else {
        b0 = *reinterpret_cast<const uint32_t*>(b + col * kK + k);
        b1 = *reinterpret_cast<const uint32_t*>(b + col * kK + k + 8);
      }
      detail::mma_16816(c[j], qa[s], b0, b1);
    }

#pragma unroll
  for (int j = 0; j < kTiles; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int row = 16 * warp + lane / 4 + 8 * (i / 2), col = 8 * j + 2 * (lane % 4) + i % 2;
      d_wgmma[row * n + col] = d[j][i];
      d_mma_sync[row * n + col] = c[j][i];
    }
}

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
}

template <int kTiles, bool kASmem, bool kBNMajor>
void launch(const uint16_t* a, const uint16_t* b, float* d_wgmma, float* d_mma_sync) {
  auto kernel = product_kernel<kTiles, kASmem, kBNMajor>;
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes),
        "cudaFuncSetAttribute");
  kernel<<<1, 128, kSmemBytes>>>(a, b, d_wgmma, d_mma_sync);
  check(cudaGetLastError(), "product_kernel launch");
}

template <int kTiles>
void launch_n(const WgmmaShape& shape, const uint16_t* a, const uint16_t* b, float* dw, float* dm) {
  if (shape.a_in_smem)
    shape.b_n_major ? launch<kTiles, true, true>(a, b, dw, dm) : launch<kTiles, true, false>(a, b, dw, dm);
  else
    shape.b_n_major ? launch<kTiles, false, true>(a, b, dw, dm) : launch<kTiles, false, false>(a, b, dw, dm);
}

}  // namespace

void wgmma_product(const WgmmaShape& shape, const std::vector<uint16_t>& a,
                   const std::vector<uint16_t>& b, std::vector<float>& d_wgmma,
                   std::vector<float>& d_mma_sync) {
  if (shape.n != 64 && shape.n != 128) throw std::invalid_argument("wgmma_product: n must be 64 or 128");
  if (a.size() != 64u * kK || b.size() != static_cast<size_t>(shape.n) * kK)
    throw std::invalid_argument("wgmma_product: a must hold 64 x 64 and b n x 64 values");
  const size_t d_count = 64u * shape.n;
  uint16_t *da = nullptr, *db = nullptr;
  float *dw = nullptr, *dm = nullptr;
  check(cudaMalloc(&da, a.size() * 2), "cudaMalloc");
  check(cudaMalloc(&db, b.size() * 2), "cudaMalloc");
  check(cudaMalloc(&dw, d_count * 4), "cudaMalloc");
  check(cudaMalloc(&dm, d_count * 4), "cudaMalloc");
  check(cudaMemcpy(da, a.data(), a.size() * 2, cudaMemcpyHostToDevice), "cudaMemcpy");
  check(cudaMemcpy(db, b.data(), b.size() * 2, cudaMemcpyHostToDevice), "cudaMemcpy");
  if (shape.n == 64)
    launch_n<8>(shape, da, db, dw, dm);
  else
    launch_n<16>(shape, da, db, dw, dm);
  check(cudaDeviceSynchronize(), "product_kernel");
  d_wgmma.resize(d_count);
  d_mma_sync.resize(d_count);
  check(cudaMemcpy(d_wgmma.data(), dw, d_count * 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
  check(cudaMemcpy(d_mma_sync.data(), dm, d_count * 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
  for (void* p : {static_cast<void*>(da), static_cast<void*>(db), static_cast<void*>(dw),
                  static_cast<void*>(dm)})
    cudaFree(p);
}

}  // namespace hils::gpu::testing
