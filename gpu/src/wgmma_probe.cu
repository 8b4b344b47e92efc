// Whether the wgmma kernels can run: this build's code for the current GPU must be sm_90a
// (HILS_CUDA_ARCHITECTURES=90a, an sm_90 GPU). A build without 90a, or a GPU that takes another
// target's code from a fat binary, compiles the wgmma wrappers (wgmma_common.cuh) to traps, so
// the host asks first: a one-thread kernel reports whether its own code was compiled with the
// sm_90a features, once per device.
#include <cuda_runtime_api.h>

#include <atomic>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "launch_params.hpp"

namespace hils::gpu::detail {

namespace {

__global__ void wgmma_probe_kernel(int* compiled_with_sm90a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  *compiled_with_sm90a = 1;
#else
  *compiled_with_sm90a = 0;
#endif
}

std::atomic<bool> g_wgmma_disabled{false};

// Runs the probe on the current device; false when it cannot run (no code for this GPU).
bool probe_current_device() {
  int* flag = nullptr;
  if (cudaMalloc(reinterpret_cast<void**>(&flag), sizeof(int)) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  int host = 0;
  wgmma_probe_kernel<<<1, 1>>>(flag);
  const bool ran = cudaGetLastError() == cudaSuccess &&
                   cudaMemcpy(&host, flag, sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess;
  cudaFree(flag);
  cudaGetLastError();  // a failed probe leaves no error behind for the caller's next check
  return ran && host == 1;
}

}  // namespace

bool wgmma_runs_on_current_device() {
  if (g_wgmma_disabled.load()) return false;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  static std::mutex mutex;
  static std::unordered_map<int, bool> probed;
  const std::lock_guard<std::mutex> lock(mutex);
  const auto found = probed.find(device);
  if (found != probed.end()) return found->second;
  return probed[device] = probe_current_device();
}

void disable_wgmma_for_testing(bool disabled) { g_wgmma_disabled = disabled; }

void refuse_wgmma_kernel(const char* field, const char* kernel, const char* instead) {
  throw std::invalid_argument(
      std::string(field) + ": expected a kernel without wgmma on this GPU and build (" + instead +
      "), got " + kernel + ", which needs sm_90a code (HILS_CUDA_ARCHITECTURES=90a) on an sm_90 GPU");
}

}  // namespace hils::gpu::detail
