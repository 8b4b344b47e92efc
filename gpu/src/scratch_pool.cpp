// The library's own stream-ordered memory pool per device, for the kernels' scratch (the packed
// selection's bf16 keys, the sparse stage's buckets, weights and fp16 sums). Its release threshold
// is at the maximum, so the memory stays mapped between calls: with the process's default pool
// (threshold 0 unless the caller raised it) every synchronize would give it back and the next
// call would map up to ~1 GB again. The default pool is never touched (gpu/NOTES.md "Scratch pool").
#include <cuda_runtime_api.h>

#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "hils/gpu/scratch.hpp"
#include "scratch_pool.hpp"

namespace hils::gpu {
namespace {

std::mutex g_pools_mutex;

struct DevicePool {
  cudaMemPool_t pool = nullptr;
  size_t device_bytes = 0;  // the device's whole memory: more can never be allocated
};

// Device -> its pool, created at the device's first scratch and kept for the process's life
// (destroying it at exit could run after the CUDA context is gone).
std::unordered_map<int, DevicePool>& pools() {
  static auto* by_device = new std::unordered_map<int, DevicePool>();
  return *by_device;
}

[[noreturn]] void fail(const std::string& what, cudaError_t err) {
  cudaGetLastError();  // the exception reports it: leave no error for the caller's next check
  throw std::runtime_error("hils::gpu " + what + " (" + cudaGetErrorString(err) + ")");
}

int current_device() {
  int device = 0;
  if (const cudaError_t err = cudaGetDevice(&device); err != cudaSuccess)
    fail("scratch pool: no current device", err);
  return device;
}

DevicePool pool_of(int device) {
  const std::lock_guard<std::mutex> lock(g_pools_mutex);
  if (const auto found = pools().find(device); found != pools().end()) return found->second;
  size_t free_bytes = 0, device_bytes = 0;
  if (const cudaError_t err = cudaMemGetInfo(&free_bytes, &device_bytes); err != cudaSuccess)
    fail("scratch pool: cudaMemGetInfo on device " + std::to_string(device) + " failed", err);
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.handleTypes = cudaMemHandleTypeNone;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  cudaMemPool_t pool = nullptr;
  if (const cudaError_t err = cudaMemPoolCreate(&pool, &props); err != cudaSuccess)
    fail("scratch pool: cudaMemPoolCreate on device " + std::to_string(device) + " failed", err);
  uint64_t keep_all = UINT64_MAX;
  if (const cudaError_t err = cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_all);
      err != cudaSuccess) {
    cudaMemPoolDestroy(pool);
    fail("scratch pool: setting the release threshold failed", err);
  }
  return pools()[device] = DevicePool{pool, device_bytes};
}

}  // namespace

size_t scratch_bytes_reserved() {
  const int device = current_device();
  cudaMemPool_t pool = nullptr;
  {
    const std::lock_guard<std::mutex> lock(g_pools_mutex);
    const auto found = pools().find(device);
    if (found == pools().end()) return 0;
    pool = found->second.pool;
  }
  uint64_t bytes = 0;
  if (const cudaError_t err = cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &bytes);
      err != cudaSuccess)
    fail("scratch pool: reading the reserved bytes failed", err);
  return static_cast<size_t>(bytes);
}

void release_scratch_memory() {
  const std::lock_guard<std::mutex> lock(g_pools_mutex);
  for (const auto& [device, entry] : pools())
    if (const cudaError_t err = cudaMemPoolTrimTo(entry.pool, 0); err != cudaSuccess)
      fail("scratch pool: trimming the pool of device " + std::to_string(device) + " failed", err);
}

namespace detail {

void* take_scratch(size_t bytes, cudaStream_t stream, const char* stage) {
  const DevicePool entry = pool_of(current_device());
  const std::string what = std::string(stage) + " scratch: cannot allocate " + std::to_string(bytes) + " bytes";
  if (bytes > entry.device_bytes)  // never: say so without asking the driver
    throw std::runtime_error("hils::gpu " + what + " (more than the device's " +
                             std::to_string(entry.device_bytes) + ")");
  void* scratch = nullptr;
  if (const cudaError_t err = cudaMallocFromPoolAsync(&scratch, bytes, entry.pool, stream); err != cudaSuccess)
    fail(what, err);
  return scratch;
}

void give_back_scratch(void* scratch, cudaStream_t stream) { cudaFreeAsync(scratch, stream); }

}  // namespace detail
}  // namespace hils::gpu
