// Entry point of the GPU tests: on a machine without a usable CUDA device every test exits with
// kSkipReturnCode (ctest's SKIP_RETURN_CODE, see tests/gpu/CMakeLists.txt) and says why, instead
// of failing. Listing the tests (ctest's discovery at build time) needs no device.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include <cstdio>
#include <string>

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
  return session.run();
}
