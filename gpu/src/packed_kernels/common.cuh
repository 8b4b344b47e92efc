// The packed kernels' rows (packed_kernels.cu; the window and fusion headers include it): a block
// of 16-row warps whose row r is (query t0 + r / G, head g G + r % G), and ThreadRows, the two
// rows a thread holds in mma.sync's C layout (query slot, query head, validity).
#pragma once

#include <cstdint>

#include "mma_common.cuh"

namespace hils::gpu::detail {
namespace {

// The two rows a thread holds in C layout: (query slot, query head) of each, and validity.
template <int G>
struct ThreadRows {
  int64_t t[2], h[2];
  bool valid[2];
  int m[2];

  __device__ ThreadRows(int64_t t0, int64_t g, int64_t T) {
    const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = warp * 16 + lane / 4 + 8 * i;
      m[i] = r / G;
      t[i] = t0 + m[i];
      h[i] = g * G + r % G;
      valid[i] = t[i] < T;
    }
  }
};

}  // namespace
}  // namespace hils::gpu::detail
