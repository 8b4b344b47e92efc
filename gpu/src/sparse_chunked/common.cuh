// The chunk-major sparse stage's shared layer (sparse_chunked.cu; every header under
// gpu/src/sparse_chunked/ includes it): the scan's and the weights kernels' block sizes, the pairs
// of one item (pairs_per_item), the pair weights' formats (PairWeights: v21's fp32 weights, v30's
// fp16 records) and sizes, the chained launches' wait (wait_previous_then_allow_next, chunked_v35)
// and an item's descriptor (ItemDesc).
#pragma once

#include <cstdint>

#include "launch_params.hpp"
#include "mma_common.cuh"

namespace hils::gpu::detail {
namespace {

constexpr int kScanThreads = 1024;
constexpr int kReduceWarps = 8;

// Pairs of one item: 512 / G, i.e. 32 slices of 16 rows (query, head).
template <int G>
__host__ __device__ constexpr int pairs_per_item() { return 512 / G; }

// How the weights kernel hands each pair's G fusion weights w_c / l to the chunk kernel, at the
// pair's bucket position: f32 (chunked_v21: G floats; the scatter writes the bucket entry), or
// f16_records (chunked_v30, v35, v36: the entry ((t - s seg) << 6 | slot, as the scatter's) and the
// G weights in fp16, head j's at half j after the entry's word, in one record of
// pair_record_words<G>() 32-bit words, a multiple of 16 bytes: G = 8 takes 32 bytes, one L2
// sector; no scatter).
enum class PairWeights { f32, f16_records };
template <int G>
__host__ __device__ constexpr int pair_record_words() { return (1 + (G + 1) / 2 + 3) / 4 * 4; }
// 32-bit words per pair (rounded up) of the pair weights in the scratch.
template <int G>
__host__ __device__ constexpr int pair_weight_words(PairWeights format) {
  return format == PairWeights::f32 ? G : pair_record_words<G>();
}

// chunked_v35: the stage's kernels after the count in one chain of programmatic dependent
// launches (launch_programmatic with after_previous). Each block of a chained kernel first waits
// for the previous kernel of the stream (completed, its writes visible), then lets the next
// kernel launch; the next one thus launches once every block of this one has passed its wait
// (this kernel's last wave) and its blocks wait in the slots this one leaves. Every block
// passes the wait before it does anything, so no kernel of the chain completes before its
// predecessor: the stream's order, without the launch gap between the kernels.
template <bool kChained>
__device__ __forceinline__ void wait_previous_then_allow_next() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if constexpr (kChained) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  }
#endif
}

// One item of the chunk kernel: its chunk, its first pair in the buckets, its pairs.
struct ItemDesc {
  int32_t chunk, first, count, unused;
};

}  // namespace
}  // namespace hils::gpu::detail
