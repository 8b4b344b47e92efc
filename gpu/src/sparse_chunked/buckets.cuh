// The sparse stage's first steps, the (query, chunk) pairs into buckets by chunk: the count with
// ranks (count_rank_pairs_kernel; v19's per tile, count_rank_pairs_tiled_kernel), the scans of the
// counts into pair and item offsets per segment (scan_kernel), the item descriptors
// (describe_segment_items) and v21's scatter of the pairs into their buckets
// (scatter_ranked_pairs_kernel; v30 on, the weights kernels write the records instead).
#pragma once

#include <cstdint>

#include "sparse_chunked/common.cuh"

namespace hils::gpu::detail {
namespace {

// Exclusive scans of counts (pair offsets) and of ceil(counts / per_item) (item offsets), one
// block per query segment (block b: the n + 1 entries from b (n + 1) on); resets counts to zero
// for the scatter's cursors. offsets/items have n + 1 entries per segment.
// kChained: chunked_v35 (wait_previous_then_allow_next).
template <bool kChained = false>
__global__ void __launch_bounds__(kScanThreads)
    scan_kernel(int32_t* counts, int64_t n, int per_item, int32_t* offsets, int32_t* items) {
  wait_previous_then_allow_next<kChained>();
  __shared__ int32_t s_pairs[kScanThreads], s_items[kScanThreads];
  const int64_t base = static_cast<int64_t>(blockIdx.x) * (n + 1);
  counts += base, offsets += base, items += base;
  const int64_t per_thread = (n + kScanThreads - 1) / kScanThreads;
  const int64_t lo = threadIdx.x * per_thread;
  const int64_t hi = lo + per_thread < n ? lo + per_thread : n;
  int32_t pairs = 0, its = 0;
  for (int64_t i = lo; i < hi; ++i) pairs += counts[i], its += (counts[i] + per_item - 1) / per_item;
  s_pairs[threadIdx.x] = pairs, s_items[threadIdx.x] = its;
  __syncthreads();
  // Hillis-Steele inclusive scan over the thread totals.
  for (int off = 1; off < kScanThreads; off *= 2) {
    const int32_t a = threadIdx.x >= off ? s_pairs[threadIdx.x - off] : 0;
    const int32_t b = threadIdx.x >= off ? s_items[threadIdx.x - off] : 0;
    __syncthreads();
    s_pairs[threadIdx.x] += a, s_items[threadIdx.x] += b;
    __syncthreads();
  }
  int32_t run_pairs = s_pairs[threadIdx.x] - pairs, run_items = s_items[threadIdx.x] - its;
  for (int64_t i = lo; i < hi; ++i) {
    const int32_t c = counts[i];
    offsets[i] = run_pairs, items[i] = run_items;
    run_pairs += c, run_items += (c + per_item - 1) / per_item;
    counts[i] = 0;
  }
  if (threadIdx.x == kScanThreads - 1) offsets[n] = s_pairs[kScanThreads - 1], items[n] = s_items[kScanThreads - 1];
}

// chunked_v8: the pairs of every query segment at once. Pair i of the selection [Hkv, T, K]
// (chunk c >= 0 of query t, group g) counts into counts[s (n_ch + 1) + g nc + c], s = t / seg,
// and keeps its rank among that chunk's pairs of the segment, so the scatter needs no atomics.
// 32-bit indices: chunked_fuse_applies bounds Hkv T K below 2^31.
__global__ void count_rank_pairs_kernel(const int32_t* selection, uint32_t TK, uint32_t K,
                                        uint32_t seg, uint32_t nc, uint32_t n_ch,
                                        uint32_t n_pairs, int32_t* counts, int32_t* rank) {
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n_pairs) return;
  const int32_t c = selection[i];
  if (c < 0) return;
  const uint32_t g = i / TK, s = (i % TK) / K / seg;
  rank[i] = atomicAdd(&counts[s * (n_ch + 1) + g * nc + c], 1);
}

// chunked_v19: count_rank_pairs_kernel with the atomics aggregated per block. A block takes the
// pairs of count_tile_queries(K) adjacent queries of one group and one segment (kCountThreads x
// kCountPairsPerThread pairs at most): each pair's rank among the tile's pairs of its chunk
// comes from an atomicAdd on a histogram of the group's nc chunks in shared memory, then one
// global atomicAdd per chunk the tile selected returns the tile's base in that chunk's count,
// and rank = base + the rank in the tile. The same counts; the ranks are another numbering of
// each bucket's pairs (any one serves the scatter). Global atomics: ~n_pairs / 4 at 512K
// instead of n_pairs, on counters that drew ~37 atomics each (~150 at 128K).
constexpr int kCountThreads = 1024, kCountPairsPerThread = 32;
// Queries per tile of count_rank_pairs_tiled_kernel.
__host__ __device__ constexpr uint32_t count_tile_queries(uint32_t K) {
  return kCountThreads * kCountPairsPerThread / K;
}
// The most chunks per group whose histogram (4 bytes per chunk) the tiled count takes.
constexpr int64_t kCountMaxChunks = 96 * 1024 / 4;
static_assert(kCountMaxChunks < (1 << 16) && kCountThreads * kCountPairsPerThread <= (1 << 16),
              "count_rank_pairs_tiled_kernel packs a chunk and a rank in 16 bits each");
// tile_queries: count_tile_queries(K), or fewer (chunked_v26, v27 at short T: at least two
// blocks per SM).
__global__ void __launch_bounds__(kCountThreads)
    count_rank_pairs_tiled_kernel(const int32_t* selection, uint32_t T, uint32_t K, uint32_t seg,
                                  uint32_t tile_queries, uint32_t tiles_per_seg, uint32_t nc,
                                  uint32_t n_ch, int32_t* counts, int32_t* rank) {
  extern __shared__ int32_t hist[];  // [nc]: the tile's pairs per chunk, then the global bases
  const uint32_t tile = blockIdx.x % tiles_per_seg, gs = blockIdx.x / tiles_per_seg;
  const uint32_t n_seg = (T + seg - 1) / seg, g = gs / n_seg, s = gs % n_seg;
  const uint32_t tq0 = s * seg + tile * tile_queries;
  const uint32_t seg_end = (s + 1) * seg < T ? (s + 1) * seg : T;
  if (tq0 >= seg_end) return;
  const uint32_t tq1 = tq0 + tile_queries < seg_end ? tq0 + tile_queries : seg_end;
  const uint32_t first = (g * T + tq0) * K, n = (tq1 - tq0) * K;  // the tile's pairs
  for (uint32_t b = threadIdx.x; b < nc; b += kCountThreads) hist[b] = 0;
  __syncthreads();
  // Pair r of this thread: its chunk << 16 | its rank in the tile (both below 2^16: nc <=
  // kCountMaxChunks, n <= 2^15), or kNone.
  constexpr uint32_t kNone = 0xffffffffu;
  uint32_t pair[kCountPairsPerThread];
#pragma unroll
  for (int r = 0; r < kCountPairsPerThread; ++r) {
    const uint32_t j = threadIdx.x + kCountThreads * r;
    const int32_t c = j < n ? selection[first + j] : -1;
    pair[r] = c >= 0 ? static_cast<uint32_t>(c) << 16 | static_cast<uint32_t>(atomicAdd(&hist[c], 1)) : kNone;
  }
  __syncthreads();
  int32_t* seg_counts = counts + s * (n_ch + 1) + g * nc;
  for (uint32_t b = threadIdx.x; b < nc; b += kCountThreads)
    if (hist[b] > 0) hist[b] = atomicAdd(&seg_counts[b], hist[b]);
  __syncthreads();
#pragma unroll
  for (int r = 0; r < kCountPairsPerThread; ++r)
    if (pair[r] != kNone)
      rank[first + threadIdx.x + kCountThreads * r] = hist[pair[r] >> 16] + static_cast<int32_t>(pair[r] & 0xffffu);
}

// The item descriptors of every segment, thread s n_ch + i for chunk i of
// segment s (its offsets and items at s (n_ch + 1), its descriptors at s max_items).
// chunked_v28, v29: 2^log2_lanes threads per chunk (lane l writes the chunk's items l, l + lanes,
// ...), as many as the chunks' mean item count (at 16K one thread wrote ~32 descriptors one after
// another); log2_lanes = 0: one thread per chunk, as before.
struct DescribeArgs {
  const int32_t* offsets;
  const int32_t* items;
  int64_t n_ch, n_seg, max_items;
  int per_item, log2_lanes;
  ItemDesc* item_desc;
};
__device__ __forceinline__ void describe_segment_items(int64_t thread, const DescribeArgs& a) {
  const int64_t i = thread >> a.log2_lanes;
  if (i >= a.n_seg * a.n_ch) return;
  const int lanes = 1 << a.log2_lanes, lane = static_cast<int>(thread & (lanes - 1));
  const int64_t s = i / a.n_ch, chunk = i % a.n_ch, at = s * (a.n_ch + 1) + chunk;
  const int32_t first = a.offsets[at], count = a.offsets[at + 1] - first;
  ItemDesc* desc = a.item_desc + s * a.max_items;
  for (int32_t done = lane * a.per_item, it = a.items[at] + lane; done < count;
       done += lanes * a.per_item, it += lanes)
    desc[it] = ItemDesc{static_cast<int32_t>(chunk), first + done,
                        count - done < a.per_item ? count - done : a.per_item, 0};
}
__global__ void describe_segment_items_kernel(DescribeArgs a) {
  describe_segment_items(static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x, a);
}

// chunked_v8: pair i into its segment's buckets (segment s at s bucket_stride) at its chunk's
// offset plus its rank; entry (t - s seg) << 6 | slot as below.
struct ScatterArgs {
  const int32_t* selection;
  const int32_t* rank;
  uint32_t TK, K, seg, nc, n_ch, n_pairs;
  const int32_t* offsets;
  int64_t bucket_stride;
  uint32_t* bucket;
};
__device__ __forceinline__ void scatter_ranked_pair(uint32_t i, const ScatterArgs& a) {
  if (i >= a.n_pairs) return;
  const int32_t c = a.selection[i];
  if (c < 0) return;
  const uint32_t g = i / a.TK, rest = i % a.TK, t = rest / a.K, s = t / a.seg;
  const int32_t pos = a.offsets[s * (a.n_ch + 1) + g * a.nc + c] + a.rank[i];
  a.bucket[s * a.bucket_stride + pos] = ((t - s * a.seg) << 6) | (rest % a.K);
}
__global__ void scatter_ranked_pairs_kernel(ScatterArgs a) {
  scatter_ranked_pair(blockIdx.x * blockDim.x + threadIdx.x, a);
}

}  // namespace
}  // namespace hils::gpu::detail
