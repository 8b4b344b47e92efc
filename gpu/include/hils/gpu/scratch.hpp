// The library's scratch memory besides the caller's workspace (gpu/NOTES.md "Scratch pool").
#pragma once

#include <cstddef>

namespace hils::gpu {

// The packed selection and the chunk-major sparse stage take stream-ordered scratch (up to ~1 GB
// at T = 512K) from a memory pool of the library's own, one per device, which keeps that memory
// mapped between calls (so no call maps it again after the caller synchronizes); the process's
// default pool is left as the caller set it. Under stream capture the scratch becomes the
// graph's own allocation nodes. A size that cannot be allocated throws std::runtime_error
// "hils::gpu <stage> scratch: cannot allocate <bytes> bytes (<CUDA error>)".

// Bytes the scratch pool of the current device holds now (0 before the first packed call).
size_t scratch_bytes_reserved();
// Gives the memory of every scratch pool back to its device (call it once the caller's streams
// have finished their work with the library); the next call maps what it needs again.
void release_scratch_memory();

}  // namespace hils::gpu
