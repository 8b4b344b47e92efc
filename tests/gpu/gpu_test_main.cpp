// Entry point of the GPU tests: on a machine without a usable CUDA device every test exits with
// kSkipReturnCode (ctest's SKIP_RETURN_CODE, see tests/gpu/CMakeLists.txt) and says why, instead
// of failing. Listing the tests (ctest's discovery at build time) needs no device.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "device_support.hpp"
#include "hils/gpu/attention.hpp"

namespace {

constexpr int kSkipReturnCode = 77;

// An empty string when a CUDA device can be used, else the reason it cannot.
std::string device_unusable_reason() {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) return std::string("cudaGetDeviceCount: ") + cudaGetErrorString(err);
  if (count == 0) return "no CUDA device found";
  return "";
}

// HILS_GPU_SPARSE_KERNEL=chunked_v21|chunked_v30|... runs every test with that sparse stage
// as the process default (gpu/NOTES.md); "" when set and valid or unset, else what is wrong.
std::string apply_sparse_kernel_env() {
  const char* name = std::getenv("HILS_GPU_SPARSE_KERNEL");
  if (name == nullptr) return "";
  const std::string value = name;
  std::string names;
  for (auto kernel : hils::gpu::kSparseKernels) {
    if (value == hils::gpu::sparse_kernel_name(kernel)) {
      hils::gpu::set_sparse_kernel(kernel);
      return "";
    }
    names += (names.empty() ? "" : ", ") + std::string(hils::gpu::sparse_kernel_name(kernel));
  }
  return "HILS_GPU_SPARSE_KERNEL: expected one of " + names + ", got '" + value + "'";
}

}  // namespace

// argv -> Catch2's exit code, or kSkipReturnCode when tests would run without a device.
int main(int argc, char** argv) {
  Catch::Session session;
  if (int status = session.applyCommandLine(argc, argv); status != 0) return status;
  const Catch::ConfigData& config = session.configData();
  const bool listing = config.listTests || config.listTestNamesOnly || config.listTags ||
                       config.listReporters || config.showHelp;
  if (!listing) {
    if (std::string reason = device_unusable_reason(); !reason.empty()) {
      std::printf("SKIPPED: no usable GPU (%s)\n", reason.c_str());
      return kSkipReturnCode;
    }
  }
  if (std::string problem = apply_sparse_kernel_env(); !problem.empty()) {
    std::fprintf(stderr, "%s\n", problem.c_str());
    return 2;
  }
  try {
    hils::gpu::testing::sparse_kernels_under_test();  // HILS_GPU_SPARSE_KERNELS, checked once here
    hils::gpu::testing::window_kernels_under_test();  // HILS_GPU_WINDOW_KERNELS, likewise
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  return session.run();
}
