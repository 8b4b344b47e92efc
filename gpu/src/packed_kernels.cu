// Tensor-core kernels with the paper's packing (§4.2): a block owns M = 64 / G adjacent queries
// times the G heads of one KV group (64 rows). The window kernel streams the union of their
// windows; the hierarchical kernel loads the union of their selected chunks once, with an
// intra-chunk softmax per (query, chunk) and the fusion with the window (Eq. 10).
// Fast path only: bf16 inputs, d = dv = 64, S = 64, G in {1, 2, 4, 8, 16}.
//
// The kernels are under gpu/src/packed_kernels/ (gpu/NOTES.md "packed_kernels.cu split (session
// 20)"): common.cuh (a thread's rows), window_tiles.cuh (the window kernels' per-tile steps),
// window_mma_v9.cuh, window_wgmma.cuh (the wgmma kernels' panels, mbarriers and TMA copies),
// window_wgmma_v18.cuh, window_wgmma_v19.cuh (v19 and v20) and fuse.cuh (the fusion kernel);
// this unit holds their launch code and packed_path_applies.
#include <stdexcept>
#include <string>

#include <cuda.h>  // CUtensorMap (the encoder comes from cudaGetDriverEntryPointByVersion)
#include <cudaTypedefs.h>

#include "launch_params.hpp"
#include "mma_common.cuh"

// The kernels' headers (each includes those it builds on).
#include "packed_kernels/common.cuh"
#include "packed_kernels/window_tiles.cuh"
#include "packed_kernels/window_mma_v9.cuh"
#include "packed_kernels/window_wgmma.cuh"
#include "packed_kernels/window_wgmma_v18.cuh"
#include "packed_kernels/window_wgmma_v19.cuh"
#include "packed_kernels/fuse.cuh"

namespace hils::gpu::detail {
namespace {

template <int G>
void launch_window_v9_g(const LaunchParams& p, float* o, float* lse, cudaStream_t stream) {
  constexpr int M = kWindowRows / G;
  const dim3 grid(static_cast<unsigned>((p.T + M - 1) / M), static_cast<unsigned>(p.Hkv));
  static const bool raised = cudaFuncSetAttribute(window_v9_kernel<G>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                  sizeof(WindowSmem)) == cudaSuccess;
  (void)raised;  // a failure surfaces as the launch's error
  window_v9_kernel<G><<<grid, kWindowThreads, sizeof(WindowSmem), stream>>>(p, o, lse);
}

template <int G>
void launch_fuse_g(const LaunchParams& p, const int32_t* selection, const float* selected_score,
                   const float* o_swa, const float* lse_swa, float* o, float* lse,
                   cudaStream_t stream) {
  constexpr int M = kPackedRows / G;
  const int words = static_cast<int>((p.T / p.S) / 32 + 1);
  const size_t smem = (2 * M * p.K + words + 1) * sizeof(int32_t);
  const dim3 grid(static_cast<unsigned>((p.T + M - 1) / M), static_cast<unsigned>(p.Hkv));
  // Static K/V stages plus this dynamic scratch may pass the 48 KB default: raise the limit.
  cudaFuncSetAttribute(fuse_packed_kernel<G>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                       static_cast<int>(smem));
  fuse_packed_kernel<G><<<grid, kPackedThreads, smem, stream>>>(p, selection, selected_score,
                                                                o_swa, lse_swa, o, lse);
}

}  // namespace

bool packed_path_applies(const LaunchParams& p) {
  const int64_t G = p.Hq / p.Hkv;
  const bool shape_ok = p.bf16 && p.d == kTileDim && p.dv == kTileDim && p.S == kTileDim &&
                        (G == 1 || G == 2 || G == 4 || G == 8 || G == 16);
  if (!shape_ok) return false;
  // The fusion's union scratch must fit beside its two static K/V stages.
  const int64_t scratch = (2 * (kPackedRows / G) * p.K + (p.T / p.S) / 32 + 2) * 4;
  return scratch + 2 * 2 * kTileDim * kTilePitch * 2 <= 200 * 1024;
}

void launch_window_v9(const LaunchParams& p, float* o, float* lse, cudaStream_t stream) {
  switch (p.Hq / p.Hkv) {
    case 1: return launch_window_v9_g<1>(p, o, lse, stream);
    case 2: return launch_window_v9_g<2>(p, o, lse, stream);
    case 4: return launch_window_v9_g<4>(p, o, lse, stream);
    case 8: return launch_window_v9_g<8>(p, o, lse, stream);
    default: return launch_window_v9_g<16>(p, o, lse, stream);
  }
}

// v18's tensor maps: K or V as a [Hkv, T, 64] bf16 tensor, boxes of 64 rows x 64 dims written
// 128-byte swizzled, rows past T read as zeros. The encoder is the driver's, found through the
// runtime (no link against libcuda).
CUtensorMap kv_tensor_map(const void* kv, const LaunchParams& p) {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
      fn = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  CUtensorMap map{};
  if (encode == nullptr)
    throw std::runtime_error("window_kernel wgmma_v18: the driver has no cuTensorMapEncodeTiled");
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(kTileDim), static_cast<cuuint64_t>(p.T),
                              static_cast<cuuint64_t>(p.Hkv)};
  const cuuint64_t strides[2] = {kTileDim * 2, static_cast<cuuint64_t>(p.T) * kTileDim * 2};
  const cuuint32_t box[3] = {kTileDim, kTileDim, 1}, unit[3] = {1, 1, 1};
  const CUresult r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<void*>(kv), dims,
                            strides, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE,
                            CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw std::runtime_error("window_kernel wgmma_v18: cuTensorMapEncodeTiled failed (" +
                             std::to_string(static_cast<int>(r)) + ")");
  return map;
}

template <int G>
void launch_window_v18_g(const LaunchParams& p, float* o, float* lse, cudaStream_t stream) {
  constexpr int M = 128 / G;
  constexpr int smem = static_cast<int>(kWindowV18SmemBytes);
  const dim3 grid(static_cast<unsigned>((p.T + M - 1) / M), static_cast<unsigned>(p.Hkv));
  static const bool raised = cudaFuncSetAttribute(window_wgmma_v18_kernel<G>,
                                                  cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                  smem) == cudaSuccess;
  (void)raised;  // a failure surfaces as the launch's error
  window_wgmma_v18_kernel<G><<<grid, 256, smem, stream>>>(p, o, lse, kv_tensor_map(p.k, p), kv_tensor_map(p.v, p));
}

template <int G, bool kBarrierFree>
void launch_window_v19_g(const LaunchParams& p, float* o, float* lse, cudaStream_t stream) {
  constexpr int M = 128 / G;
  constexpr int smem = static_cast<int>(kWindowV19SmemBytes);
  const dim3 grid(static_cast<unsigned>((p.T + M - 1) / M), static_cast<unsigned>(p.Hkv));
  static const bool raised = cudaFuncSetAttribute(window_wgmma_v19_kernel<G, kBarrierFree>,
                                                  cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                  smem) == cudaSuccess;
  (void)raised;  // a failure surfaces as the launch's error
  window_wgmma_v19_kernel<G, kBarrierFree>
      <<<grid, 256, smem, stream>>>(p, o, lse, kv_tensor_map(p.k, p), kv_tensor_map(p.v, p));
}

template <bool kBarrierFree>
void launch_window_v19(const LaunchParams& p, float* o, float* lse, cudaStream_t stream) {
  switch (p.Hq / p.Hkv) {
    case 1: return launch_window_v19_g<1, kBarrierFree>(p, o, lse, stream);
    case 2: return launch_window_v19_g<2, kBarrierFree>(p, o, lse, stream);
    case 4: return launch_window_v19_g<4, kBarrierFree>(p, o, lse, stream);
    case 8: return launch_window_v19_g<8, kBarrierFree>(p, o, lse, stream);
    default: return launch_window_v19_g<16, kBarrierFree>(p, o, lse, stream);
  }
}

void launch_window_v18(const LaunchParams& p, float* o, float* lse, cudaStream_t stream) {
  switch (p.Hq / p.Hkv) {
    case 1: return launch_window_v18_g<1>(p, o, lse, stream);
    case 2: return launch_window_v18_g<2>(p, o, lse, stream);
    case 4: return launch_window_v18_g<4>(p, o, lse, stream);
    case 8: return launch_window_v18_g<8>(p, o, lse, stream);
    default: return launch_window_v18_g<16>(p, o, lse, stream);
  }
}

void launch_window_wgmma(const LaunchParams& p, WindowKernel kernel, float* o, float* lse,
                         cudaStream_t stream) {
  switch (kernel) {
    case WindowKernel::wgmma_v18: return launch_window_v18(p, o, lse, stream);
    case WindowKernel::wgmma_v19: return launch_window_v19<false>(p, o, lse, stream);
    case WindowKernel::wgmma_v20: return launch_window_v19<true>(p, o, lse, stream);
    case WindowKernel::mma_v9: break;  // not a wgmma kernel (window_attention_rows runs it)
  }
  throw std::invalid_argument(std::string("window_kernel: ") + window_kernel_name(kernel) + " is not a wgmma kernel");
}

void launch_fuse_packed(const LaunchParams& p, const int32_t* selection,
                        const float* selected_score, const float* o_swa, const float* lse_swa,
                        float* o, float* lse, cudaStream_t stream) {
  switch (p.Hq / p.Hkv) {
    case 1: return launch_fuse_g<1>(p, selection, selected_score, o_swa, lse_swa, o, lse, stream);
    case 2: return launch_fuse_g<2>(p, selection, selected_score, o_swa, lse_swa, o, lse, stream);
    case 4: return launch_fuse_g<4>(p, selection, selected_score, o_swa, lse_swa, o, lse, stream);
    case 8: return launch_fuse_g<8>(p, selection, selected_score, o_swa, lse_swa, o, lse, stream);
    default: return launch_fuse_g<16>(p, selection, selected_score, o_swa, lse_swa, o, lse, stream);
  }
}

}  // namespace hils::gpu::detail
