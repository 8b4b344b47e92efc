// Chunk-major hierarchical fusion (reference/SEMANTICS.md §5, Eq. 10) for the packed shapes (bf16,
// d = dv = S = 64, G | 16). The query-major packed kernel loads every selected chunk once per block
// of M = 64/G queries; with little overlap between the queries' selections that is ~K chunks (16 KB
// each) per query and group, which bounds it by K/V bytes. Here the (query, chunk) pairs are
// bucketed by chunk, a block loads one chunk's K/V once and runs every query (x G heads) that
// selected it on tensor cores; each (query, head, slot) writes its intra-chunk result o_c
// (normalised, fp16) to a scratch buffer, and a reduction per (query, head) forms the fusion
// softmax over [s_hat(c)..., lse_swa (, 0)] with those values. Queries go in segments so the
// scratch stays bounded (Hq x segment x K x 64 halves).
//
// Kernels per segment: count pairs per chunk -> exclusive scans (pairs, items) -> scatter the
// pairs into buckets -> one block per item (a chunk and up to 512/G of its pairs) -> reduce.
//
// SparseKernel::atomic_v5 (gpu/NOTES.md "sparse v5") drops the fp16 scratch and the reduce: the
// fusion weights depend only on the selected scores and lse_swa, so a first kernel per segment
// forms each row's fusion softmax (m, 1 / l), writes lse and starts o at its window term, and
// the chunk kernel adds w_c * o_c of every (row, slot) into o in fp32 with vector reductions
// (red.global.add.v2.f32). Segments are sized so that the segment's o and q stay in L2. The sum
// order of the reductions varies from run to run, so o varies in its last bits (fp32 rounding).
//
// SparseKernel::chunked_v6 (gpu/NOTES.md "sparse v6") is chunked_v4 with fewer
// instructions per 16-row slice: a kernel after the scan writes one descriptor per item (no
// binary search over the items), the block turns its rows into q offsets and scratch rows once
// (shared memory), the softmax takes one FFMA and one ex2 per score (scale and log2 e folded, the
// landmark column masked in the registers that hold it), and the fp16 rows are staged with
// stmatrix. Same scratch, same reduce. chunked_v7 runs two slices per warp step (measured not
// faster: fewer warps per SM). chunked_v8 is chunked_v6 with the pairs of all
// segments bucketed at once (count with ranks, a scan block per segment, a scatter without
// atomics) instead of four launches per segment. chunked_v9 is chunked_v8 with the chunk kernel
// on wgmma (sm_90a; measured not faster, gpu/NOTES.md "sparse v9"). chunked_v10 is v5's order
// (weights first) on v8's bucketing and v6's chunk kernel: each row, scaled by its fusion weight,
// is added into an fp16 copy of o with 16-byte f16x2 reductions (half of v5's L2 reduction
// sectors), segments sized to keep that copy and q in L2; no partials, no reduce (gpu/NOTES.md
// "sparse v10": -14% against v8 at 512K on the H100). chunked_v11 is v10 with the rows'
// weights formed before the chunk kernel and stored in bucket order (-11% against v10), the
// default where wgmma cannot run; chunked_v12 is v11 on v9's wgmma chunk kernel (-8% against
// v11 on the H100); chunked_v13 is v12 with the pair-weights kernel's loads issued before its
// arithmetic (-4% against v12); chunked_v14 is v13 with one bulk (TMA) reduction per row
// (measured slower: the L2 takes more requests per row, gpu/NOTES.md "sparse v14"); chunked_v15
// is v13 with a leaner weights kernel and query segments of 3/4 of the L2 (-4%).
// chunked_v16 is v11 (no wgmma) with v15's weights kernel and segments; chunked_v17 is v15 with
// the pair weights of every segment formed in one launch; chunked_v18 is v15 with the segment's
// o16 laid out [queries, Hq, 64] (a pair's G heads reduced into adjacent rows; gpu/NOTES.md
// "sparse v16-v18"); chunked_v19 is v15 with the pairs' ranks counted per tile of
// queries in shared memory and query segments of the whole L2 (-7%, gpu/NOTES.md "sparse v19,
// v20"); chunked_v20 is v19 with segment s + 1's weights kernel started in the last wave of
// segment s's chunk kernel, and s + 1's chunk kernel in the last wave of s's convert
// (programmatic dependent launch; measured slower); chunked_v21 (the default where wgmma cannot
// run) is v16 with v19's count and segments; chunked_v22 is v19 with segment s + 1's weights
// kernel and segment s's conversion in one launch (measured slower). chunked_v23 is v19 with the
// bucket entries written by the weights kernel instead of a scatter launch (measured slower);
// chunked_v24 is v23 with a conversion of 16 bytes per thread that discards the o16 lines it read
// from the L2; chunked_v25 is v19 with v24's conversion. v24 to v29 also read an fp16 o_swa and
// write a bf16 o (hils::gpu::fuse_rows; gpu/NOTES.md "Sparse v23, v24, v25"). chunked_v26 is v25
// with a persistent chunk kernel (items taken from a cursor), segments that split T evenly and
// the count's tiles shortened at short T; chunked_v27 is v26 with q two steps ahead (measured
// equal); chunked_v28 is v26 with several threads per chunk in the describe; chunked_v29 is v28
// with the describe, the scatter and segment 0's pair weights in one launch (gpu/NOTES.md
// "Sparse v26, v27"); chunked_v30 (the default) is v29 with each pair's bucket entry and fp16
// weights in one 32-byte record written by the weights kernel (no scatter), chunked_v31 v29 with
// fp16 pair weights, chunked_v32 v30 with the fp16 weights alone (16 bytes for G = 8), the query
// in their spare bits (gpu/NOTES.md "Sparse v30, v31, v32"); chunked_v35 is v30 with its kernels
// after the count chained by programmatic dependent launch (gpu/NOTES.md "Sparse v35"), chunked_v36
// v35 with a pair-weights kernel whose lanes hold (head, G slots) (gpu/NOTES.md "Sparse v36").
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "launch_params.hpp"
#include "scratch_pool.hpp"
#include "mma_common.cuh"
#include "wgmma_common.cuh"

namespace hils::gpu::detail {
namespace {

constexpr int kScanThreads = 1024;
constexpr int kReduceWarps = 8;
int64_t g_segment_queries = 0;  // 0: choose from the scratch budget
std::optional<SparseKernel> g_sparse_kernel;  // nullopt: default_sparse_kernel() at each call
constexpr size_t kPartialBudget = size_t{1} << 30;  // bytes of fp16 partial outputs per segment

// Pairs of one item: 512 / G, i.e. 32 slices of 16 rows (query, head).
template <int G>
__host__ __device__ constexpr int pairs_per_item() { return 512 / G; }

// How the weights kernel hands each pair's G fusion weights w_c / l to the chunk kernel, at the
// pair's bucket position: f32 (chunked_v11-v29: G floats; the scatter writes the bucket entry),
// f16 (chunked_v31: G halves, the scatter as before), f16_records (chunked_v30: the entry
// ((t - s seg) << 6 | slot, as the scatter's) and the G weights in fp16, head j's at half j after
// the entry's word, in one record of pair_record_words<G>() 32-bit words, a multiple of 16 bytes:
// G = 8 takes 32 bytes, one L2 sector; no scatter), f16_packed (chunked_v32, G a multiple of 8
// and segments below 2^16 queries: the G weights in fp16 alone, 16 bytes for G = 8, with the
// pair's query t - s seg in their spare bits: a weight lies in [0, 1], whose fp16 codes leave
// bits 14 and 15 zero, so half j < 8 carries bits 2 j and 2 j + 1 of t - s seg there; no scatter).
enum class PairWeights { f32, f16, f16_records, f16_packed };
template <int G>
__host__ __device__ constexpr int pair_record_words() { return (1 + (G + 1) / 2 + 3) / 4 * 4; }
// 32-bit words per pair (rounded up) of the pair weights in the scratch.
template <int G>
__host__ __device__ constexpr int pair_weight_words(PairWeights format) {
  return format == PairWeights::f32 ? G
         : format == PairWeights::f16_records ? pair_record_words<G>()
                                              : (G + 1) / 2;
}
// f16_packed: the most queries a segment may hold (t - s seg in 16 bits).
constexpr int64_t kPackedQueryLimit = int64_t{1} << 16;
// f16_packed where G is a multiple of 8 (the only G it is chosen for), f16_records otherwise (so
// that every G instantiates).
template <int G>
constexpr PairWeights packed_or_records() {
  return G % 8 == 0 ? PairWeights::f16_packed : PairWeights::f16_records;
}
// f16_packed: the fp16 code of weight w (clamped to [0, 1], NaN to 1, so bits 14 and 15 are free)
// with two bits of the query index in bits 14 and 15.
__device__ __forceinline__ uint32_t packed_weight_bits(float w, uint32_t two_bits) {
  const __half h = __float2half_rn(fminf(fmaxf(w, 0.0f), 1.0f));
  return static_cast<uint32_t>(__half_as_ushort(h)) | (two_bits & 3u) << 14;
}

// Programmatic dependent launch (Hopper; chunked_v20): a kernel launched with
// cudaLaunchAttributeProgrammaticStreamSerialization (launch_after_previous below) may start once
// every block of the previous kernel of the stream has called allow_next_grid() (or exited),
// i.e. in that kernel's last wave. chunked_v20 launches that way only kernels that read nothing
// the previous kernel writes (decode_kernels.cu has the same pair with griddepcontrol.wait).
__device__ __forceinline__ void allow_next_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
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

__global__ void count_pairs_kernel(const int32_t* selection, int64_t T, int64_t K, int64_t t0,
                                   int64_t tn, int64_t Hkv, int64_t nc, int32_t* counts) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= Hkv * tn * K) return;
  const int64_t g = i / (tn * K), rest = i % (tn * K);
  const int32_t c = selection[(g * T + t0) * K + rest];
  if (c >= 0) atomicAdd(&counts[g * nc + c], 1);
}

// One item of the chunk kernel (chunked_v6/v7): its chunk, its first pair in the buckets, its pairs.
struct ItemDesc {
  int32_t chunk, first, count, unused;
};

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

// chunked_v6/v7: the descriptors of chunk i's items, one thread per chunk (the scan's one block
// wrote them serially at first: 136 us per 16K-query segment at 512K instead of 46).
__global__ void describe_items_kernel(const int32_t* offsets, const int32_t* items, int64_t n,
                                      int per_item, ItemDesc* item_desc) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int32_t first = offsets[i], count = offsets[i + 1] - first;
  for (int32_t done = 0, it = items[i]; done < count; done += per_item, ++it)
    item_desc[it] = ItemDesc{static_cast<int32_t>(i), first + done,
                             count - done < per_item ? count - done : per_item, 0};
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

// chunked_v8: describe_items_kernel over every segment, thread s n_ch + i for chunk i of
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

// Bucket entry: (t - t0) << 6 | slot.
__global__ void scatter_pairs_kernel(const int32_t* selection, int64_t T, int64_t K, int64_t t0,
                                     int64_t tn, int64_t Hkv, int64_t nc, const int32_t* offsets,
                                     int32_t* cursor, uint32_t* bucket) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= Hkv * tn * K) return;
  const int64_t g = i / (tn * K), rest = i % (tn * K);
  const int32_t c = selection[(g * T + t0) * K + rest];
  if (c < 0) return;
  const int64_t chunk = g * nc + c;
  const int32_t pos = offsets[chunk] + atomicAdd(&cursor[chunk], 1);
  bucket[pos] = static_cast<uint32_t>(((rest / K) << 6) | (rest % K));
}

// One block per item: chunk `c` of group `g` and up to pairs_per_item<G>() of its pairs. The
// chunk's K/V land in shared memory once; each warp runs 16-row slices (rows = pair x head):
// the next slice's q rows stream into the warp's other stage (cp.async) while the current one
// is computed (A fragments by ldmatrix), and results leave through the same stage as 16-byte
// rows.
// Accumulating variant (kAccumulate, atomic_v5): instead of the fp16 rows, each row's w_c / l_c
// times its P.V goes into o with fp32 reductions; w_c = exp(s_hat(c) - m) / l from `weights`.
struct Accumulate {
  const float* selected_score = nullptr;  // [Hq, T, K]
  const float2* weights = nullptr;        // [Hq, seg]: (m, 1 / l) of the row's fusion softmax
  float* o = nullptr;                     // [Hq, T, dv]
};

// o[0..1] += (a, b) in fp32 (one vector reduction on sm_90, two scalar ones before).
__device__ __forceinline__ void red_add2(float* o, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(o), "f"(a), "f"(b) : "memory");
#else
  atomicAdd(o, a);
  atomicAdd(o + 1, b);
#endif
}

template <int G, bool kAccumulate>
__global__ void __launch_bounds__(kPackedThreads)
    chunk_attention_kernel(LaunchParams p, int64_t t0, int64_t seg, int64_t nc,
                           const int32_t* offsets, const int32_t* items, const uint32_t* bucket,
                           __half* partial, Accumulate acc) {
  constexpr int kPairs = pairs_per_item<G>();
  __shared__ __align__(16) __nv_bfloat16 ks_tile[kTileDim][kTilePitch];
  __shared__ __align__(16) __nv_bfloat16 vs_tile[kTileDim][kTilePitch];
  __shared__ __align__(16) __nv_bfloat16 q_stage[kWarpsPerBlock][2][16][kTilePitch];
  __shared__ uint32_t entries[kPairs];
  const int64_t n_ch = p.Hkv * nc;
  const int32_t item = static_cast<int32_t>(blockIdx.x);
  if (item >= items[n_ch]) return;
  // Chunk of this item: the last i with items[i] <= item (items is non-decreasing).
  int64_t lo = 0, hi = n_ch - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (items[mid] <= item) lo = mid;
    else hi = mid - 1;
  }
  const int64_t chunk = lo, g = chunk / nc, c = chunk % nc;
  const int32_t first = offsets[chunk] + (item - items[chunk]) * kPairs;
  const int32_t end = offsets[chunk + 1];
  const int n_pairs = end - first < kPairs ? end - first : kPairs;
  const auto* k = static_cast<const __nv_bfloat16*>(p.k) + g * p.T * kTileDim;
  const auto* v = static_cast<const __nv_bfloat16*>(p.v) + g * p.T * kTileDim;
  load_tile_async(ks_tile, k, c * kTileDim, p.T);
  load_tile_async(vs_tile, v, c * kTileDim, p.T);
  cp_async_commit();
  for (int e = threadIdx.x; e < n_pairs; e += kPackedThreads) entries[e] = bucket[first + e];
  cp_async_wait_all();
  __syncthreads();

  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int K = static_cast<int>(p.K);
  const int n_slices = (n_pairs * G + 15) / 16;
  const auto* q = static_cast<const __nv_bfloat16*>(p.q);
  // Row r of slice s (r = 0..15): pair (16 s + r) / G, head (16 s + r) % G; -1 past the pairs.
  auto row_offset = [&](int s, int r) -> int64_t {
    const int rr = 16 * s + r;
    if (rr / G >= n_pairs) return -1;
    const int64_t t = t0 + (entries[rr / G] >> 6);
    return ((g * G + rr % G) * p.T + t) * kTileDim;
  };
  // The warp's 16 q rows of slice s -> q_stage[warp][buf] (cp.async, zeros past the pairs).
  auto issue_q = [&](int s, int buf) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int seg_i = lane + kWarp * j, r = seg_i / 8, col = (seg_i % 8) * 8;
      const int64_t off = row_offset(s, r);
      cp_async16(&q_stage[warp][buf][r][col], q + (off >= 0 ? off + col : 0), off >= 0);
    }
    cp_async_commit();
  };
  const bool mask_landmark = p.landmarks;
  if (warp < n_slices) issue_q(warp, 0);
  int it = 0;
  for (int s = warp; s < n_slices; s += kWarpsPerBlock, ++it) {
    const int buf = it & 1;
    if (s + kWarpsPerBlock < n_slices) {
      issue_q(s + kWarpsPerBlock, buf ^ 1);
      cp_async_wait_one();
    } else {
      cp_async_wait_all();
    }
    __syncwarp();
    __nv_bfloat16(*stage)[kTilePitch] = q_stage[warp][buf];
    // kAccumulate: the lane's two rows (lane / 4, + 8): their o row and fusion weight, loaded
    // before the matrix work so that the latency hides behind it.
    float* o_row[2] = {nullptr, nullptr};
    float weight[2] = {0.0f, 0.0f};
    if constexpr (kAccumulate) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int rr = 16 * s + lane / 4 + 8 * i;
        if (rr / G >= n_pairs) continue;
        const uint32_t entry = entries[rr / G];
        const int64_t tl = entry >> 6, t = t0 + tl, slot = entry & 63u;
        const int64_t h = g * G + rr % G;
        const float2 w = acc.weights[h * seg + tl];
        weight[i] = exp_diff(acc.selected_score[(h * p.T + t) * K + slot], w.x) * w.y;
        o_row[i] = acc.o + (h * p.T + t) * kTileDim;
      }
    }
    uint32_t qa[4][4];
#pragma unroll
    for (int ks = 0; ks < 4; ++ks)
      ldmatrix_x4(qa[ks], stage[lane % 8 + 8 * ((lane / 8) % 2)] + 16 * ks + 8 * (lane / 16));
    float sc[8][4], oc[8][4] = {};
    qk_tile(sc, qa, ks_tile);
    float row_max[2] = {kNegInf, kNegInf};
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = nt * 8 + (lane % 4) * 2 + (e % 2);
        sc[nt][e] = mask_landmark && col == kTileDim - 1 ? kNegInf : sc[nt][e] * p.scale;
        row_max[e / 2] = fmaxf(row_max[e / 2], sc[nt][e]);
      }
    float row_sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < 2; ++i) row_max[i] = quad_max(row_max[i]);
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        sc[nt][e] = __expf(sc[nt][e] - row_max[e / 2]);  // -inf -> 0; row_max is finite
        row_sum[e / 2] += sc[nt][e];
      }
#pragma unroll
    for (int i = 0; i < 2; ++i) row_sum[i] = quad_sum(row_sum[i]);
    pv_tile(oc, sc, vs_tile);
    if constexpr (kAccumulate) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        if (o_row[i] == nullptr) continue;
        const float f = weight[i] / row_sum[i];
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
          red_add2(o_row[i] + nt * 8 + (lane % 4) * 2, oc[nt][2 * i] * f, oc[nt][2 * i + 1] * f);
      }
      __syncwarp();  // every lane's ldmatrix of this stage is done before it is refilled
      continue;
    }
    // Stage the normalised rows as fp16 in the q buffer (its q is consumed), then store each
    // 128-byte row with 16-byte writes.
    __syncwarp();
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float inv = 1.0f / row_sum[i];
      __half* dst = reinterpret_cast<__half*>(stage[lane / 4 + 8 * i]);
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
        *reinterpret_cast<__half2*>(dst + nt * 8 + (lane % 4) * 2) =
            __floats2half2_rn(oc[nt][2 * i] * inv, oc[nt][2 * i + 1] * inv);
    }
    __syncwarp();
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int seg_i = lane + kWarp * j, r = seg_i / 8, col = (seg_i % 8) * 8;
      const int rr = 16 * s + r;
      if (rr / G >= n_pairs) continue;
      const uint32_t entry = entries[rr / G];
      const int64_t tl = entry >> 6, slot = entry & 63u;
      const int64_t h = g * G + rr % G;
      *reinterpret_cast<uint4*>(partial + ((h * seg + tl) * K + slot) * kTileDim + col) =
          *reinterpret_cast<const uint4*>(reinterpret_cast<const __half*>(stage[r]) + col);
    }
    __syncwarp();  // the buffer is refilled by the prefetch two slices on
  }
}

// Four 8x8 b16 matrices to shared memory (lanes 8i..8i+7 give the row addresses of matrix i;
// each lane's register i holds its fragment of matrix i, as ldmatrix returns it).
__device__ __forceinline__ void stmatrix_x4(void* row, uint32_t r0, uint32_t r1, uint32_t r2,
                                            uint32_t r3) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
               "r"(r0), "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}

__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

__device__ __forceinline__ float ex2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// s[i] = q[i] . K_tile^T for kSub 16-row slices (qk_tile of mma_common.cuh, each B fragment
// loaded once for all slices).
template <int kSub>
__device__ __forceinline__ void qk_tiles(float (&s)[kSub][8][4], const uint32_t (&qa)[kSub][4][4],
                                         const __nv_bfloat16 (*ks_tile)[kTilePitch]) {
  const int lane = threadIdx.x % kWarp;
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
    for (int i = 0; i < kSub; ++i) s[i][nt][0] = s[i][nt][1] = s[i][nt][2] = s[i][nt][3] = 0.0f;
    const __nv_bfloat16* key = ks_tile[nt * 8 + lane % 8] + 8 * (lane / 8);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      uint32_t b[4];
      ldmatrix_x4(b, key + 32 * half);
#pragma unroll
      for (int i = 0; i < kSub; ++i) {
        mma_16816(s[i][nt], qa[i][2 * half], b[0], b[1]);
        mma_16816(s[i][nt], qa[i][2 * half + 1], b[2], b[3]);
      }
    }
  }
}

// o[i] += P[i] . V_tile for kSub slices, P as bf16 A fragments (pv_tile of mma_common.cuh).
template <int kSub>
__device__ __forceinline__ void pv_tiles(float (&o)[kSub][8][4], const uint32_t (&pa)[kSub][4][4],
                                         const __nv_bfloat16 (*vs_tile)[kTilePitch]) {
  const int lane = threadIdx.x % kWarp;
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) {
    const __nv_bfloat16* row = vs_tile[16 * ks + lane % 8 + 8 * ((lane / 8) % 2)] + 8 * (lane / 16);
#pragma unroll
    for (int np = 0; np < 4; ++np) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, row + 16 * np);
#pragma unroll
      for (int i = 0; i < kSub; ++i) {
        mma_16816(o[i][2 * np], pa[i][ks], b[0], b[1]);
        mma_16816(o[i][2 * np + 1], pa[i][ks], b[2], b[3]);
      }
    }
  }
}

// chunked_v6 (kSub = 1) and chunked_v7 (kSub = 2): one block per item descriptor, the same
// work and output as chunk_attention_kernel<G, false>. The block first turns its rows (pair x
// head) into their q element offsets and scratch rows in shared memory, so that copies and
// stores cost one shared load per row. A warp step is kSub 16-row slices (v7: each K/V B
// fragment loaded by ldmatrix serves two slices, halving the shared-memory reads that bound
// v6); lane l copies and stores rows l / 8 + 4 j of a step, columns 8 (l % 8) .. + 7. Every row
// is computed alike whatever kSub, so v7's output is v6's bit for bit.
// A chunk kernel's row table: row rr is head g G + rr % G of the item's pair rr / G; row_q holds
// its q element offset (-1 past the item's pairs), row_out its scratch row (h seg + tl) K + slot.
// row_out: the row's scratch row (h seg + tl) K + slot, or with kQueryMajorOut its row tl Hq + h of
// the segment's query-major o16 (chunked_v18).
// kEntryWords: the bucket's words per entry (1; chunked_v30: the pair records', the entry first).
template <int G, bool kQueryMajorOut = false, int kEntryWords = 1>
__device__ __forceinline__ void fill_row_table(int64_t* row_q, uint32_t* row_out, int n_rows,
                                               const LaunchParams& p, int64_t t0, int64_t seg,
                                               const ItemDesc& desc, const uint32_t* bucket,
                                               int64_t g) {
  for (int rr = threadIdx.x; rr < n_rows; rr += kPackedThreads) {
    const int e = rr / G;
    const int64_t h = g * G + rr % G;
    if (e < desc.count) {
      const uint32_t entry = bucket[(static_cast<int64_t>(desc.first) + e) * kEntryWords];
      const int64_t tl = entry >> 6;
      row_q[rr] = (h * p.T + t0 + tl) * kTileDim;
      row_out[rr] = kQueryMajorOut ? static_cast<uint32_t>(tl * p.Hq + h)
                                   : static_cast<uint32_t>((h * seg + tl) * p.K + (entry & 63u));
    } else {
      row_q[rr] = -1;
    }
  }
}

// chunked_v32 (PairWeights::f16_packed): row rr's q element offset and weight from its pair's
// packed weights (bucket: G / 2 words per pair): the query t - s seg from the top two bits of
// the pair's first 8 halves, the weight from head rr % G's half without them.
template <int G>
__device__ __forceinline__ void fill_rows_from_packed_weights(int64_t* row_q, float* row_weight, int n_rows,
                                                              const LaunchParams& p, int64_t t0,
                                                              const ItemDesc& desc, const uint32_t* packed,
                                                              int64_t g) {
  static_assert(G % 8 == 0, "the query index takes the spare bits of 8 halves");
  for (int rr = threadIdx.x; rr < n_rows; rr += kPackedThreads) {
    const int e = rr / G;
    if (e >= desc.count) {
      row_q[rr] = -1;
      row_weight[rr] = 0.0f;
      continue;
    }
    const uint32_t* pair = packed + (static_cast<int64_t>(desc.first) + e) * (G / 2);
    const uint4 first8 = *reinterpret_cast<const uint4*>(pair);
    const uint32_t words[4] = {first8.x, first8.y, first8.z, first8.w};
    uint32_t tl = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) tl |= (words[k] >> 14 & 3u) << (4 * k) | (words[k] >> 30 & 3u) << (4 * k + 2);
    const int j = rr % G;
    const uint32_t word = j < 8 ? words[j / 2] : pair[j / 2];
    const auto bits = static_cast<unsigned short>((word >> (16 * (j % 2))) & 0x3fffu);
    row_q[rr] = ((g * G + j) * p.T + t0 + tl) * kTileDim;
    row_weight[rr] = __half2float(__ushort_as_half(bits));
  }
}

template <int G, int kSub>
__global__ void __launch_bounds__(kPackedThreads, kSub == 1 ? 5 : 3)
    chunk_attention_v6_kernel(LaunchParams p, int64_t t0, int64_t seg, int64_t nc,
                              const int32_t* items, const ItemDesc* item_desc,
                              const uint32_t* bucket, __half* partial) {
  constexpr int kRows = pairs_per_item<G>() * G;  // 512
  constexpr int kStep = 16 * kSub;                // rows per warp step
  constexpr int kCopies = kStep / 4;              // 16-byte pieces per lane and step
  __shared__ __align__(16) __nv_bfloat16 ks_tile[kTileDim][kTilePitch];
  __shared__ __align__(16) __nv_bfloat16 vs_tile[kTileDim][kTilePitch];
  // The warps' q stages (two per warp) in dynamic shared memory: v7's pass the 48 KB static limit.
  extern __shared__ __align__(16) unsigned char dynamic_smem[];
  auto* q_stage = reinterpret_cast<__nv_bfloat16(*)[2][kStep][kTilePitch]>(dynamic_smem);
  __shared__ int64_t row_q[kRows];     // q element offset of the row; -1 past the pairs
  __shared__ uint32_t row_out[kRows];  // its scratch row: (h seg + tl) K + slot
  const int32_t item = static_cast<int32_t>(blockIdx.x);
  const int32_t n_items = items[p.Hkv * nc];
  const ItemDesc desc = item_desc[item];  // past n_items: zeros or another segment's, unused
  if (item >= n_items) return;
  const int64_t g = desc.chunk / nc, c = desc.chunk % nc;
  const int n_steps = (desc.count * G + kStep - 1) / kStep;
  const auto* k = static_cast<const __nv_bfloat16*>(p.k) + g * p.T * kTileDim;
  const auto* v = static_cast<const __nv_bfloat16*>(p.v) + g * p.T * kTileDim;
  load_tile_async(ks_tile, k, c * kTileDim, p.T);
  load_tile_async(vs_tile, v, c * kTileDim, p.T);
  cp_async_commit();
  fill_row_table<G>(row_q, row_out, kStep * n_steps, p, t0, seg, desc, bucket, g);
  cp_async_wait_all();
  __syncthreads();

  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int col = (lane % 8) * 8;
  const auto* q = static_cast<const __nv_bfloat16*>(p.q) + col;
  __half* out = partial + col;
  // The warp's kStep q rows of step s -> q_stage[warp][buf] (cp.async, zeros past the pairs).
  auto issue_q = [&](int s, int buf) {
#pragma unroll
    for (int j = 0; j < kCopies; ++j) {
      const int64_t off = row_q[kStep * s + lane / 8 + 4 * j];
      cp_async16(&q_stage[warp][buf][lane / 8 + 4 * j][col], q + (off >= 0 ? off : 0), off >= 0);
    }
    cp_async_commit();
  };
  // Scores in base 2: p = 2^(s c - max(s) c) with c = scale log2 e > 0 (SEMANTICS §11.2: the
  // scale is positive), the landmark key (column 63: lane % 4 == 3, registers [7][1], [7][3])
  // masked.
  const float c2 = p.scale * 1.4426950408889634f;
  const bool mask_landmark = p.landmarks && lane % 4 == 3;
  if (warp < n_steps) issue_q(warp, 0);
  int it = 0;
  for (int s = warp; s < n_steps; s += kWarpsPerBlock, ++it) {
    const int buf = it & 1;
    if (s + kWarpsPerBlock < n_steps) {
      issue_q(s + kWarpsPerBlock, buf ^ 1);
      cp_async_wait_one();
    } else {
      cp_async_wait_all();
    }
    __syncwarp();
    __nv_bfloat16(*stage)[kTilePitch] = q_stage[warp][buf];
    __nv_bfloat16* frag_row[kSub];
    uint32_t qa[kSub][4][4];
#pragma unroll
    for (int i = 0; i < kSub; ++i) {
      frag_row[i] = stage[16 * i + lane % 8 + 8 * ((lane / 8) % 2)] + 8 * (lane / 16);
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) ldmatrix_x4(qa[i][ks], frag_row[i] + 16 * ks);
    }
    float sc[kSub][8][4];
    qk_tiles<kSub>(sc, qa, ks_tile);
    uint32_t pa[kSub][4][4];
    float inv[kSub][2];
#pragma unroll
    for (int i = 0; i < kSub; ++i) {
      if (mask_landmark) sc[i][7][1] = sc[i][7][3] = kNegInf;
      float row_max[2] = {kNegInf, kNegInf};
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) row_max[e / 2] = fmaxf(row_max[e / 2], sc[i][nt][e]);
      float neg_max[2], row_sum[2] = {0.0f, 0.0f};
#pragma unroll
      for (int r = 0; r < 2; ++r) neg_max[r] = -quad_max(row_max[r]) * c2;  // finite: 63 keys
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          sc[i][nt][e] = ex2_approx(fmaf(sc[i][nt][e], c2, neg_max[e / 2]));  // -inf -> 0
          row_sum[e / 2] += sc[i][nt][e];
        }
#pragma unroll
      for (int r = 0; r < 2; ++r) inv[i][r] = 1.0f / quad_sum(row_sum[r]);
      // A fragments of P (pv_tile's packing): keys 16 ks .. 16 ks + 15.
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        pa[i][ks][0] = pack_bf16(sc[i][2 * ks][0], sc[i][2 * ks][1]);
        pa[i][ks][1] = pack_bf16(sc[i][2 * ks][2], sc[i][2 * ks][3]);
        pa[i][ks][2] = pack_bf16(sc[i][2 * ks + 1][0], sc[i][2 * ks + 1][1]);
        pa[i][ks][3] = pack_bf16(sc[i][2 * ks + 1][2], sc[i][2 * ks + 1][3]);
      }
    }
    float oc[kSub][8][4] = {};
    pv_tiles<kSub>(oc, pa, vs_tile);
    // The normalised rows as fp16 into the stage (its q is in registers), then 16-byte stores.
    __syncwarp();
#pragma unroll
    for (int i = 0; i < kSub; ++i)
#pragma unroll
      for (int nt = 0; nt < 8; nt += 2)
        stmatrix_x4(frag_row[i] + 8 * nt,
                    pack_half2(oc[i][nt][0] * inv[i][0], oc[i][nt][1] * inv[i][0]),
                    pack_half2(oc[i][nt][2] * inv[i][1], oc[i][nt][3] * inv[i][1]),
                    pack_half2(oc[i][nt + 1][0] * inv[i][0], oc[i][nt + 1][1] * inv[i][0]),
                    pack_half2(oc[i][nt + 1][2] * inv[i][1], oc[i][nt + 1][3] * inv[i][1]));
    __syncwarp();
#pragma unroll
    for (int j = 0; j < kCopies; ++j) {
      const int rr = kStep * s + lane / 8 + 4 * j;
      if (row_q[rr] >= 0)
        *reinterpret_cast<uint4*>(out + static_cast<uint64_t>(row_out[rr]) * kTileDim) =
            *reinterpret_cast<const uint4*>(&stage[lane / 8 + 4 * j][col]);
    }
    __syncwarp();  // the buffer is refilled by the prefetch two steps on
  }
}

// chunked_v9: chunked_v8's work with Hopper's warpgroup MMA (wgmma). The block (one warpgroup)
// runs 64-row steps: S = Q K^T with Q (the step's 64 q rows) and K from 128-byte-swizzled
// shared-memory panels, P = softmax in registers (each warp's 16 rows, v6's code: the
// accumulator of warp w is the mma.sync C fragment of rows 16 w ..), O = P V with P from
// registers and V as the N-major B panel. No ldmatrix: the tensor cores read q, K and V from
// shared memory themselves (v6: K and V through ldmatrix for every 16-row slice, the L1 limit).
// The step's q rows come by cp.async into one of two swizzled stages (the next step's while this
// one computes); the fp16 results leave through the same stage (stmatrix, 16-byte stores).
constexpr int kV9Panel = 64 * wg::kPanelRowBytes;  // bytes of a 64-row panel
constexpr int kV9SmemBytes = wg::kAtomBytes + 4 * kV9Panel;  // K, V, 2 q stages, alignment slack
// chunked_v14's output stage: 64 fp16 rows of 128 bytes, 144 bytes apart (linear rows for the
// bulk reductions; the 16-byte pad spreads stmatrix's 8 rows over all 32 banks).
constexpr int kBulkRowBytes = 144;
constexpr int kBulkStageBytes = 64 * kBulkRowBytes;

// Where chunk_attention_v9_kernel's rows go: fp16 partials (chunked_v9), 16-byte f16x2
// reductions into o16 (chunked_v12), or one 128-byte bulk reduction per row into o16 by the
// tensor memory accelerator (chunked_v14).
// red_f16x2_query_major (chunked_v18): as red_f16x2 into the segment's o16 laid out [seg, Hq, 64]
// (a pair's G heads are G adjacent rows) instead of o's [Hq, T, 64].
enum class V9Out { partials, red_f16x2, bulk_red, red_f16x2_query_major };

// Rows [row0, row0 + 64) of a [rows, 64] bf16 matrix into a swizzled panel (cp.async, 128
// threads).
__device__ __forceinline__ void load_panel_async(unsigned char* panel, const __nv_bfloat16* src,
                                                 int64_t row0) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int piece = threadIdx.x + kPackedThreads * j, row = piece / 8, col = (piece % 8) * 8;
    cp_async16(panel + wg::sw128_offset(row, col), src + (row0 + row) * kTileDim + col, true);
  }
}

// Eight halves at o (16-byte aligned) += v (chunked_v10-v12): one 16-byte reduction on sm_90
// (ptxas refuses .v8), four half2 atomics below.
__device__ __forceinline__ void red_add_f16x8(__half* o, uint4 v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.noftz.v4.f16x2 [%0], {%1, %2, %3, %4};\n" ::"l"(o), "r"(v.x),
               "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
#else
  const uint32_t parts[4] = {v.x, v.y, v.z, v.w};
  for (int i = 0; i < 4; ++i)
    atomicAdd(reinterpret_cast<__half2*>(o) + i, *reinterpret_cast<const __half2*>(&parts[i]));
#endif
}

// Bulk reduction (sm_90): o16[0 .. 64) += the 128-byte fp16 row at shared address `row`
// (async proxy; the row's writers ran fence.proxy.async first), in this thread's bulk group.
__device__ __forceinline__ void bulk_red_add_f16_row(__half* o, uint32_t row) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.noftz.f16 [%0], [%1], 128;\n"
      "cp.async.bulk.commit_group;\n" ::"l"(o), "r"(row)
      : "memory");
#else
  (void)o, (void)row;
  __trap();
#endif
}
// Waits until this thread's bulk operations have read their shared memory (kReadOnly) or are
// complete.
template <bool kReadOnly>
__device__ __forceinline__ void bulk_wait_all() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if constexpr (kReadOnly)
    asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
  else
    asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
#endif
}

// kOut != partials (chunked_v12-v14): v11's output instead of the partials: each row scaled by
// its weight from pair_weight (bucket order, fusion_pair_weights_kernel) over its softmax sum,
// then added into o16 (the partial argument) at the row's q offset: red_f16x2 (v12) by 8
// f16x2 reductions of 16 bytes per row from the consumed q stage, bulk_red (v14) by one
// 128-byte bulk reduction per row from an output stage of linear rows (kBulkStageBytes more
// shared memory), issued by lane r of warp w for row 16 w + r and awaited (read) one step later.
// kAllowNext (chunked_v20): the next kernel (the next segment's weights) may start in this one's
// last wave.
// One item of chunk_attention_v9_kernel (its block's whole work) or of
// chunk_attention_persistent_kernel (one of its items): chunk c of group g and its pairs desc,
// with the dynamic shared memory `smem` (1024-byte aligned). kQStages q stages (2: the next
// step's rows stream in while this one computes; 3, chunked_v27: the rows two steps ahead).
// kPairWeights (PairWeights): f16 (chunked_v31): the weights in fp16; f16_records (chunked_v30):
// bucket holds the segment's pair records (the entry, then the G weights in fp16), pair_weight
// is not read.
template <int G, V9Out kOut, int kQStages = 2, PairWeights kPairWeights = PairWeights::f32>
__device__ __forceinline__ void chunk_item_v9(const LaunchParams& p, int64_t t0, int64_t seg, int64_t nc,
                                              const ItemDesc& desc, const uint32_t* bucket,
                                              __half* partial, const float* pair_weight,
                                              unsigned char* smem) {
  static_assert(kQStages == 2 || (kQStages == 3 && kOut == V9Out::red_f16x2), "2 q stages, or 3 for red_f16x2");
  constexpr bool kRecords = kPairWeights == PairWeights::f16_records;
  constexpr bool kPacked = kPairWeights == PairWeights::f16_packed;
  static_assert(kPairWeights == PairWeights::f32 || kOut == V9Out::red_f16x2,
                "fp16 pair weights: chunked_v30's to v32's red_f16x2");
  constexpr bool kReduce = kOut != V9Out::partials;
  constexpr int kRows = pairs_per_item<G>() * G;  // 512
  unsigned char* k_panel = smem;
  unsigned char* v_panel = smem + kV9Panel;
  unsigned char* q_stages = smem + 2 * kV9Panel;  // kQStages stages, kV9Panel bytes apart
  unsigned char* out_stage = smem + 4 * kV9Panel;  // bulk_red only
  __shared__ int64_t row_q[kRows];     // q element offset of the row; -1 past the pairs
  __shared__ uint32_t row_out[kRows];  // its scratch row: (h seg + tl) K + slot
  const int64_t g = desc.chunk / nc, c = desc.chunk % nc;
  const int n_steps = (desc.count * G + 63) / 64;
  load_panel_async(k_panel, static_cast<const __nv_bfloat16*>(p.k) + g * p.T * kTileDim, c * kTileDim);
  load_panel_async(v_panel, static_cast<const __nv_bfloat16*>(p.v) + g * p.T * kTileDim, c * kTileDim);
  cp_async_commit();
  constexpr int kEntryWords = kRecords ? pair_record_words<G>() : 1;
  __shared__ float row_weight[kReduce ? kRows : 1];  // kReduce: w_c / l of the row
  if constexpr (kPacked)
    fill_rows_from_packed_weights<G>(row_q, row_weight, 64 * n_steps, p, t0, desc, bucket, g);
  else
    fill_row_table<G, kOut == V9Out::red_f16x2_query_major, kEntryWords>(row_q, row_out, 64 * n_steps, p, t0,
                                                                         seg, desc, bucket, g);
  if constexpr (kRecords)
    for (int rr = threadIdx.x; rr < 64 * n_steps; rr += kPackedThreads) {
      const auto* weights = reinterpret_cast<const __half*>(bucket + (static_cast<int64_t>(desc.first) + rr / G) *
                                                                         kEntryWords + 1);
      row_weight[rr] = rr < desc.count * G ? __half2float(weights[rr % G]) : 0.0f;
    }
  else if constexpr (kPairWeights == PairWeights::f16)
    for (int rr = threadIdx.x; rr < 64 * n_steps; rr += kPackedThreads) {
      const auto* weights = reinterpret_cast<const __half*>(pair_weight);
      row_weight[rr] = rr < desc.count * G ? __half2float(weights[static_cast<int64_t>(desc.first) * G + rr]) : 0.0f;
    }
  else if constexpr (kReduce && !kPacked)  // (kPacked: filled with the row table)
    for (int rr = threadIdx.x; rr < 64 * n_steps; rr += kPackedThreads)
      row_weight[rr] = rr < desc.count * G ? pair_weight[static_cast<int64_t>(desc.first) * G + rr] : 0.0f;
  __syncthreads();  // the row table

  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const auto* q = static_cast<const __nv_bfloat16*>(p.q);
  // The step's 64 q rows -> a stage (zeros past the pairs); thread t copies pieces t + 128 j.
  auto issue_q = [&](int s, unsigned char* stage) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int piece = threadIdx.x + kPackedThreads * j, row = piece / 8, col = (piece % 8) * 8;
      const int64_t off = row_q[64 * s + row];
      cp_async16(stage + wg::sw128_offset(row, col), q + (off >= 0 ? off + col : 0), off >= 0);
    }
    cp_async_commit();
  };
  const uint64_t k_desc = wg::desc_k_major(k_panel);
  const uint64_t v_desc = wg::desc_n_major(v_panel, kV9Panel);
  // Base-2 softmax as v6 (c = scale log2 e > 0), the landmark key (column 63) masked.
  const float c2 = p.scale * 1.4426950408889634f;
  const bool mask_landmark = p.landmarks && lane % 4 == 3;
  const int row_in_step = 16 * warp + lane % 8 + 8 * ((lane / 8) % 2);  // stmatrix row address
  issue_q(0, q_stages);
  if constexpr (kQStages == 3)
    if (n_steps > 1) issue_q(1, q_stages + kV9Panel);
  for (int s = 0; s < n_steps; ++s) {
    unsigned char* stage = q_stages + (kQStages == 2 ? s & 1 : s % kQStages) * kV9Panel;
    if (kQStages == 3 && s + 1 < n_steps)
      cp_async_wait_one();  // this step's q (and, at s = 0, K and V); the next step's may still fly
    else
      cp_async_wait_all();  // this step's q (and, at s = 0, K and V)
    wg::fence_proxy_async();
    __syncthreads();  // q visible to the tensor cores; every warp is done with the stage refilled now
    if (s + kQStages - 1 < n_steps)
      issue_q(s + kQStages - 1,
              q_stages + (kQStages == 2 ? (s + 1) & 1 : (s + kQStages - 1) % kQStages) * kV9Panel);
    float sc[8][4];
    const uint64_t q_desc = wg::desc_k_major(stage);
    wg::fence();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks)
      wg::mma_ss<false>(sc, wg::desc_advance(q_desc, 32 * ks), wg::desc_advance(k_desc, 32 * ks),
                        ks > 0);
    wg::commit();
    wg::wait<0>();
    wg::fence_operands(sc);
    if (mask_landmark) sc[7][1] = sc[7][3] = kNegInf;
    float row_max[2] = {kNegInf, kNegInf};
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) row_max[e / 2] = fmaxf(row_max[e / 2], sc[nt][e]);
    float neg_max[2], row_sum[2] = {0.0f, 0.0f}, inv[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) neg_max[r] = -quad_max(row_max[r]) * c2;  // finite: 63 keys
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        sc[nt][e] = ex2_approx(fmaf(sc[nt][e], c2, neg_max[e / 2]));  // -inf -> 0
        row_sum[e / 2] += sc[nt][e];
      }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      if constexpr (kReduce)  // the row's fusion weight over its sum (v10's scale)
        inv[r] = row_weight[64 * s + 16 * warp + lane / 4 + 8 * r] / quad_sum(row_sum[r]);
      else
        inv[r] = 1.0f / quad_sum(row_sum[r]);
    }
    uint32_t pa[4][4];
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      pa[ks][0] = pack_bf16(sc[2 * ks][0], sc[2 * ks][1]);
      pa[ks][1] = pack_bf16(sc[2 * ks][2], sc[2 * ks][3]);
      pa[ks][2] = pack_bf16(sc[2 * ks + 1][0], sc[2 * ks + 1][1]);
      pa[ks][3] = pack_bf16(sc[2 * ks + 1][2], sc[2 * ks + 1][3]);
    }
    float oc[8][4];
    wg::fence();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks)
      wg::mma_rs<true>(oc, pa[ks], wg::desc_advance(v_desc, 16 * wg::kPanelRowBytes * ks), ks > 0);
    wg::commit();
    wg::wait<0>();
    wg::fence_operands(oc);
    if constexpr (kOut == V9Out::bulk_red) {
      // The warp's 16 rows into the output stage once the previous step's bulk reductions have
      // read it, then one bulk reduction per row (lane r: row 16 w + r).
      bulk_wait_all<true>();
      __syncwarp();
      const int row = 16 * warp + lane % 16;
#pragma unroll
      for (int nt = 0; nt < 8; nt += 2)
        stmatrix_x4(out_stage + row_in_step * kBulkRowBytes + 2 * (8 * nt + 8 * (lane / 16)),
                    pack_half2(oc[nt][0] * inv[0], oc[nt][1] * inv[0]),
                    pack_half2(oc[nt][2] * inv[1], oc[nt][3] * inv[1]),
                    pack_half2(oc[nt + 1][0] * inv[0], oc[nt + 1][1] * inv[0]),
                    pack_half2(oc[nt + 1][2] * inv[1], oc[nt + 1][3] * inv[1]));
      wg::fence_proxy_async();
      __syncwarp();
      if (lane < 16 && row_q[64 * s + row] >= 0)
        bulk_red_add_f16_row(partial + row_q[64 * s + row],
                             static_cast<uint32_t>(__cvta_generic_to_shared(
                                 out_stage + row * kBulkRowBytes)));
    } else {
      // The normalised rows as fp16 into the stage (the tensor cores are done with its q), the
      // warp's own 16 rows, then 16-byte stores of those rows.
#pragma unroll
      for (int nt = 0; nt < 8; nt += 2)
        stmatrix_x4(stage + wg::sw128_offset(row_in_step, 8 * nt + 8 * (lane / 16)),
                    pack_half2(oc[nt][0] * inv[0], oc[nt][1] * inv[0]),
                    pack_half2(oc[nt][2] * inv[1], oc[nt][3] * inv[1]),
                    pack_half2(oc[nt + 1][0] * inv[0], oc[nt + 1][1] * inv[0]),
                    pack_half2(oc[nt + 1][2] * inv[1], oc[nt + 1][3] * inv[1]));
      __syncwarp();
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int row = 16 * warp + lane / 8 + 4 * j, col = (lane % 8) * 8, rr = 64 * s + row;
        if (row_q[rr] < 0) continue;
        const uint4 x = *reinterpret_cast<const uint4*>(stage + wg::sw128_offset(row, col));
        if constexpr (kOut == V9Out::red_f16x2_query_major)
          red_add_f16x8(partial + static_cast<int64_t>(row_out[rr]) * kTileDim + col, x);
        else if constexpr (kReduce)
          red_add_f16x8(partial + row_q[rr] + col, x);
        else
          *reinterpret_cast<uint4*>(partial + static_cast<uint64_t>(row_out[rr]) * kTileDim + col) = x;
      }
    }
  }
  if constexpr (kOut == V9Out::bulk_red) bulk_wait_all<false>();  // the stage outlives its reads
}

// The dynamic shared memory of the v9 chunk kernels, on 1024-byte boundaries (the swizzle's atom).
__device__ __forceinline__ unsigned char* v9_smem() {
  extern __shared__ __align__(16) unsigned char dynamic_smem[];
  return reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(dynamic_smem) + wg::kAtomBytes - 1) &
                                          ~static_cast<uintptr_t>(wg::kAtomBytes - 1));
}

template <int G, V9Out kOut, bool kAllowNext = false>
__global__ void __launch_bounds__(kPackedThreads, 4)
    chunk_attention_v9_kernel(LaunchParams p, int64_t t0, int64_t seg, int64_t nc,
                              const int32_t* items, const ItemDesc* item_desc,
                              const uint32_t* bucket, __half* partial, const float* pair_weight) {
  if constexpr (kAllowNext) allow_next_grid();
  const int32_t item = static_cast<int32_t>(blockIdx.x);
  const int32_t n_items = items[p.Hkv * nc];
  const ItemDesc desc = item_desc[item];  // past n_items: zeros or another segment's, unused
  if (item >= n_items) return;
  chunk_item_v9<G, kOut>(p, t0, seg, nc, desc, bucket, partial, pair_weight, v9_smem());
}

// chunked_v26, v27: chunk_attention_v9_kernel<G, red_f16x2>'s items taken by a grid of as many
// blocks as fit on the device at once, each taking its next item from the segment's cursor
// (an atomicAdd, issued at the start of the current item and read after it), until the
// segment's n_items are taken. No block for an item that does not exist (chunk_attention_v9's
// grid is the bound Hkv seg K / pairs + Hkv nc, ~40% above the items at 512K) and no block
// launch per item. kQStages, kPairWeights (chunked_v30, v31): chunk_item_v9's.
// kChained: chunked_v35 (wait_previous_then_allow_next).
template <int G, int kQStages, PairWeights kPairWeights = PairWeights::f32, bool kChained = false>
__global__ void __launch_bounds__(kPackedThreads, 4)
    chunk_attention_persistent_kernel(LaunchParams p, int64_t t0, int64_t seg, int64_t nc,
                                      const int32_t* items, const ItemDesc* item_desc,
                                      const uint32_t* bucket, __half* partial,
                                      const float* pair_weight, int32_t* item_cursor) {
  wait_previous_then_allow_next<kChained>();
  __shared__ int32_t next_item;
  const int32_t n_items = items[p.Hkv * nc];
  if (threadIdx.x == 0) next_item = atomicAdd(item_cursor, 1);
  __syncthreads();
  unsigned char* smem = v9_smem();
  for (;;) {
    const int32_t item = next_item;  // every thread reads it before the item's first barrier
    if (item >= n_items) return;
    const ItemDesc desc = item_desc[item];
    int32_t next = 0;
    if (threadIdx.x == 0) next = atomicAdd(item_cursor, 1);  // awaited only after this item
    chunk_item_v9<G, V9Out::red_f16x2, kQStages, kPairWeights>(p, t0, seg, nc, desc, bucket, partial,
                                                               pair_weight, smem);
    if (threadIdx.x == 0) next_item = next;
    __syncthreads();  // next_item visible; every warp done with the panels, stages and row tables
  }
}

// kernel<<<grid, block, smem, stream>>>(args...), with programmatic stream serialization when
// after_previous (chunked_v20: the kernel may start in the previous kernel's last wave).
template <class... Params, class... Args>
void launch_after_previous(bool after_previous, void (*kernel)(Params...), unsigned grid,
                           unsigned block, size_t smem, cudaStream_t stream, Args... args) {
  // Errors are left for the fuse's check.
  launch_programmatic(after_previous, kernel, dim3(grid), block, smem, stream, args...);
}

// kAllowNext, after_previous: chunked_v20 (above).
template <int G, V9Out kOut, bool kAllowNext = false>
void launch_chunk_v9(unsigned grid, cudaStream_t stream, const LaunchParams& p, int64_t t0,
                     int64_t seg, int64_t nc, const int32_t* items, const ItemDesc* item_desc,
                     const uint32_t* bucket, __half* partial, const float* pair_weight,
                     bool after_previous = false) {
  constexpr int kBytes = kV9SmemBytes + (kOut == V9Out::bulk_red ? kBulkStageBytes : 0);
  static const bool raised = cudaFuncSetAttribute(chunk_attention_v9_kernel<G, kOut, kAllowNext>,
                                                  cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                  kBytes) == cudaSuccess;
  (void)raised;  // a failure surfaces as the launch's error
  launch_after_previous(after_previous, chunk_attention_v9_kernel<G, kOut, kAllowNext>, grid,
                        kPackedThreads, kBytes, stream, p, t0, seg, nc, items, item_desc, bucket,
                        partial, pair_weight);
}

// chunked_v26 (kQStages 2), v27 (3): chunk_attention_persistent_kernel with as many blocks as are
// resident on the device at once (at most `bound`, the items' upper bound); chunked_v30, v31:
// kPairWeights; chunked_v35: kChained (launched in the chain of programmatic launches).
template <int G, int kQStages, PairWeights kPairWeights = PairWeights::f32, bool kChained = false>
void launch_chunk_persistent(unsigned bound, cudaStream_t stream, const LaunchParams& p, int64_t t0,
                             int64_t seg, int64_t nc, const int32_t* items, const ItemDesc* item_desc,
                             const uint32_t* bucket, __half* o16, const float* pair_weight,
                             int32_t* item_cursor) {
  constexpr int kBytes = kV9SmemBytes + (kQStages - 2) * kV9Panel;
  static constexpr auto kernel = chunk_attention_persistent_kernel<G, kQStages, kPairWeights, kChained>;
  static const unsigned resident = [] {
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes);
    const Residency r = kernel_residency(kernel, kPackedThreads, kBytes, "sparse stage (persistent chunk kernel)");
    if (r.blocks_per_sm <= 0)
      throw std::runtime_error("sparse stage: the persistent chunk kernel fits no SM with " +
                               std::to_string(kBytes) + " bytes of shared memory");
    return static_cast<unsigned>(r.blocks());
  }();
  const unsigned grid = bound < resident ? bound : resident;
  if constexpr (kChained)
    launch_programmatic(true, kernel, dim3(grid), kPackedThreads, kBytes, stream, p, t0, seg, nc, items, item_desc,
                        bucket, o16, pair_weight, item_cursor);
  else
    chunk_attention_persistent_kernel<G, kQStages, kPairWeights><<<grid, kPackedThreads, kBytes, stream>>>(
        p, t0, seg, nc, items, item_desc, bucket, o16, pair_weight, item_cursor);
}

// chunked_v10: v6's chunk kernel whose rows go into an fp16 copy of o (o16) with f16x2 vector
// reductions instead of the fp16 partial scratch (no reduce). Each row is scaled by its fusion
// weight w_c / l = exp(s_hat(c) - m) / l (weights: (m, 1 / l) per row of the segment, from
// fusion_weights_kernel) before its fp16 rounding.
// kPairWeights (chunked_v11): the rows' weights come in bucket order from pair_weight (written
// by fusion_pair_weights_kernel) instead of from the row's selected score and (m, 1 / l).
template <int G, bool kPairWeights>
__global__ void __launch_bounds__(kPackedThreads, 5)
    chunk_attention_f16_kernel(LaunchParams p, int64_t t0, int64_t seg, int64_t nc,
                               const int32_t* items, const ItemDesc* item_desc,
                               const uint32_t* bucket, const float* selected_score,
                               const float2* weights, const float* pair_weight, __half* o16) {
  constexpr int kRows = pairs_per_item<G>() * G;  // 512
  extern __shared__ __align__(16) unsigned char dynamic_smem[];
  auto* q_stage = reinterpret_cast<__nv_bfloat16(*)[2][16][kTilePitch]>(dynamic_smem);
  __shared__ __align__(16) __nv_bfloat16 ks_tile[kTileDim][kTilePitch];
  __shared__ __align__(16) __nv_bfloat16 vs_tile[kTileDim][kTilePitch];
  __shared__ int64_t row_q[kRows];   // q element offset of the row (= its o16 offset); -1 past
  __shared__ float row_weight[kRows];  // w_c / l of the row
  const int32_t item = static_cast<int32_t>(blockIdx.x);
  const int32_t n_items = items[p.Hkv * nc];
  const ItemDesc desc = item_desc[item];
  if (item >= n_items) return;
  const int64_t g = desc.chunk / nc, c = desc.chunk % nc;
  const int n_pairs = desc.count, n_steps = (n_pairs * G + 15) / 16;
  const int K = static_cast<int>(p.K);
  load_tile_async(ks_tile, static_cast<const __nv_bfloat16*>(p.k) + g * p.T * kTileDim, c * kTileDim, p.T);
  load_tile_async(vs_tile, static_cast<const __nv_bfloat16*>(p.v) + g * p.T * kTileDim, c * kTileDim, p.T);
  cp_async_commit();
  for (int rr = threadIdx.x; rr < 16 * n_steps; rr += kPackedThreads) {
    const int e = rr / G;
    const int64_t h = g * G + rr % G;
    if (e < n_pairs) {
      const uint32_t entry = bucket[desc.first + e];
      const int64_t tl = entry >> 6, t = t0 + tl;
      row_q[rr] = (h * p.T + t) * kTileDim;
      if constexpr (kPairWeights) {
        row_weight[rr] = pair_weight[static_cast<int64_t>(desc.first) * G + rr];
      } else {
        const float2 w = weights[h * seg + tl];
        row_weight[rr] = exp_diff(selected_score[(h * p.T + t) * K + (entry & 63u)], w.x) * w.y;
      }
    } else {
      row_q[rr] = -1;
      row_weight[rr] = 0.0f;
    }
  }
  cp_async_wait_all();
  __syncthreads();

  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int col = (lane % 8) * 8;
  const auto* q = static_cast<const __nv_bfloat16*>(p.q) + col;
  auto issue_q = [&](int s, int buf) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t off = row_q[16 * s + lane / 8 + 4 * j];
      cp_async16(&q_stage[warp][buf][lane / 8 + 4 * j][col], q + (off >= 0 ? off : 0), off >= 0);
    }
    cp_async_commit();
  };
  const float c2 = p.scale * 1.4426950408889634f;
  const bool mask_landmark = p.landmarks && lane % 4 == 3;
  if (warp < n_steps) issue_q(warp, 0);
  int it = 0;
  for (int s = warp; s < n_steps; s += kWarpsPerBlock, ++it) {
    const int buf = it & 1;
    if (s + kWarpsPerBlock < n_steps) {
      issue_q(s + kWarpsPerBlock, buf ^ 1);
      cp_async_wait_one();
    } else {
      cp_async_wait_all();
    }
    __syncwarp();
    __nv_bfloat16(*stage)[kTilePitch] = q_stage[warp][buf];
    __nv_bfloat16* frag_row = stage[lane % 8 + 8 * ((lane / 8) % 2)] + 8 * (lane / 16);
    uint32_t qa[1][4][4];
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) ldmatrix_x4(qa[0][ks], frag_row + 16 * ks);
    float sc[1][8][4];
    qk_tiles<1>(sc, qa, ks_tile);
    if (mask_landmark) sc[0][7][1] = sc[0][7][3] = kNegInf;
    float row_max[2] = {kNegInf, kNegInf};
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) row_max[e / 2] = fmaxf(row_max[e / 2], sc[0][nt][e]);
    float neg_max[2], row_sum[2] = {0.0f, 0.0f}, scale[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) neg_max[r] = -quad_max(row_max[r]) * c2;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        sc[0][nt][e] = ex2_approx(fmaf(sc[0][nt][e], c2, neg_max[e / 2]));
        row_sum[e / 2] += sc[0][nt][e];
      }
#pragma unroll
    for (int r = 0; r < 2; ++r)
      scale[r] = row_weight[16 * s + lane / 4 + 8 * r] / quad_sum(row_sum[r]);
    uint32_t pa[1][4][4];
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      pa[0][ks][0] = pack_bf16(sc[0][2 * ks][0], sc[0][2 * ks][1]);
      pa[0][ks][1] = pack_bf16(sc[0][2 * ks][2], sc[0][2 * ks][3]);
      pa[0][ks][2] = pack_bf16(sc[0][2 * ks + 1][0], sc[0][2 * ks + 1][1]);
      pa[0][ks][3] = pack_bf16(sc[0][2 * ks + 1][2], sc[0][2 * ks + 1][3]);
    }
    float oc[1][8][4] = {};
    pv_tiles<1>(oc, pa, vs_tile);
    __syncwarp();
#pragma unroll
    for (int nt = 0; nt < 8; nt += 2)
      stmatrix_x4(frag_row + 8 * nt,
                  pack_half2(oc[0][nt][0] * scale[0], oc[0][nt][1] * scale[0]),
                  pack_half2(oc[0][nt][2] * scale[1], oc[0][nt][3] * scale[1]),
                  pack_half2(oc[0][nt + 1][0] * scale[0], oc[0][nt + 1][1] * scale[0]),
                  pack_half2(oc[0][nt + 1][2] * scale[1], oc[0][nt + 1][3] * scale[1]));
    __syncwarp();
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int rr = 16 * s + lane / 8 + 4 * j;
      if (row_q[rr] >= 0)
        red_add_f16x8(o16 + row_q[rr] + col,
                      *reinterpret_cast<const uint4*>(&stage[lane / 8 + 4 * j][col]));
    }
    __syncwarp();
  }
}

// chunked_v10, after the segment's chunk kernel: o = o16 in fp32 (one thread per half2).
// kAllowNext (chunked_v20): the next kernel (the next segment's chunk kernel) may start in this
// one's last wave.
// Block `block` of convert_o16_kernel (256 threads).
__device__ __forceinline__ void convert_o16_block(unsigned block, const LaunchParams& p, int64_t t0,
                                                  int64_t tn, const __half* o16, float* o) {
  const int64_t i = static_cast<int64_t>(block) * 256 + threadIdx.x;  // half2 index
  const int64_t per_head = tn * kTileDim / 2;
  if (i >= p.Hq * per_head) return;
  const int64_t h = i / per_head, at = (h * p.T + t0) * kTileDim / 2 + i % per_head;
  const float2 v = __half22float2(reinterpret_cast<const __half2*>(o16)[at]);
  reinterpret_cast<float2*>(o)[at] = v;
}
template <bool kAllowNext = false>
__global__ void __launch_bounds__(256) convert_o16_kernel(LaunchParams p, int64_t t0, int64_t tn,
                                                          const __half* o16, float* o) {
  if constexpr (kAllowNext) allow_next_grid();
  convert_o16_block(blockIdx.x, p, t0, tn, o16, o);
}

// chunked_v24, after the segment's chunk kernel: o = o16 with 16 bytes of o16 per thread (8
// lanes per 128-byte row), Out = float (the API's o) or __nv_bfloat16 (RowType::bf16); each o16
// row read is then discarded from the L2 (discard.global.L2: the line is dropped without its
// write-back to DRAM; o16 is dead until the next call's weights kernel writes every row again).
// kChained: chunked_v35 (wait_previous_then_allow_next).
template <typename Out, bool kChained = false>
__global__ void __launch_bounds__(256) convert_discard_o16_kernel(LaunchParams p, int64_t t0, int64_t tn,
                                                                  __half* o16, Out* o) {
  wait_previous_then_allow_next<kChained>();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * 256 + threadIdx.x;  // 8-half index
  const int64_t per_head = tn * kTileDim / 8;
  const bool active = i < p.Hq * per_head;  // a 128-byte row's 8 lanes are all active or none
  const int64_t h = active ? i / per_head : 0, at = (h * p.T + t0) * kTileDim / 8 + i % per_head;
  if (active) {
    const uint4 in = reinterpret_cast<const uint4*>(o16)[at];
    const __half2* from = reinterpret_cast<const __half2*>(&in);
    if constexpr (std::is_same_v<Out, float>) {
      const float2 a = __half22float2(from[0]), b = __half22float2(from[1]);
      const float2 c = __half22float2(from[2]), d = __half22float2(from[3]);
      reinterpret_cast<float4*>(o)[2 * at] = make_float4(a.x, a.y, b.x, b.y);
      reinterpret_cast<float4*>(o)[2 * at + 1] = make_float4(c.x, c.y, d.x, d.y);
    } else {
      uint4 out;
      __nv_bfloat162* to = reinterpret_cast<__nv_bfloat162*>(&out);
#pragma unroll
      for (int e = 0; e < 4; ++e) to[e] = __float22bfloat162_rn(__half22float2(from[e]));
      reinterpret_cast<uint4*>(o)[at] = out;
    }
  }
  __syncwarp();  // the row's 8 loads have returned (their values are stored) before its discard
  if (active && at % 8 == 0) asm volatile("discard.global.L2 [%0], 128;" ::"l"(o16 + at * 8) : "memory");
}

// chunked_v18: o = o16 of the segment, o16 laid out [tn, Hq, 64] (a warp per row).
__global__ void convert_query_major_o16_kernel(LaunchParams p, int64_t t0, int64_t tn,
                                               const __half* o16, float* o) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;  // half2 index
  constexpr int64_t kPerRow = kTileDim / 2;
  if (i >= tn * p.Hq * kPerRow) return;
  const int64_t row = i / kPerRow, tl = row / p.Hq, h = row % p.Hq;
  const float2 v = __half22float2(reinterpret_cast<const __half2*>(o16)[i]);
  reinterpret_cast<float2*>(o)[(h * p.T + t0 + tl) * kPerRow + i % kPerRow] = v;
}

// One warp per (head, query) of the segment: softmax over [s_hat(c) for selected c, lse_swa
// (, 0 with softmax1)] with values [o_c..., o_swa (, 0)]. Lane 8 j + part reads dims
// 8 part .. 8 part + 7 of slots j, j + 4, ... with 16-byte loads, all issued before the sums.
template <int kMaxIters>  // ceil(K / 4): 8 for K <= 32, 16 for K <= 64
__global__ void __launch_bounds__(kReduceWarps * kWarp)
    reduce_kernel(LaunchParams p, int64_t t0, int64_t tn, int64_t seg, const int32_t* selection,
                  const float* selected_score, const float* o_swa, const float* lse_swa,
                  const __half* partial, float* o, float* lse) {
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kReduceWarps + threadIdx.x / kWarp;
  if (item >= p.Hq * tn) return;
  const int lane = threadIdx.x % kWarp;
  const int64_t h = item / tn, tl = item % tn, t = t0 + tl, G = p.Hq / p.Hkv, g = h / G;
  const int K = static_cast<int>(p.K);
  const int32_t* sel = selection + (g * p.T + t) * K;
  const float* score = selected_score + (h * p.T + t) * K;
  // Logits of slots lane and lane + 32 (K <= 64).
  float a[2];
  bool valid[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int slot = lane + kWarp * i;
    valid[i] = slot < K && sel[slot] >= 0;
    a[i] = valid[i] ? score[slot] : kNegInf;
  }
  const int64_t row = h * p.T + t;
  const float a_swa = lse_swa[row];
  float m = warp_max(fmaxf(fmaxf(a[0], a[1]), a_swa));
  if (p.softmax1) m = fmaxf(m, 0.0f);
  float w[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) w[i] = exp_diff(a[i], m);
  float l = warp_sum(w[0] + w[1]);
  const float w_swa = exp_diff(a_swa, m);
  l += w_swa;
  if (p.softmax1) l += exp_diff(0.0f, m);
  const unsigned valid_mask[2] = {__ballot_sync(0xffffffffu, valid[0]),
                                  __ballot_sync(0xffffffffu, valid[1])};
  const int part = lane % 8, grp = lane / 8;
  const __half* base = partial + (h * seg + tl) * K * kTileDim + 8 * part;
  uint4 raw[kMaxIters];
#pragma unroll
  for (int j = 0; j < kMaxIters; ++j) {
    const int e = 4 * j + grp;
    const bool ok = e < K && ((valid_mask[(4 * j) / kWarp] >> (e % kWarp)) & 1u);
    raw[j] = ok ? *reinterpret_cast<const uint4*>(base + e * kTileDim) : make_uint4(0, 0, 0, 0);
  }
  float acc[8] = {};
#pragma unroll
  for (int j = 0; j < kMaxIters; ++j) {
    const int e = 4 * j + grp;
    // Weight of slot e from lane e % 32 (all lanes take part in both shuffles).
    const float wa = __shfl_sync(0xffffffffu, w[0], (4 * j + grp) % kWarp);
    const float wb = __shfl_sync(0xffffffffu, w[1], (4 * j + grp) % kWarp);
    const bool ok = e < K && ((valid_mask[(4 * j) / kWarp] >> (e % kWarp)) & 1u);
    if (!ok) continue;
    const float we = 4 * j < kWarp ? wa : wb;
    const __half2* x2 = reinterpret_cast<const __half2*>(&raw[j]);
#pragma unroll
    for (int k2 = 0; k2 < 4; ++k2) {
      const float2 x = __half22float2(x2[k2]);
      acc[2 * k2] = fmaf(we, x.x, acc[2 * k2]);
      acc[2 * k2 + 1] = fmaf(we, x.y, acc[2 * k2 + 1]);
    }
  }
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    acc[k] += __shfl_xor_sync(0xffffffffu, acc[k], 8);
    acc[k] += __shfl_xor_sync(0xffffffffu, acc[k], 16);
  }
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  if (grp == 0) {
    const float4 x0 = *reinterpret_cast<const float4*>(o_swa + row * kTileDim + 8 * part);
    const float4 x1 = *reinterpret_cast<const float4*>(o_swa + row * kTileDim + 8 * part + 4);
    float4* out = reinterpret_cast<float4*>(o + row * kTileDim + 8 * part);
    out[0] = make_float4((acc[0] + w_swa * x0.x) * inv, (acc[1] + w_swa * x0.y) * inv,
                         (acc[2] + w_swa * x0.z) * inv, (acc[3] + w_swa * x0.w) * inv);
    out[1] = make_float4((acc[4] + w_swa * x1.x) * inv, (acc[5] + w_swa * x1.y) * inv,
                         (acc[6] + w_swa * x1.z) * inv, (acc[7] + w_swa * x1.w) * inv);
  }
  if (lane == 0) lse[row] = l > 0.0f ? m + __logf(l) : kNegInf;
}

// One query segment's reduce, with reduce_kernel's unrolling chosen by K (<= 32 or <= 64).
void launch_reduce(const LaunchParams& p, int64_t t0, int64_t tn, int64_t seg, unsigned row_blocks,
                   const int32_t* selection, const float* selected_score, const float* o_swa,
                   const float* lse_swa, const __half* partial, float* o, float* lse,
                   cudaStream_t stream) {
  if (p.K <= 32)
    reduce_kernel<8><<<row_blocks, kReduceWarps * kWarp, 0, stream>>>(
        p, t0, tn, seg, selection, selected_score, o_swa, lse_swa, partial, o, lse);
  else
    reduce_kernel<16><<<row_blocks, kReduceWarps * kWarp, 0, stream>>>(
        p, t0, tn, seg, selection, selected_score, o_swa, lse_swa, partial, o, lse);
}

__device__ __forceinline__ void store4(float* at, float4 x) { *reinterpret_cast<float4*>(at) = x; }
__device__ __forceinline__ void store4(__half* at, float4 x) {
  __half2* h2 = reinterpret_cast<__half2*>(at);
  h2[0] = __floats2half2_rn(x.x, x.y);
  h2[1] = __floats2half2_rn(x.z, x.w);
}

// atomic_v5 and chunked_v10, one warp per (head, query) of the segment: the fusion softmax over
// [s_hat(c) for selected c, lse_swa (, 0 with softmax1)] (Eq. 10): lse (the reduce's arithmetic,
// so the same bits), weights (m, 1 / l) for the chunk kernel, and o started at its window term
// o_swa * exp(lse_swa - m) / l; Out = float: atomic_v5's o, __half: chunked_v10's o16.
template <typename Out>
__global__ void __launch_bounds__(kReduceWarps * kWarp)
    fusion_weights_kernel(LaunchParams p, int64_t t0, int64_t tn, int64_t seg,
                          const int32_t* selection, const float* selected_score,
                          const float* o_swa, const float* lse_swa, float2* weights, Out* o,
                          float* lse) {
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kReduceWarps + threadIdx.x / kWarp;
  if (item >= p.Hq * tn) return;
  const int lane = threadIdx.x % kWarp;
  const int64_t h = item / tn, tl = item % tn, t = t0 + tl, G = p.Hq / p.Hkv, g = h / G;
  const int K = static_cast<int>(p.K);
  const int32_t* sel = selection + (g * p.T + t) * K;
  const float* score = selected_score + (h * p.T + t) * K;
  float a[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int slot = lane + kWarp * i;
    a[i] = slot < K && sel[slot] >= 0 ? score[slot] : kNegInf;
  }
  const int64_t row = h * p.T + t;
  const float a_swa = lse_swa[row];
  float m = warp_max(fmaxf(fmaxf(a[0], a[1]), a_swa));
  if (p.softmax1) m = fmaxf(m, 0.0f);
  float l = warp_sum(exp_diff(a[0], m) + exp_diff(a[1], m));
  const float w_swa = exp_diff(a_swa, m);
  l += w_swa;
  if (p.softmax1) l += exp_diff(0.0f, m);
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  if (lane < kTileDim / 4) {
    const float4 x = reinterpret_cast<const float4*>(o_swa + row * kTileDim)[lane];
    const float f = w_swa * inv;
    store4(o + row * kTileDim + 4 * lane, make_float4(x.x * f, x.y * f, x.z * f, x.w * f));
  }
  if (lane == 0) {
    weights[h * seg + tl] = make_float2(m, inv);
    lse[row] = l > 0.0f ? m + __logf(l) : kNegInf;
  }
}

// chunked_v11, one warp per (group, query) of the segment: fusion_weights_kernel<__half>'s work
// for each head of the group (lse, o16 started at the window term), and each selected slot's
// weight w_c / l (the same arithmetic as v10's chunk kernel, so the same values), stored with
// the group's G heads side by side at the pair's position in the segment's bucket (the
// scatter's offset + rank): the chunk kernel then reads its rows' weights in order, one 32-byte
// sector per pair for G = 8, instead of two scattered 4-byte loads per row.
// kLoads: per_head (v11, v12): each head's loads come after the previous head's lse and o16
// stores, which the compiler keeps in order (they may alias): one dependent round trip to memory
// per head. all_first (chunked_v13, v14): every head's selected scores, lse_swa and o_swa row
// are loaded before the first head's arithmetic (80 registers for G = 8: 3 blocks per SM).
// all_first_half_warps (chunked_v15): as all_first, with head j's o_swa row held by half-warp
// j % 2 (16 lanes x 16 bytes) instead of lanes 0-15 for every head: half the registers for the
// rows, 4 blocks per SM. The same values in all three.
enum class WeightLoads { per_head, all_first, all_first_half_warps };
// Where fusion_pair_weights_kernel puts the pair weights of query t: segment s = t / seg (counted
// from t0's) has its pairs' bucket offsets at offsets + s offsets_stride and its pair weights at
// pair_weight + s pair_weight_stride. One segment per launch (v11-v16) or all (chunked_v17).
// chunked_v23: bucket (not null) receives each pair's bucket entry at its position, segment s's
// buckets at bucket + s bucket_stride (the scatter's work, done where the position is formed).
struct SegmentTables {
  int64_t seg;
  const int32_t* offsets;
  int64_t offsets_stride;
  float* pair_weight;
  int64_t pair_weight_stride;
  uint32_t* bucket = nullptr;
  int64_t bucket_stride = 0;
};
// The window rows (o_swa) of one query's G heads as a warp of pair_weights_block holds them
// (all_first_half_warps): a row (64 fp32 or fp16 values) is spread over kLanes lanes, 16 bytes
// each, so the warp holds kRowsAtOnce rows side by side; head j's row is held by the lanes
// lane / kLanes == j % kRowsAtOnce (fp32: half-warps, chunked_v15; fp16: quarter-warps, chunked_v24).
template <int G, typename OSwa>
struct WarpWindowRows {
  static constexpr int kLanes = kTileDim * static_cast<int>(sizeof(OSwa)) / 16;  // 16 (fp32) or 8 (fp16)
  static constexpr int kRowsAtOnce = kWarp / kLanes;
  static constexpr int kValues = 16 / static_cast<int>(sizeof(OSwa));  // per lane: 4 (fp32) or 8 (fp16)
  uint4 part[(G + kRowsAtOnce - 1) / kRowsAtOnce];

  // The rows of heads g G .. g G + G - 1 of query t (o_swa [Hq, T, 64]).
  __device__ __forceinline__ void load(const OSwa* o_swa, int64_t g, int64_t t, int64_t T, int lane) {
#pragma unroll
    for (int jj = 0; jj < (G + kRowsAtOnce - 1) / kRowsAtOnce; ++jj) {
      const int j = kRowsAtOnce * jj + lane / kLanes;
      if (j < G) part[jj] = reinterpret_cast<const uint4*>(o_swa + ((g * G + j) * T + t) * kTileDim)[lane % kLanes];
    }
  }
  // o16_row = head j's window row times f (each fp32 product rounded to fp16 once), stored by the
  // lanes that hold the row.
  __device__ __forceinline__ void store_scaled(int j, float f, __half* o16_row, int lane) const {
    if (lane / kLanes != j % kRowsAtOnce) return;
    const uint4 in = part[j / kRowsAtOnce];
    __half* at = o16_row + kValues * (lane % kLanes);
    if constexpr (std::is_same_v<OSwa, float>) {
      const float4 x = *reinterpret_cast<const float4*>(&in);
      store4(at, make_float4(x.x * f, x.y * f, x.z * f, x.w * f));
    } else {
      uint4 out;
      const __half2* from = reinterpret_cast<const __half2*>(&in);
      __half2* to = reinterpret_cast<__half2*>(&out);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 v = __half22float2(from[e]);
        to[e] = __floats2half2_rn(v.x * f, v.y * f);
      }
      *reinterpret_cast<uint4*>(at) = out;
    }
  }
};

// kQueryMajorO16 (chunked_v18): o16 is the segment's, laid out [tn, Hq, 64]. Block `block` of
// fusion_pair_weights_kernel (below).
// OSwa: float (the API's o_swa), or __half (an fp16 o_swa, chunked_v24 with RowType::f16: head
// j's 128-byte row held by quarter-warp j % 4, 16 bytes per lane; all_first_half_warps only).
// kPairWeights: the format of the pair weights at tables.pair_weight (PairWeights; f16_records,
// chunked_v30: each pair's record, so no scatter is needed).
template <int G, WeightLoads kLoads, bool kQueryMajorO16 = false, typename OSwa = float,
          PairWeights kPairWeights = PairWeights::f32>
__device__ __forceinline__ void pair_weights_block(unsigned block, const LaunchParams& p, int64_t t0,
                                                   int64_t tn, int64_t nc, const int32_t* selection,
                                                   const float* selected_score, const OSwa* o_swa,
                                                   const float* lse_swa, const int32_t* rank,
                                                   const SegmentTables& tables, __half* o16, float* lse) {
  const int64_t item = static_cast<int64_t>(block) * kReduceWarps + threadIdx.x / kWarp;
  if (item >= p.Hkv * tn) return;
  const int lane = threadIdx.x % kWarp;
  const int64_t g = item / tn, tl = item % tn, t = t0 + tl;
  // The query's segment relative to t0's: its offsets and its pair weights.
  const int64_t s = t / tables.seg - t0 / tables.seg;
  const int32_t* seg_offsets = tables.offsets + s * tables.offsets_stride;
  float* pair_weight = tables.pair_weight + s * tables.pair_weight_stride;
  const int K = static_cast<int>(p.K);
  const int64_t pair0 = (g * p.T + t) * K;  // the pairs of (g, t) in the selection and in rank
  bool valid[2];
  int64_t pos[2];  // the pair's position in the segment's bucket
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int slot = lane + kWarp * i;
    const int32_t c = slot < K ? selection[pair0 + slot] : -1;
    valid[i] = c >= 0;
    pos[i] = valid[i] ? static_cast<int64_t>(seg_offsets[g * nc + c]) + rank[pair0 + slot] : 0;
    if (tables.bucket != nullptr && valid[i])  // chunked_v23: the scatter's entry (t - s seg) << 6 | slot
      tables.bucket[s * tables.bucket_stride + pos[i]] = static_cast<uint32_t>((t % tables.seg) << 6 | slot);
  }
  constexpr bool kLoadsFirst = kLoads != WeightLoads::per_head;
  constexpr bool kHalfWarps = kLoads == WeightLoads::all_first_half_warps;
  static_assert(std::is_same_v<OSwa, float> || kHalfWarps,
                "an fp16 o_swa is read by quarter-warps (all_first_half_warps)");
  static_assert(kPairWeights == PairWeights::f32 || (kHalfWarps && !kQueryMajorO16),
                "fp16 pair weights: chunked_v30's to v32's weights kernel");
  float a[G][2], a_swa[G];
  float4 x[kHalfWarps ? 1 : G] = {};  // per_head, all_first: lanes 0-15 hold each head's fp32 row
  WarpWindowRows<G, OSwa> window_rows;  // all_first_half_warps
  auto load_scores = [&](int j) {
    const int64_t row = (g * G + j) * p.T + t;
    const float* score = selected_score + row * K;
#pragma unroll
    for (int i = 0; i < 2; ++i) a[j][i] = valid[i] ? score[lane + kWarp * i] : kNegInf;
    a_swa[j] = lse_swa[row];
  };
  auto load_window_row = [&](int j) {
    const int64_t row = (g * G + j) * p.T + t;
    if (lane < kTileDim / 4) x[j] = reinterpret_cast<const float4*>(o_swa + row * kTileDim)[lane];
  };
  if constexpr (kHalfWarps) {
#pragma unroll
    for (int j = 0; j < G; ++j) load_scores(j);
    window_rows.load(o_swa, g, t, p.T, lane);
  } else if constexpr (kLoadsFirst) {
#pragma unroll
    for (int j = 0; j < G; ++j) load_scores(j), load_window_row(j);
  }
  float w[2][G];
#pragma unroll
  for (int j = 0; j < G; ++j) {
    const int64_t row = (g * G + j) * p.T + t;
    const int64_t o16_row = kQueryMajorO16 ? tl * p.Hq + g * G + j : row;
    if constexpr (!kLoadsFirst) load_scores(j);
    float m = warp_max(fmaxf(fmaxf(a[j][0], a[j][1]), a_swa[j]));
    if (p.softmax1) m = fmaxf(m, 0.0f);
    float l = warp_sum(exp_diff(a[j][0], m) + exp_diff(a[j][1], m));
    const float w_swa = exp_diff(a_swa[j], m);
    l += w_swa;
    if (p.softmax1) l += exp_diff(0.0f, m);
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
    for (int i = 0; i < 2; ++i) w[i][j] = exp_diff(a[j][i], m) * inv;
    if constexpr (kHalfWarps) {
      window_rows.store_scaled(j, w_swa * inv, o16 + o16_row * kTileDim, lane);
    } else if (lane < kTileDim / 4) {
      if constexpr (!kLoadsFirst) load_window_row(j);
      const float f = w_swa * inv;
      store4(o16 + o16_row * kTileDim + 4 * lane,
             make_float4(x[j].x * f, x[j].y * f, x[j].z * f, x[j].w * f));
    }
    if (lane == 0) lse[row] = l > 0.0f ? m + __logf(l) : kNegInf;
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (!valid[i]) continue;
    if constexpr (kPairWeights == PairWeights::f16) {
      auto* out = reinterpret_cast<__half*>(pair_weight) + pos[i] * G;
      if constexpr (G % 8 == 0) {
#pragma unroll
        for (int j = 0; j < G; j += 8) {
          uint4 v;
          __half2* h = reinterpret_cast<__half2*>(&v);
#pragma unroll
          for (int e = 0; e < 4; ++e) h[e] = __floats2half2_rn(w[i][j + 2 * e], w[i][j + 2 * e + 1]);
          *reinterpret_cast<uint4*>(out + j) = v;
        }
      } else {
#pragma unroll
        for (int j = 0; j < G; ++j) out[j] = __float2half_rn(w[i][j]);
      }
      continue;
    }
    if constexpr (kPairWeights == PairWeights::f16_packed) {
      static_assert(G % 8 == 0, "the query index takes the spare bits of 8 halves");
      const auto tl = static_cast<uint32_t>(t % tables.seg);  // < kPackedQueryLimit (the host's check)
      uint4* out = reinterpret_cast<uint4*>(reinterpret_cast<uint32_t*>(pair_weight) + pos[i] * (G / 2));
#pragma unroll
      for (int j = 0; j < G; j += 8) {
        uint32_t word[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const int jj = j + 2 * k;  // halves jj, jj + 1; the query's bits 2 jj .. 2 jj + 3 in the first 8
          const uint32_t lo = packed_weight_bits(w[i][jj], j == 0 ? tl >> (2 * jj) : 0u);
          const uint32_t hi = packed_weight_bits(w[i][jj + 1], j == 0 ? tl >> (2 * jj + 2) : 0u);
          word[k] = lo | hi << 16;
        }
        out[j / 8] = make_uint4(word[0], word[1], word[2], word[3]);
      }
      continue;
    }
    if constexpr (kPairWeights == PairWeights::f16_records) {
      constexpr int kWords = pair_record_words<G>();
      uint32_t record[kWords] = {};
      record[0] = static_cast<uint32_t>((t % tables.seg) << 6 | (lane + kWarp * i));
#pragma unroll
      for (int j = 0; j < G; j += 2) {
        const __half2 h = __floats2half2_rn(w[i][j], j + 1 < G ? w[i][(j + 1) % G] : 0.0f);
        record[1 + j / 2] = *reinterpret_cast<const uint32_t*>(&h);
      }
      uint4* out = reinterpret_cast<uint4*>(reinterpret_cast<uint32_t*>(pair_weight) + pos[i] * kWords);
#pragma unroll
      for (int q4 = 0; q4 < kWords / 4; ++q4)
        out[q4] = make_uint4(record[4 * q4], record[4 * q4 + 1], record[4 * q4 + 2], record[4 * q4 + 3]);
      continue;
    }
    float* out = pair_weight + pos[i] * G;
    if constexpr (G % 4 == 0) {
#pragma unroll
      for (int j = 0; j < G; j += 4)
        *reinterpret_cast<float4*>(out + j) = make_float4(w[i][j], w[i][j + 1], w[i][j + 2], w[i][j + 3]);
    } else {
#pragma unroll
      for (int j = 0; j < G; ++j) out[j] = w[i][j];
    }
  }
}

// chunked_v36: pair_weights_block's work for v30's records (PairWeights::f16_records) where G <= 8
// and K <= 32, with the warp's lanes as (head j = lane / L, part q = lane % L), L = 32 / G lanes per
// head, lane (j, q) holding head j's scores of the S = G slots S q .. S q + S - 1 (two 16-byte loads
// for G = 8 instead of 16 scalar ones, half of them empty slots at K = 32): each head's maximum and
// sum over its L lanes only, all G heads at once. The sum is formed in warp_sum's order (its
// butterfly levels across lanes first, here across the head's lanes for every slot, then the
// lane's own slots by the same tree), so l, lse and every weight equal pair_weights_block's bit for
// bit. The weights go through shared memory to the lanes that store the records, as whole
// 16-byte parts side by side (G = 8: a 32-byte record by two adjacent lanes, one full sector,
// where pair_weights_block stored it from one lane in two 16-byte writes).
template <int G>
__host__ __device__ constexpr int lane_slots_row_words() { return (G + 1) / 2 + 1; }  // padded
template <int G, typename OSwa>
__device__ __forceinline__ void pair_records_block(unsigned block, const LaunchParams& p, int64_t t0, int64_t tn,
                                                   int64_t nc, const int32_t* selection,
                                                   const float* selected_score, const OSwa* o_swa,
                                                   const float* lse_swa, const int32_t* rank,
                                                   const SegmentTables& tables, __half* o16, float* lse) {
  static_assert(G <= 8 && kWarp % G == 0, "lanes as (head, part): G <= 8");
  constexpr int L = kWarp / G, S = G;  // lanes per head, slots per lane (L S = 32 >= K)
  constexpr int kWords = pair_record_words<G>(), kParts = kWords / 4, kRow = lane_slots_row_words<G>();
  __shared__ uint32_t weight_rows[kReduceWarps * kWarp * kRow];  // per warp: 32 slots x kRow words
  const int64_t item = static_cast<int64_t>(block) * kReduceWarps + threadIdx.x / kWarp;
  if (item >= p.Hkv * tn) return;
  const int lane = threadIdx.x % kWarp, j = lane / L, q = lane % L;
  const int64_t g = item / tn, t = t0 + item % tn;
  const int64_t s = t / tables.seg - t0 / tables.seg;
  const int32_t* seg_offsets = tables.offsets + s * tables.offsets_stride;
  auto* records = reinterpret_cast<uint32_t*>(tables.pair_weight + s * tables.pair_weight_stride);
  const int K = static_cast<int>(p.K);
  const int64_t pair0 = (g * p.T + t) * K, row = (g * G + j) * p.T + t;
  // Slot `lane`'s chunk and its record's position (pair_weights_block's, for slot = lane).
  const int32_t chunk = lane < K ? selection[pair0 + lane] : -1;
  const int32_t pos = chunk >= 0 ? seg_offsets[g * nc + chunk] + rank[pair0 + lane] : 0;
  const unsigned valid = __ballot_sync(0xffffffffu, chunk >= 0);
  float a[S];
  const float* score = selected_score + row * K + S * q;
  if constexpr (S % 4 == 0) {
    if (K % 4 == 0 && reinterpret_cast<uintptr_t>(selected_score) % 16 == 0) {
#pragma unroll
      for (int e = 0; e < S; e += 4) {
        const float4 v = S * q + e < K ? *reinterpret_cast<const float4*>(score + e)
                                       : make_float4(kNegInf, kNegInf, kNegInf, kNegInf);
        a[e] = v.x, a[e + 1] = v.y, a[e + 2] = v.z, a[e + 3] = v.w;
      }
    } else {
#pragma unroll
      for (int e = 0; e < S; ++e) a[e] = S * q + e < K ? score[e] : kNegInf;
    }
  } else {
#pragma unroll
    for (int e = 0; e < S; ++e) a[e] = S * q + e < K ? score[e] : kNegInf;
  }
  const float a_swa = lse_swa[row];
  WarpWindowRows<G, OSwa> window_rows;
  window_rows.load(o_swa, g, t, p.T, lane);
#pragma unroll
  for (int e = 0; e < S; ++e)
    if (!(valid >> (S * q + e) & 1u)) a[e] = kNegInf;
  float m = a_swa;
#pragma unroll
  for (int e = 0; e < S; ++e) m = fmaxf(m, a[e]);
#pragma unroll
  for (int off = L / 2; off > 0; off /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  if (p.softmax1) m = fmaxf(m, 0.0f);
  float x[S], sum[S];
#pragma unroll
  for (int e = 0; e < S; ++e) {
    x[e] = exp_diff(a[e], m);
    sum[e] = x[e];
#pragma unroll
    for (int off = L / 2; off > 0; off /= 2) sum[e] += __shfl_xor_sync(0xffffffffu, sum[e], off);
  }
#pragma unroll
  for (int h = S / 2; h > 0; h /= 2)
#pragma unroll
    for (int e = 0; e < h; ++e) sum[e] = sum[e] + sum[e + h];
  float l = sum[0];
  const float w_swa = exp_diff(a_swa, m);
  l += w_swa;
  if (p.softmax1) l += exp_diff(0.0f, m);
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  if (q == 0) lse[row] = l > 0.0f ? m + __logf(l) : kNegInf;
  const float f = w_swa * inv;
#pragma unroll
  for (int jj = 0; jj < G; ++jj)
    window_rows.store_scaled(jj, __shfl_sync(0xffffffffu, f, jj * L), o16 + ((g * G + jj) * p.T + t) * kTileDim,
                             lane);
  // The weights, slot-major: row c of this warp's weight_rows holds w_c of heads 0 .. G - 1 in fp16.
  uint32_t* rows = weight_rows + (threadIdx.x / kWarp) * kWarp * kRow;
  auto* halves = reinterpret_cast<__half*>(rows);
#pragma unroll
  for (int e = 0; e < S; ++e) {
    halves[(S * q + e) * 2 * kRow + j] = __float2half_rn(x[e] * inv);
    if (G % 2 == 1) halves[(S * q + e) * 2 * kRow + G] = __float2half_rn(0.0f);
  }
  __syncwarp();
  // Record part k = lane + 32 i: slot k / kParts, its 16-byte part k % kParts (the entry's word,
  // the weights' words, zeros), stored at the slot's position.
#pragma unroll
  for (int i = 0; i < kParts; ++i) {
    const int k = lane + kWarp * i, c = k / kParts, part = k % kParts;
    const int32_t at = __shfl_sync(0xffffffffu, pos, c);
    if (!(valid >> c & 1u)) continue;
    uint32_t w[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int word = 4 * part + u;
      w[u] = word == 0 ? static_cast<uint32_t>((t % tables.seg) << 6 | c)
             : word <= (G + 1) / 2 ? rows[c * kRow + word - 1]
                                   : 0u;
    }
    reinterpret_cast<uint4*>(records + static_cast<int64_t>(at) * kWords)[part] = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

// chunked_v36: pair_records_block as a kernel in v35's chain.
template <int G, typename OSwa>
__global__ void __launch_bounds__(kReduceWarps * kWarp, 4)
    pair_records_kernel(LaunchParams p, int64_t t0, int64_t tn, int64_t nc, const int32_t* selection,
                        const float* selected_score, const OSwa* o_swa, const float* lse_swa, const int32_t* rank,
                        SegmentTables tables, __half* o16, float* lse) {
  wait_previous_then_allow_next<true>();
  pair_records_block<G, OSwa>(blockIdx.x, p, t0, tn, nc, selection, selected_score, o_swa, lse_swa, rank, tables,
                              o16, lse);
}

// kChained: chunked_v35 (wait_previous_then_allow_next).
template <int G, WeightLoads kLoads, bool kQueryMajorO16 = false, typename OSwa = float,
          PairWeights kPairWeights = PairWeights::f32, bool kChained = false>
__global__ void __launch_bounds__(kReduceWarps * kWarp,
                                  kLoads == WeightLoads::all_first_half_warps ? 4 : 1)
    fusion_pair_weights_kernel(LaunchParams p, int64_t t0, int64_t tn, int64_t nc,
                               const int32_t* selection, const float* selected_score,
                               const OSwa* o_swa, const float* lse_swa, const int32_t* rank,
                               SegmentTables tables, __half* o16, float* lse) {
  wait_previous_then_allow_next<kChained>();
  pair_weights_block<G, kLoads, kQueryMajorO16, OSwa, kPairWeights>(blockIdx.x, p, t0, tn, nc, selection,
                                                                selected_score, o_swa, lse_swa, rank,
                                                                tables, o16, lse);
}

// chunked_v22: the next segment's pair weights (blocks below weight_blocks: v15's weights kernel
// for queries [t0, t0 + tn)) and this segment's o = o16 (the others: convert_o16_kernel for
// queries [t0c, t0c + tnc)) in one launch of 256-thread blocks.
template <int G>
__global__ void __launch_bounds__(kReduceWarps * kWarp, 4)
    pair_weights_and_convert_kernel(LaunchParams p, int64_t t0, int64_t tn, int64_t nc,
                                    const int32_t* selection, const float* selected_score,
                                    const float* o_swa, const float* lse_swa, const int32_t* rank,
                                    SegmentTables tables, __half* o16, float* lse,
                                    unsigned weight_blocks, int64_t t0c, int64_t tnc, float* o) {
  if (blockIdx.x < weight_blocks)
    pair_weights_block<G, WeightLoads::all_first_half_warps>(blockIdx.x, p, t0, tn, nc, selection,
                                                             selected_score, o_swa, lse_swa, rank,
                                                             tables, o16, lse);
  else
    convert_o16_block(blockIdx.x - weight_blocks, p, t0c, tnc, o16, o);
}

// Queries per segment of atomic_v5: the segment's o (fp32) and q (bf16) rows in half the L2.
int64_t accumulate_segment_queries(const LaunchParams& p) {
  if (g_segment_queries > 0) return g_segment_queries < p.T ? g_segment_queries : p.T;
  int device = 0, l2_bytes = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device) != cudaSuccess || l2_bytes <= 0)
    l2_bytes = 40 << 20;
  const int64_t per_query = p.Hq * kTileDim * static_cast<int64_t>(sizeof(float) + sizeof(__nv_bfloat16));
  int64_t seg = static_cast<int64_t>(l2_bytes) / 2 / per_query;
  if (seg < 64) seg = 64;
  return seg < p.T ? seg : p.T;
}

int64_t segment_queries(const LaunchParams& p) {
  if (g_segment_queries > 0) return g_segment_queries < p.T ? g_segment_queries : p.T;
  const int64_t per_query = p.Hq * p.K * kTileDim * static_cast<int64_t>(sizeof(__half));
  int64_t seg = static_cast<int64_t>(kPartialBudget) / (per_query > 0 ? per_query : 1);
  if (seg < 64) seg = 64;
  return seg < p.T ? seg : p.T;
}

size_t round_up(size_t bytes) { return (bytes + 255) / 256 * 256; }

// Queries per segment of chunked_v10-v14: the segment's fp16 o and bf16 q rows in half the L2;
// chunked_v15 (l2_share 3 / 4): in three quarters of it (9600 queries with 50 MB: more pairs
// per (group, chunk) and item, so fewer K/V loads per row; measured in gpu/NOTES.md "sparse v15").
int64_t f16_segment_queries(const LaunchParams& p, int64_t l2_share_num, int64_t l2_share_den) {
  if (g_segment_queries > 0) return g_segment_queries < p.T ? g_segment_queries : p.T;
  int device = 0, l2_bytes = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device) != cudaSuccess || l2_bytes <= 0)
    l2_bytes = 40 << 20;
  const int64_t per_query = p.Hq * kTileDim * static_cast<int64_t>(2 * sizeof(__half));
  int64_t seg = static_cast<int64_t>(l2_bytes) * l2_share_num / l2_share_den / per_query;
  if (seg < 64) seg = 64;
  return seg < p.T ? seg : p.T;
}

// chunked_v26, v27: the segments of about `seg` queries each that split T evenly: n = T / seg
// rounded to nearest (at least 1), each T / n rounded up (16K with 12800: one of 16384, not 12800 +
// 3584; 128K: 10 of 13108, not 10 of 12800 + 3072). The bench's segment size is taken as given.
int64_t balanced_segment_queries(const LaunchParams& p, int64_t seg) {
  if (g_segment_queries > 0) return seg;
  const int64_t n = (p.T + seg / 2) / seg;
  return n <= 1 ? p.T : (p.T + n - 1) / n;
}

int sm_count() {
  static const int sms = device_sm_count("sparse stage");
  return sms;
}

// chunked_v26, v27: queries per tile of count_rank_pairs_tiled_kernel: count_tile_queries(K), halved
// (down to 64) while the count would have fewer blocks than SMs (16K, K = 32: 1024 -> 128, 256
// blocks instead of 32).
uint32_t short_count_tile_queries(const LaunchParams& p, int64_t seg, int64_t n_seg) {
  uint32_t tile = count_tile_queries(static_cast<uint32_t>(p.K));
  const auto blocks = [&](uint32_t t) { return p.Hkv * n_seg * ((seg + t - 1) / t); };
  while (tile > 64 && blocks(tile) < sm_count()) tile /= 2;
  return tile;
}

// chunk_attention_v6_kernel<G, kSub> with its dynamic shared memory (the q stages), raising the
// kernel's limit once (v7: 36 KB dynamic + 24 KB static).
template <int G, int kSub>
void launch_chunk_v6(unsigned grid, cudaStream_t stream, const LaunchParams& p, int64_t t0,
                     int64_t seg, int64_t nc, const int32_t* items, const ItemDesc* item_desc,
                     const uint32_t* bucket, __half* partial) {
  constexpr int kBytes = kWarpsPerBlock * 2 * 16 * kSub * kTilePitch * sizeof(__nv_bfloat16);
  static const bool raised = cudaFuncSetAttribute(chunk_attention_v6_kernel<G, kSub>,
                                                  cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                  kBytes) == cudaSuccess;
  (void)raised;  // a failure surfaces as the launch's error
  chunk_attention_v6_kernel<G, kSub><<<grid, kPackedThreads, kBytes, stream>>>(
      p, t0, seg, nc, items, item_desc, bucket, partial);
}

// chunked_v28, v29: log2 of the describe's threads per chunk: the chunks' mean item count
// (seg K / (per_item nc)) rounded up to a power of two, at most 32 (16K: 32; 128K: 4; 512K: 1).
int log2_describe_lanes(const LaunchParams& p, int64_t seg, int per_item) {
  const int64_t nc = p.T / p.S, mean = (seg * p.K + per_item * nc - 1) / (per_item * (nc > 0 ? nc : 1));
  int bits = 0;
  while (bits < 5 && (int64_t{1} << bits) < mean) ++bits;
  return bits;
}

// chunked_v29: the describe (blocks [0, describe_blocks)), the scatter (the next scatter_blocks) and
// pair_weights_block of segment 0 (queries [0, tn): the rest) in one launch of 256-thread blocks:
// all three read only the count's and the scan's results, so the chunk kernel is the first to
// need them all. chunked_v30, v31: kPairWeights (v30: no scatter blocks).
// kChained: chunked_v35 (wait_previous_then_allow_next); kLaneSlots: chunked_v36 (pair_records_block).
template <int G, typename OSwa, PairWeights kPairWeights, bool kChained = false, bool kLaneSlots = false>
__global__ void __launch_bounds__(kReduceWarps * kWarp, 4)
    bucket_and_weights_kernel(DescribeArgs describe, unsigned describe_blocks, ScatterArgs scatter,
                              unsigned scatter_blocks, LaunchParams p, int64_t tn, int64_t nc,
                              const int32_t* selection, const float* selected_score, const OSwa* o_swa,
                              const float* lse_swa, const int32_t* rank, SegmentTables tables, __half* o16,
                              float* lse) {
  wait_previous_then_allow_next<kChained>();
  static_assert(kReduceWarps * kWarp == 256, "the describe and the scatter run 256-thread blocks");
  if (blockIdx.x < describe_blocks)
    describe_segment_items(static_cast<int64_t>(blockIdx.x) * 256 + threadIdx.x, describe);
  else if (blockIdx.x < describe_blocks + scatter_blocks)
    scatter_ranked_pair((blockIdx.x - describe_blocks) * 256 + threadIdx.x, scatter);
  else if constexpr (kLaneSlots && G <= 8)
    pair_records_block<G, OSwa>(blockIdx.x - describe_blocks - scatter_blocks, p, 0, tn, nc, selection,
                                selected_score, o_swa, lse_swa, rank, tables, o16, lse);
  else
    pair_weights_block<G, WeightLoads::all_first_half_warps, false, OSwa, kPairWeights>(
        blockIdx.x - describe_blocks - scatter_blocks, p, 0, tn, nc, selection, selected_score, o_swa,
        lse_swa, rank, tables, o16, lse);
}

// kPairWeights: chunked_v30's records (scatter_blocks 0) or v31's fp16 weights; kChained: chunked_v35;
// kLaneSlots: chunked_v36.
template <int G, PairWeights kPairWeights, bool kChained = false, bool kLaneSlots = false>
void launch_bucket_and_weights(const DescribeArgs& describe, unsigned describe_blocks, const ScatterArgs& scatter,
                               unsigned scatter_blocks, const LaunchParams& p, int64_t tn, int64_t nc,
                               const int32_t* selection, const float* selected_score, const FusionRows& rows,
                               const float* lse_swa, const int32_t* rank, const SegmentTables& tables,
                               __half* o16, float* lse, cudaStream_t stream) {
  const unsigned blocks =
      describe_blocks + scatter_blocks + static_cast<unsigned>((p.Hkv * tn + kReduceWarps - 1) / kReduceWarps);
  if constexpr (kChained) {
    if (rows.o_swa_type == RowType::f16)
      launch_programmatic(true, bucket_and_weights_kernel<G, __half, kPairWeights, true, kLaneSlots>, dim3(blocks),
                          kReduceWarps * kWarp, 0, stream, describe, describe_blocks, scatter, scatter_blocks, p,
                          tn, nc, selection, selected_score, static_cast<const __half*>(rows.o_swa), lse_swa,
                          rank, tables, o16, lse);
    else
      launch_programmatic(true, bucket_and_weights_kernel<G, float, kPairWeights, true, kLaneSlots>, dim3(blocks),
                          kReduceWarps * kWarp, 0, stream, describe, describe_blocks, scatter, scatter_blocks, p,
                          tn, nc, selection, selected_score, static_cast<const float*>(rows.o_swa), lse_swa,
                          rank, tables, o16, lse);
  } else if (rows.o_swa_type == RowType::f16)
    bucket_and_weights_kernel<G, __half, kPairWeights><<<blocks, kReduceWarps * kWarp, 0, stream>>>(
        describe, describe_blocks, scatter, scatter_blocks, p, tn, nc, selection, selected_score,
        static_cast<const __half*>(rows.o_swa), lse_swa, rank, tables, o16, lse);
  else
    bucket_and_weights_kernel<G, float, kPairWeights><<<blocks, kReduceWarps * kWarp, 0, stream>>>(
        describe, describe_blocks, scatter, scatter_blocks, p, tn, nc, selection, selected_score,
        static_cast<const float*>(rows.o_swa), lse_swa, rank, tables, o16, lse);
}

// chunked_v8, v9 and v10: the pairs of all query segments bucketed at once (one count with ranks,
// one scan launch with a block per segment, one describe, one scatter), then per segment the
// chunk kernel (v8: chunked_v6's, v9: the wgmma one) and the reduce; v10 per segment: the fusion
// weights (o16 started at the window term), the f16x2-reducing chunk kernel, o = o16. Scratch besides v6's partials: the ranks and the buckets
// (4 bytes per pair each, twice the selection's bytes) and the counts and descriptors of every
// segment.
// rows: o_swa and o as the caller handed them (fp32 but for chunked_v24, launch_fuse_chunked).
template <int G>
void launch_bucketed_once_g(const LaunchParams& p, const int32_t* selection,
                            const float* selected_score, const FusionRows& rows, const float* lse_swa,
                            float* lse, SparseKernel kernel, cudaStream_t stream) {
  constexpr int kPairs = pairs_per_item<G>();
  const auto* o_swa = static_cast<const float*>(rows.o_swa);  // RowType::f32 unless chunked_v24
  auto* o = static_cast<float*>(rows.o);                       // RowType::f32 unless chunked_v24
  // chunked_v23, v24: the bucket entries written by the weights kernel (no scatter launch); v24:
  // o = o16 by convert_discard_o16_kernel, o_swa and o of any RowType the API admits.
  const bool weights_scatter = kernel == SparseKernel::chunked_v23 || kernel == SparseKernel::chunked_v24;
  // chunked_v25: v19 (its scatter) with v24's conversion; v26, v27: v25 with the persistent
  // chunk kernel (below).
  // v28: v26 with several threads per chunk in the describe; v29: v28 with the describe, the
  // scatter and segment 0's pair weights in one launch; v30: v29 with pair records (each pair's
  // bucket entry and fp16 weights, written by the weights kernel) instead of the scatter and the
  // fp32 pair weights; v31: v29 with fp16 pair weights; v32: v30 with the fp16 weights alone,
  // the query in their spare bits (weight_format below).
  // v35: v30 with the kernels after the count chained by programmatic dependent launch; v36: v35
  // with pair_records_block where G <= 8 and K <= 32 (lane_slots), v35's weights elsewhere.
  const bool chained = kernel == SparseKernel::chunked_v35 || kernel == SparseKernel::chunked_v36;
  const bool lane_slots = kernel == SparseKernel::chunked_v36 && G <= 8 && p.K <= 32;
  const bool fp16_weights = kernel == SparseKernel::chunked_v30 || kernel == SparseKernel::chunked_v31 ||
                            kernel == SparseKernel::chunked_v32 || chained;
  const bool post_scan_launch = kernel == SparseKernel::chunked_v29 || fp16_weights;
  const bool describe_lanes = kernel == SparseKernel::chunked_v28 || post_scan_launch;
  const bool persistent = kernel == SparseKernel::chunked_v26 || kernel == SparseKernel::chunked_v27 ||
                          describe_lanes;
  const bool discard_convert =
      kernel == SparseKernel::chunked_v24 || kernel == SparseKernel::chunked_v25 || persistent;
  const bool pair_weights = kernel == SparseKernel::chunked_v11 || kernel == SparseKernel::chunked_v12 ||
                            kernel == SparseKernel::chunked_v13 || kernel == SparseKernel::chunked_v14 ||
                            kernel == SparseKernel::chunked_v15 || kernel == SparseKernel::chunked_v16 ||
                            kernel == SparseKernel::chunked_v17 || kernel == SparseKernel::chunked_v18 ||
                            kernel == SparseKernel::chunked_v19 || kernel == SparseKernel::chunked_v20 ||
                            kernel == SparseKernel::chunked_v21 || kernel == SparseKernel::chunked_v22 ||
                            discard_convert || weights_scatter;
  const bool f16_sums = kernel == SparseKernel::chunked_v10 || pair_weights;
  const bool half_warp_weights = kernel == SparseKernel::chunked_v15 || kernel == SparseKernel::chunked_v16 ||
                                 kernel == SparseKernel::chunked_v17 || kernel == SparseKernel::chunked_v18 ||
                                 kernel == SparseKernel::chunked_v19 || kernel == SparseKernel::chunked_v20 ||
                                 kernel == SparseKernel::chunked_v21 || kernel == SparseKernel::chunked_v22 ||
                                 discard_convert || weights_scatter;
  // chunked_v19-v25: the ranks counted per tile (below) and segments of the whole L2.
  const bool tiled_segments = kernel == SparseKernel::chunked_v19 || kernel == SparseKernel::chunked_v20 ||
                              kernel == SparseKernel::chunked_v21 || kernel == SparseKernel::chunked_v22 ||
                              discard_convert || weights_scatter;
  // chunked_v18: o16 is the segment's, [seg, Hq, 64] (a pair's G heads in adjacent rows).
  const bool query_major_o16 = kernel == SparseKernel::chunked_v18;
  // chunked_v17: the pair weights of every segment in one launch (and in memory at once).
  const bool weights_at_once = kernel == SparseKernel::chunked_v17;
  const int64_t nc = p.T / p.S, n_ch = p.Hkv * nc;
  const int64_t seg = !f16_sums       ? segment_queries(p)
                     : persistent     ? balanced_segment_queries(p, f16_segment_queries(p, 1, 1))
                     : tiled_segments ? f16_segment_queries(p, 1, 1)
                     : half_warp_weights ? f16_segment_queries(p, 3, 4)
                                         : f16_segment_queries(p, 1, 2);
  // chunked_v19: the ranks counted per tile of queries in shared memory (where the group's
  // chunks' histogram fits).
  const bool tiled_count = tiled_segments && nc <= kCountMaxChunks;
  // chunked_v20: segment s + 1's weights start in the last wave of s's chunk kernel, s + 1's
  // chunk kernel in the last wave of s's convert; the pair weights in two alternating buffers.
  const bool overlapped = kernel == SparseKernel::chunked_v20;
  // chunked_v22: segment s + 1's weights and segment s's o = o16 in one launch.
  const bool weights_with_convert = kernel == SparseKernel::chunked_v22;
  const int64_t n_seg = (p.T + seg - 1) / seg;
  // chunked_v30-v32's pair weights (PairWeights); v32 packs them where G is a multiple of 8 and a
  // segment's query index fits 16 bits, elsewhere it writes v30's records.
  const PairWeights weight_format =
      kernel == SparseKernel::chunked_v31 ? PairWeights::f16
      : kernel == SparseKernel::chunked_v32 && G % 8 == 0 && seg <= kPackedQueryLimit ? PairWeights::f16_packed
      : kernel == SparseKernel::chunked_v30 || kernel == SparseKernel::chunked_v32 || chained
          ? PairWeights::f16_records
          : PairWeights::f32;
  // Records and packed weights carry each pair's query: no scatter, no bucket.
  const bool records = weight_format == PairWeights::f16_records || weight_format == PairWeights::f16_packed;
  const int64_t n_pairs = p.Hkv * p.T * p.K, bucket_stride = p.Hkv * seg * p.K;
  const int64_t max_items = (bucket_stride + kPairs - 1) / kPairs + n_ch;
  const size_t counts_bytes = round_up(static_cast<size_t>(n_seg * (n_ch + 1)) * sizeof(int32_t));
  // chunked_v26, v27: each segment's item cursor, zeroed with the counts (one memset).
  const size_t cursor_bytes = persistent ? round_up(static_cast<size_t>(n_seg) * sizeof(int32_t)) : 0;
  const size_t rank_bytes = round_up(static_cast<size_t>(n_pairs) * sizeof(int32_t));
  const size_t bucket_bytes =
      records ? 0 : round_up(static_cast<size_t>(n_seg * bucket_stride) * sizeof(uint32_t));
  const size_t desc_bytes = round_up(static_cast<size_t>(n_seg * max_items) * sizeof(ItemDesc));
  // v10: the rows' (m, 1 / l) [Hq, seg] and o in fp16 [Hq, T, 64] instead of the partials; v11:
  // the segment's pair weights [bucket_stride, G] instead of (m, 1 / l); v30, v31: in their
  // format's 32-bit words per pair (counted as floats below).
  const int64_t pair_weight_stride = bucket_stride * pair_weight_words<G>(weight_format);
  const size_t weights_bytes =
      pair_weights ? round_up(static_cast<size_t>((weights_at_once ? n_seg : overlapped ? 2 : 1) *
                                                  pair_weight_stride) *
                              sizeof(float))
                   : round_up(static_cast<size_t>(p.Hq * seg) * sizeof(float2));
  const size_t partial_bytes =
      f16_sums ? weights_bytes + round_up(static_cast<size_t>(p.Hq * (query_major_o16 ? seg : p.T) * kTileDim) *
                                          sizeof(__half))
               : round_up(static_cast<size_t>(p.Hq * seg * p.K * kTileDim) * sizeof(__half));
  auto* scratch = static_cast<char*>(take_scratch(
      3 * counts_bytes + cursor_bytes + rank_bytes + bucket_bytes + desc_bytes + partial_bytes, stream,
      "sparse stage"));
  char* at = scratch;
  auto take = [&at](size_t bytes) {
    char* here = at;
    at += bytes;
    return here;
  };
  auto* counts = reinterpret_cast<int32_t*>(take(counts_bytes));
  auto* item_cursor = reinterpret_cast<int32_t*>(take(cursor_bytes));  // chunked_v26, v27
  auto* offsets = reinterpret_cast<int32_t*>(take(counts_bytes));
  auto* items = reinterpret_cast<int32_t*>(take(counts_bytes));
  auto* rank = reinterpret_cast<int32_t*>(take(rank_bytes));
  auto* bucket = reinterpret_cast<uint32_t*>(take(bucket_bytes));
  auto* item_desc = reinterpret_cast<ItemDesc*>(take(desc_bytes));
  auto* partial = reinterpret_cast<__half*>(take(partial_bytes));
  // The pair weights of segment s (v17: every segment's at once; v20: two alternating buffers).
  const auto segment_pair_weight = [&](int64_t s) {
    return reinterpret_cast<float*>(partial) +
           (weights_at_once ? s : overlapped ? s % 2 : 0) * pair_weight_stride;
  };
  const auto weight_blocks = [&](int64_t tn) {
    return static_cast<unsigned>((p.Hkv * tn + kReduceWarps - 1) / kReduceWarps);
  };
  const auto segment_tables = [&](int64_t t0) {
    return SegmentTables{seg, offsets + t0 / seg * (n_ch + 1), n_ch + 1, segment_pair_weight(t0 / seg),
                         pair_weight_stride, weights_scatter ? bucket + t0 / seg * bucket_stride : nullptr,
                         bucket_stride};
  };
  // o in fp16 (v10 and later), after the weights.
  const auto o16_of = [&] { return reinterpret_cast<__half*>(reinterpret_cast<char*>(partial) + weights_bytes); };
  if (n_ch > 0 && n_pairs > 0) {
    cudaMemsetAsync(counts, 0, counts_bytes + cursor_bytes, stream);  // the cursors follow the counts
    // Blocks past a segment's item count read a descriptor before they know it: never stale bytes
    // (the persistent chunk kernel reads only the descriptors of items that exist).
    if (!persistent) cudaMemsetAsync(item_desc, 0, desc_bytes, stream);
    const auto TK = static_cast<uint32_t>(p.T * p.K), K = static_cast<uint32_t>(p.K);
    const auto seg32 = static_cast<uint32_t>(seg), nc32 = static_cast<uint32_t>(nc);
    const auto n_ch32 = static_cast<uint32_t>(n_ch), n_pairs32 = static_cast<uint32_t>(n_pairs);
    const auto blocks = static_cast<unsigned>((n_pairs + 255) / 256);
    if (tiled_count) {
      const uint32_t tile_queries = persistent ? short_count_tile_queries(p, seg, n_seg) : count_tile_queries(K);
      const uint32_t tiles_per_seg = (seg32 + tile_queries - 1) / tile_queries;
      static const bool raised =
          cudaFuncSetAttribute(count_rank_pairs_tiled_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(kCountMaxChunks * sizeof(int32_t))) == cudaSuccess;
      (void)raised;  // a failure surfaces as the launch's error
      count_rank_pairs_tiled_kernel<<<static_cast<unsigned>(p.Hkv * n_seg * tiles_per_seg), kCountThreads,
                                      static_cast<size_t>(nc) * sizeof(int32_t), stream>>>(
          selection, static_cast<uint32_t>(p.T), K, seg32, tile_queries, tiles_per_seg, nc32, n_ch32, counts,
          rank);
    } else {
      count_rank_pairs_kernel<<<blocks, 256, 0, stream>>>(selection, TK, K, seg32, nc32, n_ch32,
                                                           n_pairs32, counts, rank);
    }
    if (chained)
      launch_programmatic(true, scan_kernel<true>, dim3(static_cast<unsigned>(n_seg)), kScanThreads, 0, stream,
                          counts, n_ch, kPairs, offsets, items);
    else
      scan_kernel<false><<<static_cast<unsigned>(n_seg), kScanThreads, 0, stream>>>(counts, n_ch, kPairs,
                                                                                    offsets, items);
    const DescribeArgs describe{offsets, items, n_ch, n_seg, max_items, kPairs,
                                describe_lanes ? log2_describe_lanes(p, seg, kPairs) : 0, item_desc};
    const auto describe_blocks =
        static_cast<unsigned>(((n_seg * n_ch << describe.log2_lanes) + 255) / 256);
    const ScatterArgs scatter{selection, rank, TK, K, seg32, nc32, n_ch32, n_pairs32, offsets, bucket_stride,
                              bucket};
    if (post_scan_launch) {  // chunked_v29: with segment 0's pair weights; v30: no scatter
      (lane_slots ? launch_bucket_and_weights<G, PairWeights::f16_records, true, true>
       : chained ? launch_bucket_and_weights<G, PairWeights::f16_records, true>
       : weight_format == PairWeights::f16_packed  ? launch_bucket_and_weights<G, packed_or_records<G>()>
       : weight_format == PairWeights::f16_records ? launch_bucket_and_weights<G, PairWeights::f16_records>
       : weight_format == PairWeights::f16         ? launch_bucket_and_weights<G, PairWeights::f16>
                                                   : launch_bucket_and_weights<G, PairWeights::f32>)(
          describe, describe_blocks, scatter, records ? 0u : blocks, p, seg < p.T ? seg : p.T, nc, selection,
          selected_score, rows, lse_swa, rank, segment_tables(0), o16_of(), lse, stream);
    } else {
      describe_segment_items_kernel<<<describe_blocks, 256, 0, stream>>>(describe);
      if (!weights_scatter) scatter_ranked_pairs_kernel<<<blocks, 256, 0, stream>>>(scatter);
    }
  }
  const auto launch_pair_weights = [&](int64_t t0, int64_t tn, bool after_previous) {
    const auto group_blocks = weight_blocks(tn);
    const SegmentTables tables = segment_tables(t0);
    auto* o16 = o16_of();
    const auto launch = [&](auto kernel_fn) {
      launch_after_previous(after_previous || chained, kernel_fn, group_blocks, kReduceWarps * kWarp, 0, stream,
                            p, t0, tn, nc, selection, selected_score, o_swa, lse_swa, rank, tables, o16, lse);
    };
    if (lane_slots) {  // chunked_v36: pair_records_block in the chain
      if constexpr (G <= 8) {
        if (rows.o_swa_type == RowType::f16)
          launch_programmatic(true, pair_records_kernel<G, __half>, dim3(group_blocks), kReduceWarps * kWarp, 0, stream,
                              p, t0, tn, nc, selection, selected_score, static_cast<const __half*>(rows.o_swa),
                              lse_swa, rank, tables, o16, lse);
        else
          launch_programmatic(true, pair_records_kernel<G, float>, dim3(group_blocks), kReduceWarps * kWarp, 0, stream,
                              p, t0, tn, nc, selection, selected_score, o_swa, lse_swa, rank, tables, o16, lse);
      }
    } else if (chained) {  // chunked_v35: v30's weights kernel in the chain
      constexpr auto kLoads = WeightLoads::all_first_half_warps;
      if (rows.o_swa_type == RowType::f16)
        launch_programmatic(true, fusion_pair_weights_kernel<G, kLoads, false, __half, PairWeights::f16_records, true>,
                            dim3(group_blocks), kReduceWarps * kWarp, 0, stream, p, t0, tn, nc, selection,
                            selected_score, static_cast<const __half*>(rows.o_swa), lse_swa, rank, tables, o16, lse);
      else
        launch(fusion_pair_weights_kernel<G, kLoads, false, float, PairWeights::f16_records, true>);
    } else if (rows.o_swa_type == RowType::f16) {  // chunked_v24 to v35 only (fusion_rows_apply)
      constexpr auto kLoads = WeightLoads::all_first_half_warps;
      const auto kernel_fn =
          weight_format == PairWeights::f16_packed
              ? fusion_pair_weights_kernel<G, kLoads, false, __half, packed_or_records<G>()>
          : weight_format == PairWeights::f16_records
              ? fusion_pair_weights_kernel<G, kLoads, false, __half, PairWeights::f16_records>
          : weight_format == PairWeights::f16 ? fusion_pair_weights_kernel<G, kLoads, false, __half, PairWeights::f16>
                                              : fusion_pair_weights_kernel<G, kLoads, false, __half>;
      kernel_fn<<<group_blocks, kReduceWarps * kWarp, 0, stream>>>(p, t0, tn, nc, selection, selected_score,
                                                                  static_cast<const __half*>(rows.o_swa),
                                                                  lse_swa, rank, tables, o16, lse);
    } else if (weight_format == PairWeights::f16_packed)
      launch(fusion_pair_weights_kernel<G, WeightLoads::all_first_half_warps, false, float, packed_or_records<G>()>);
    else if (weight_format == PairWeights::f16_records)
      launch(fusion_pair_weights_kernel<G, WeightLoads::all_first_half_warps, false, float, PairWeights::f16_records>);
    else if (weight_format == PairWeights::f16)
      launch(fusion_pair_weights_kernel<G, WeightLoads::all_first_half_warps, false, float, PairWeights::f16>);
    else if (query_major_o16)
      launch(fusion_pair_weights_kernel<G, WeightLoads::all_first_half_warps, true>);
    else if (half_warp_weights)
      launch(fusion_pair_weights_kernel<G, WeightLoads::all_first_half_warps>);
    else if (kernel == SparseKernel::chunked_v13 || kernel == SparseKernel::chunked_v14)
      launch(fusion_pair_weights_kernel<G, WeightLoads::all_first>);
    else
      launch(fusion_pair_weights_kernel<G, WeightLoads::per_head>);
  };
  if (weights_at_once) launch_pair_weights(0, p.T, false);
  for (int64_t s = 0; s < n_seg; ++s) {
    const int64_t t0 = s * seg, tn = p.T - t0 < seg ? p.T - t0 : seg;
    const unsigned row_blocks = static_cast<unsigned>((p.Hq * tn + kReduceWarps - 1) / kReduceWarps);
    if (f16_sums) {
      auto* weights = reinterpret_cast<float2*>(partial);  // v10
      // v11: the segment's pair weights (v17: all segments', this one's at s pair_weight_stride)
      auto* pair_weight = segment_pair_weight(s);
      auto* o16 = reinterpret_cast<__half*>(reinterpret_cast<char*>(partial) + weights_bytes);
      if (pair_weights) {
        // v17: all at once above; v20, v22: segment s > 0's with segment s - 1's kernels below;
        // v29: segment 0's with the descriptors and the scatter above.
        if (!weights_at_once && !((overlapped || weights_with_convert) && s > 0) && !(post_scan_launch && s == 0))
          launch_pair_weights(t0, tn, false);
      } else {
        fusion_weights_kernel<__half><<<row_blocks, kReduceWarps * kWarp, 0, stream>>>(
            p, t0, tn, seg, selection, selected_score, o_swa, lse_swa, weights, o16, lse);
      }
      if (n_ch > 0 && n_pairs > 0) {
        const auto grid = static_cast<unsigned>((p.Hkv * tn * p.K + kPairs - 1) / kPairs + n_ch);
        constexpr int kBytes = kWarpsPerBlock * 2 * 16 * kTilePitch * sizeof(__nv_bfloat16);
        if (weight_format == PairWeights::f16_packed)  // the segment's packed weights in place of the bucket
          launch_chunk_persistent<G, 2, packed_or_records<G>()>(
              grid, stream, p, t0, seg, nc, items + s * (n_ch + 1), item_desc + s * max_items,
              reinterpret_cast<const uint32_t*>(pair_weight), o16, pair_weight, item_cursor + s);
        else if (chained)  // chunked_v35: v30's in the chain
          launch_chunk_persistent<G, 2, PairWeights::f16_records, true>(
              grid, stream, p, t0, seg, nc, items + s * (n_ch + 1), item_desc + s * max_items,
              reinterpret_cast<const uint32_t*>(pair_weight), o16, pair_weight, item_cursor + s);
        else if (weight_format == PairWeights::f16_records)  // the segment's pair records in place of the bucket
          launch_chunk_persistent<G, 2, PairWeights::f16_records>(
              grid, stream, p, t0, seg, nc, items + s * (n_ch + 1), item_desc + s * max_items,
              reinterpret_cast<const uint32_t*>(pair_weight), o16, pair_weight, item_cursor + s);
        else if (weight_format == PairWeights::f16)
          launch_chunk_persistent<G, 2, PairWeights::f16>(grid, stream, p, t0, seg, nc, items + s * (n_ch + 1),
                                                          item_desc + s * max_items, bucket + s * bucket_stride,
                                                          o16, pair_weight, item_cursor + s);
        else if (kernel == SparseKernel::chunked_v26 || describe_lanes)
          launch_chunk_persistent<G, 2>(grid, stream, p, t0, seg, nc, items + s * (n_ch + 1),
                                        item_desc + s * max_items, bucket + s * bucket_stride, o16,
                                        pair_weight, item_cursor + s);
        else if (kernel == SparseKernel::chunked_v27)
          launch_chunk_persistent<G, 3>(grid, stream, p, t0, seg, nc, items + s * (n_ch + 1),
                                        item_desc + s * max_items, bucket + s * bucket_stride, o16,
                                        pair_weight, item_cursor + s);
        else if (kernel == SparseKernel::chunked_v12 || kernel == SparseKernel::chunked_v13 ||
            kernel == SparseKernel::chunked_v15 || kernel == SparseKernel::chunked_v17 ||
            kernel == SparseKernel::chunked_v19 || kernel == SparseKernel::chunked_v22 || weights_scatter ||
            discard_convert)
          launch_chunk_v9<G, V9Out::red_f16x2>(grid, stream, p, t0, seg, nc,
                                               items + s * (n_ch + 1), item_desc + s * max_items,
                                               bucket + s * bucket_stride, o16, pair_weight);
        else if (overlapped)
          launch_chunk_v9<G, V9Out::red_f16x2, true>(grid, stream, p, t0, seg, nc, items + s * (n_ch + 1),
                                                     item_desc + s * max_items, bucket + s * bucket_stride,
                                                     o16, pair_weight, s > 0);
        else if (query_major_o16)
          launch_chunk_v9<G, V9Out::red_f16x2_query_major>(
              grid, stream, p, t0, seg, nc, items + s * (n_ch + 1), item_desc + s * max_items,
              bucket + s * bucket_stride, o16, pair_weight);
        else if (kernel == SparseKernel::chunked_v14)
          launch_chunk_v9<G, V9Out::bulk_red>(grid, stream, p, t0, seg, nc,
                                              items + s * (n_ch + 1), item_desc + s * max_items,
                                              bucket + s * bucket_stride, o16, pair_weight);
        else if (pair_weights)
          chunk_attention_f16_kernel<G, true><<<grid, kPackedThreads, kBytes, stream>>>(
              p, t0, seg, nc, items + s * (n_ch + 1), item_desc + s * max_items,
              bucket + s * bucket_stride, selected_score, weights, pair_weight, o16);
        else
          chunk_attention_f16_kernel<G, false><<<grid, kPackedThreads, kBytes, stream>>>(
              p, t0, seg, nc, items + s * (n_ch + 1), item_desc + s * max_items,
              bucket + s * bucket_stride, selected_score, weights, pair_weight, o16);
      }
      if (overlapped && s + 1 < n_seg) {  // the next segment's weights, in this chunk kernel's last wave
        const int64_t t1 = t0 + seg;
        launch_pair_weights(t1, p.T - t1 < seg ? p.T - t1 : seg, n_ch > 0 && n_pairs > 0);
      }
      const int64_t halves2 = p.Hq * tn * kTileDim / 2;
      const auto convert_blocks = static_cast<unsigned>((halves2 + 255) / 256);
      if (discard_convert) {
        const auto blocks8 = static_cast<unsigned>((p.Hq * tn * kTileDim / 8 + 255) / 256);
        if (chained && rows.o_type == RowType::bf16)
          launch_programmatic(true, convert_discard_o16_kernel<__nv_bfloat16, true>, dim3(blocks8), 256, 0, stream,
                              p, t0, tn, o16, static_cast<__nv_bfloat16*>(rows.o));
        else if (chained)
          launch_programmatic(true, convert_discard_o16_kernel<float, true>, dim3(blocks8), 256, 0, stream, p, t0,
                              tn, o16, o);
        else if (rows.o_type == RowType::bf16)
          convert_discard_o16_kernel<<<blocks8, 256, 0, stream>>>(p, t0, tn, o16,
                                                                  static_cast<__nv_bfloat16*>(rows.o));
        else
          convert_discard_o16_kernel<<<blocks8, 256, 0, stream>>>(p, t0, tn, o16, o);
      } else if (weights_with_convert && s + 1 < n_seg) {
        const int64_t t1 = t0 + seg, tn1 = p.T - t1 < seg ? p.T - t1 : seg;
        pair_weights_and_convert_kernel<G><<<weight_blocks(tn1) + convert_blocks, kReduceWarps * kWarp, 0,
                                             stream>>>(p, t1, tn1, nc, selection, selected_score, o_swa,
                                                       lse_swa, rank, segment_tables(t1), o16, lse,
                                                       weight_blocks(tn1), t0, tn, o);
      } else if (query_major_o16)
        convert_query_major_o16_kernel<<<convert_blocks, 256, 0, stream>>>(p, t0, tn, o16, o);
      else if (overlapped)
        convert_o16_kernel<true><<<convert_blocks, 256, 0, stream>>>(p, t0, tn, o16, o);
      else
        convert_o16_kernel<<<convert_blocks, 256, 0, stream>>>(p, t0, tn, o16, o);
      continue;
    }
    if (n_ch > 0 && n_pairs > 0) {
      const auto grid = static_cast<unsigned>((p.Hkv * tn * p.K + kPairs - 1) / kPairs + n_ch);
      if (kernel == SparseKernel::chunked_v9)
        launch_chunk_v9<G, V9Out::partials>(grid, stream, p, t0, seg, nc, items + s * (n_ch + 1),
                                  item_desc + s * max_items, bucket + s * bucket_stride, partial,
                                  nullptr);
      else
        launch_chunk_v6<G, 1>(grid, stream, p, t0, seg, nc, items + s * (n_ch + 1),
                              item_desc + s * max_items, bucket + s * bucket_stride, partial);
    }
    launch_reduce(p, t0, tn, seg, row_blocks, selection, selected_score, o_swa, lse_swa, partial, o,
                  lse, stream);
  }
  give_back_scratch(scratch, stream);
}

template <int G>
void launch_chunked_g(const LaunchParams& p, const int32_t* selection,
                      const float* selected_score, const float* o_swa, const float* lse_swa,
                      float* o, float* lse, SparseKernel kernel, cudaStream_t stream) {
  constexpr int kPairs = pairs_per_item<G>();
  const bool accumulate = kernel == SparseKernel::atomic_v5;
  const bool described = kernel == SparseKernel::chunked_v6 || kernel == SparseKernel::chunked_v7;
  const int64_t nc = p.T / p.S, n_ch = p.Hkv * nc;
  const int64_t seg = accumulate ? accumulate_segment_queries(p) : segment_queries(p);
  // Upper bound of the item count of a segment; blocks past the real count return at once.
  const int64_t max_items = (p.Hkv * seg * p.K + kPairs - 1) / kPairs + n_ch;
  const size_t counts_bytes = round_up((n_ch + 1) * sizeof(int32_t));
  const size_t bucket_bytes = round_up(static_cast<size_t>(p.Hkv * seg * p.K) * sizeof(uint32_t));
  const size_t desc_bytes = described ? round_up(static_cast<size_t>(max_items) * sizeof(ItemDesc)) : 0;
  // chunked_v4/v6: fp16 rows o_c [Hq, seg, K, 64]; atomic_v5: the rows' (m, 1 / l) [Hq, seg].
  const size_t partial_bytes =
      accumulate ? round_up(static_cast<size_t>(p.Hq * seg) * sizeof(float2))
                 : round_up(static_cast<size_t>(p.Hq * seg * p.K * kTileDim) * sizeof(__half));
  const size_t total = 3 * counts_bytes + bucket_bytes + desc_bytes + partial_bytes;
  auto* scratch = static_cast<char*>(take_scratch(total, stream, "sparse stage"));
  auto* counts = reinterpret_cast<int32_t*>(scratch);
  auto* offsets = reinterpret_cast<int32_t*>(scratch + counts_bytes);
  auto* items = reinterpret_cast<int32_t*>(scratch + 2 * counts_bytes);
  auto* bucket = reinterpret_cast<uint32_t*>(scratch + 3 * counts_bytes);
  auto* item_desc = described ? reinterpret_cast<ItemDesc*>(scratch + 3 * counts_bytes + bucket_bytes) : nullptr;
  auto* partial = reinterpret_cast<__half*>(scratch + 3 * counts_bytes + bucket_bytes + desc_bytes);
  Accumulate acc;
  if (accumulate)
    acc = Accumulate{selected_score, reinterpret_cast<const float2*>(partial), o};
  cudaMemsetAsync(counts, 0, (n_ch + 1) * sizeof(int32_t), stream);
  // Blocks past a segment's item count read a descriptor before they know it: never stale bytes.
  if (described) cudaMemsetAsync(item_desc, 0, desc_bytes, stream);
  for (int64_t t0 = 0; t0 < p.T; t0 += seg) {
    const int64_t tn = p.T - t0 < seg ? p.T - t0 : seg;
    const int64_t n_pairs = p.Hkv * tn * p.K;
    const int64_t rows = p.Hq * tn;
    const unsigned row_blocks = static_cast<unsigned>((rows + kReduceWarps - 1) / kReduceWarps);
    if (accumulate)
      fusion_weights_kernel<<<row_blocks, kReduceWarps * kWarp, 0, stream>>>(
          p, t0, tn, seg, selection, selected_score, o_swa, lse_swa,
          reinterpret_cast<float2*>(partial), o, lse);
    if (n_ch > 0 && n_pairs > 0) {
      const unsigned blocks = static_cast<unsigned>((n_pairs + 255) / 256);
      count_pairs_kernel<<<blocks, 256, 0, stream>>>(selection, p.T, p.K, t0, tn, p.Hkv, nc, counts);
      scan_kernel<false><<<1, kScanThreads, 0, stream>>>(counts, n_ch, kPairs, offsets, items);
      if (described)
        describe_items_kernel<<<static_cast<unsigned>((n_ch + 255) / 256), 256, 0, stream>>>(
            offsets, items, n_ch, kPairs, item_desc);
      scatter_pairs_kernel<<<blocks, 256, 0, stream>>>(selection, p.T, p.K, t0, tn, p.Hkv, nc,
                                                       offsets, counts, bucket);
      const int64_t seg_items = (n_pairs + kPairs - 1) / kPairs + n_ch;
      const auto grid = static_cast<unsigned>(seg_items);
      if (accumulate)
        chunk_attention_kernel<G, true><<<grid, kPackedThreads, 0, stream>>>(
            p, t0, seg, nc, offsets, items, bucket, nullptr, acc);
      else if (kernel == SparseKernel::chunked_v6)
        launch_chunk_v6<G, 1>(grid, stream, p, t0, seg, nc, items, item_desc, bucket, partial);
      else if (kernel == SparseKernel::chunked_v7)
        launch_chunk_v6<G, 2>(grid, stream, p, t0, seg, nc, items, item_desc, bucket, partial);
      else
        chunk_attention_kernel<G, false><<<grid, kPackedThreads, 0, stream>>>(
            p, t0, seg, nc, offsets, items, bucket, partial, acc);
      // The scatter's cursors end at the counts: zero them for the next segment.
      cudaMemsetAsync(counts, 0, (n_ch + 1) * sizeof(int32_t), stream);
    }
    if (accumulate) continue;
    launch_reduce(p, t0, tn, seg, row_blocks, selection, selected_score, o_swa, lse_swa, partial, o,
                  lse, stream);
  }
  give_back_scratch(scratch, stream);
}

}  // namespace

void set_sparse_segment_queries(int64_t queries) { g_segment_queries = queries; }
void set_sparse_kernel(std::optional<SparseKernel> kernel) { g_sparse_kernel = kernel; }
SparseKernel sparse_kernel() { return g_sparse_kernel.value_or(default_sparse_kernel()); }

bool chunked_fuse_applies(const LaunchParams& p) {
  // Bucket entries pack (t - t0) << 6 | slot into 32 bits; the scan counts in int32.
  return p.K >= 1 && p.K <= 64 && p.T < (int64_t{1} << 25) && p.Hkv * p.T * p.K < (int64_t{1} << 31);
}

bool fusion_rows_apply(SparseKernel kernel) {
  return kernel == SparseKernel::chunked_v24 || kernel == SparseKernel::chunked_v25 ||
         kernel == SparseKernel::chunked_v26 || kernel == SparseKernel::chunked_v27 ||
         kernel == SparseKernel::chunked_v28 || kernel == SparseKernel::chunked_v29 ||
         kernel == SparseKernel::chunked_v30 || kernel == SparseKernel::chunked_v31 ||
         kernel == SparseKernel::chunked_v32 || kernel == SparseKernel::chunked_v35 ||
         kernel == SparseKernel::chunked_v36;
}

void launch_fuse_chunked(const LaunchParams& p, const int32_t* selection,
                         const float* selected_score, const FusionRows& rows, const float* lse_swa,
                         float* lse, cudaStream_t stream) {
  const SparseKernel kernel = sparse_kernel();
  if (uses_wgmma(kernel) && !wgmma_runs_on_current_device())
    refuse_wgmma_kernel("sparse_kernel", sparse_kernel_name(kernel),
                        "a kernel without wgmma, such as chunked_v21, the default here");
  const auto* o_swa = static_cast<const float*>(rows.o_swa);  // RowType::f32 below
  auto* o = static_cast<float*>(rows.o);
  if (kernel == SparseKernel::chunked_v8 || kernel == SparseKernel::chunked_v9 ||
      kernel == SparseKernel::chunked_v10 || kernel == SparseKernel::chunked_v11 ||
      kernel == SparseKernel::chunked_v12 || kernel == SparseKernel::chunked_v13 ||
      kernel == SparseKernel::chunked_v14 || kernel == SparseKernel::chunked_v15 ||
      kernel == SparseKernel::chunked_v16 || kernel == SparseKernel::chunked_v17 ||
      kernel == SparseKernel::chunked_v18 || kernel == SparseKernel::chunked_v19 ||
      kernel == SparseKernel::chunked_v20 || kernel == SparseKernel::chunked_v21 ||
      kernel == SparseKernel::chunked_v22 || kernel == SparseKernel::chunked_v23 ||
      kernel == SparseKernel::chunked_v24 || kernel == SparseKernel::chunked_v25 ||
      kernel == SparseKernel::chunked_v26 || kernel == SparseKernel::chunked_v27 ||
      kernel == SparseKernel::chunked_v28 || kernel == SparseKernel::chunked_v29 ||
      kernel == SparseKernel::chunked_v30 || kernel == SparseKernel::chunked_v31 ||
      kernel == SparseKernel::chunked_v32 || kernel == SparseKernel::chunked_v35 ||
      kernel == SparseKernel::chunked_v36) {
    switch (p.Hq / p.Hkv) {
      case 1: return launch_bucketed_once_g<1>(p, selection, selected_score, rows, lse_swa, lse, kernel, stream);
      case 2: return launch_bucketed_once_g<2>(p, selection, selected_score, rows, lse_swa, lse, kernel, stream);
      case 4: return launch_bucketed_once_g<4>(p, selection, selected_score, rows, lse_swa, lse, kernel, stream);
      case 8: return launch_bucketed_once_g<8>(p, selection, selected_score, rows, lse_swa, lse, kernel, stream);
      default: return launch_bucketed_once_g<16>(p, selection, selected_score, rows, lse_swa, lse, kernel, stream);
    }
  }
  switch (p.Hq / p.Hkv) {
    case 1: return launch_chunked_g<1>(p, selection, selected_score, o_swa, lse_swa, o, lse, kernel, stream);
    case 2: return launch_chunked_g<2>(p, selection, selected_score, o_swa, lse_swa, o, lse, kernel, stream);
    case 4: return launch_chunked_g<4>(p, selection, selected_score, o_swa, lse_swa, o, lse, kernel, stream);
    case 8: return launch_chunked_g<8>(p, selection, selected_score, o_swa, lse_swa, o, lse, kernel, stream);
    default: return launch_chunked_g<16>(p, selection, selected_score, o_swa, lse_swa, o, lse, kernel, stream);
  }
}

}  // namespace hils::gpu::detail
