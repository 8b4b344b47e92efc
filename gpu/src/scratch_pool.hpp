// Stream-ordered scratch from the library's own pool (scratch_pool.cpp; internal to gpu/src).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace hils::gpu::detail {

// `bytes` of scratch from the pool of the current device, in `stream`'s order; throws
// std::runtime_error "hils::gpu <stage> scratch: cannot allocate <bytes> bytes (<CUDA error>)"
// when they cannot be had, and leaves no CUDA error behind.
void* take_scratch(size_t bytes, cudaStream_t stream, const char* stage);
// Frees scratch of take_scratch in `stream`'s order.
void give_back_scratch(void* scratch, cudaStream_t stream);

}  // namespace hils::gpu::detail
