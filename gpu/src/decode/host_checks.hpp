// Host helpers of the decode units (decode_kernels.cu, decode_quantize.cu): ceil_div, and their
// errors: require (std::invalid_argument with the message) and check_launch (the last launch's
// error as std::runtime_error "decode_step: <what>: <CUDA's message>").
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace hils::gpu {
namespace detail {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

void require(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument(message);
}

void check_launch(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    throw std::runtime_error(std::string("decode_step: ") + what + ": " + cudaGetErrorString(err));
}

}  // namespace
}  // namespace detail
}  // namespace hils::gpu
