// Chunk-major hierarchical fusion (reference/SEMANTICS.md §5, Eq. 10) for the packed shapes (bf16,
// d = dv = S = 64, G | 16). The query-major packed kernel loads every selected chunk once per block
// of M = 64/G queries; with little overlap between the queries' selections that is ~K chunks (16 KB
// each) per query and group, which bounds it by K/V bytes. Here the (query, chunk) pairs are
// bucketed by chunk, a block loads one chunk's K/V once and runs every query (x G heads) that
// selected it on tensor cores. The fusion weights depend only on the selected scores and lse_swa,
// so a weights kernel forms each row's fusion softmax first (lse, each pair's weights w_c / l, and
// o started at its window term in an fp16 copy o16), and the chunk kernel adds w_c o_c of every
// (row, slot) into o16 with 16-byte f16x2 reductions (no scratch of partials, no reduce; o's last
// bits vary from run to run with the order of the additions); o = o16 at the end. Queries go in
// segments whose o16 and q rows stay in the L2.
//
// The kept versions (attention.hpp SparseKernel): chunked_v21 (no wgmma: the default where wgmma
// cannot run) and chunked_v30, v35, v36 (wgmma; v36 the default). Their lineage, each step measured
// in gpu/NOTES.md (the versions between them were removed in session 17, "Kernels removed in
// session 17"; their code is at commit ad5fb84): v6 the mma.sync chunk kernel's per-slice
// instructions (one descriptor per item, base-2 softmax, stmatrix), v8 the pairs of all segments
// bucketed at once (a count with ranks, a scan block per segment, a scatter without atomics), v9
// the chunk kernel on wgmma, v10 weights first with f16x2 reductions into o16, v11 the rows'
// weights formed before the chunk kernel and stored in bucket order, v15 a leaner weights kernel
// (o_swa rows over half-warps), v19 the ranks counted per tile of queries in shared memory and
// segments of the whole L2 (v21 = v16, i.e. v11 without wgmma with v15's weights kernel, plus
// v19's count and segments), v24 o16 converted 16 bytes per thread, discarding the lines it read,
// and an fp16 o_swa / bf16 o (hils::gpu::fuse_rows), v26 a persistent chunk kernel (items taken
// from a cursor), segments that split T evenly, the count's tiles shortened at short T, v28 several
// threads per chunk in the describe, v29 the describe and segment 0's pair weights in one launch,
// v30 each pair's bucket entry and fp16 weights in one record written by the weights kernel (no
// scatter), v35 v30's kernels after the count chained by programmatic dependent launch, v36 v35
// with a pair-weights kernel whose lanes hold (head, G slots).
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
int64_t g_segment_queries = 0;  // 0: choose from the L2 size
std::optional<SparseKernel> g_sparse_kernel;  // nullopt: default_sparse_kernel() at each call

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

// o += P . V_tile with P as bf16 A fragments (pv_tile of mma_common.cuh, which packs P itself).
// The several 16-row slices per call (chunk_attention_v6_kernel's kSub) went in session 17
// (gpu/NOTES.md "Kernels removed in session 17"); the scores side is mma_common.cuh's qk_tile.
__device__ __forceinline__ void pv_tile_packed(float (&o)[8][4], const uint32_t (&pa)[4][4],
                                               const __nv_bfloat16 (*vs_tile)[kTilePitch]) {
  const int lane = threadIdx.x % kWarp;
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) {
    const __nv_bfloat16* row = vs_tile[16 * ks + lane % 8 + 8 * ((lane / 8) % 2)] + 8 * (lane / 16);
#pragma unroll
    for (int np = 0; np < 4; ++np) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, row + 16 * np);
      mma_16816(o[2 * np], pa[ks], b[0], b[1]);
      mma_16816(o[2 * np + 1], pa[ks], b[2], b[3]);
    }
  }
}

// A chunk kernel's row table: row rr is head g G + rr % G of the item's pair rr / G; row_q holds
// its q element offset (-1 past the item's pairs), row_out its scratch row (h seg + tl) K + slot
// (the partials' row of the removed chunked_v6-v9; written, not read).
// kEntryWords: the bucket's words per entry (chunked_v30: the pair records', the entry first).
template <int G, int kEntryWords>
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
      row_out[rr] = static_cast<uint32_t>((h * seg + tl) * p.K + (entry & 63u));
    } else {
      row_q[rr] = -1;
    }
  }
}

// The wgmma chunk kernel (chunked_v9 on; chunked_v30, v35, v36). The block (one warpgroup) runs
// 64-row steps: S = Q K^T with Q (the step's 64 q rows) and K from 128-byte-swizzled
// shared-memory panels, P = softmax in registers (each warp's 16 rows: the accumulator of warp w
// is the mma.sync C fragment of rows 16 w ..), O = P V with P from registers and V as the N-major
// B panel. No ldmatrix: the tensor cores read q, K and V from shared memory themselves. The step's
// q rows come by cp.async into one of two swizzled stages (the next step's while this one
// computes); the fp16 results leave through the same stage (stmatrix, 16-byte reductions).
constexpr int kV9Panel = 64 * wg::kPanelRowBytes;  // bytes of a 64-row panel
constexpr int kV9SmemBytes = wg::kAtomBytes + 4 * kV9Panel;  // K, V, 2 q stages, alignment slack

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

// Eight halves at o (16-byte aligned) += v (chunked_v10 on): one 16-byte reduction on sm_90
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

// One item of chunk_attention_persistent_kernel: chunk c of group g and its pairs desc, with the
// dynamic shared memory `smem` (1024-byte aligned), two q stages (the next step's rows stream in
// while this one computes). records: the segment's pair records (PairWeights::f16_records: the
// entry, then the G weights in fp16). Each row is scaled by its weight over its softmax sum, then
// added into o16 at the row's q offset by 8 f16x2 reductions of 16 bytes per row from the
// consumed q stage.
template <int G>
__device__ __forceinline__ void chunk_item_v9(const LaunchParams& p, int64_t t0, int64_t seg, int64_t nc,
                                              const ItemDesc& desc, const uint32_t* records, __half* o16,
                                              unsigned char* smem) {
  constexpr int kRows = pairs_per_item<G>() * G;  // 512
  unsigned char* k_panel = smem;
  unsigned char* v_panel = smem + kV9Panel;
  unsigned char* q_stages = smem + 2 * kV9Panel;  // 2 stages, kV9Panel bytes apart
  __shared__ int64_t row_q[kRows];     // q element offset of the row; -1 past the pairs
  __shared__ uint32_t row_out[kRows];  // fill_row_table's (not read)
  const int64_t g = desc.chunk / nc, c = desc.chunk % nc;
  const int n_steps = (desc.count * G + 63) / 64;
  load_panel_async(k_panel, static_cast<const __nv_bfloat16*>(p.k) + g * p.T * kTileDim, c * kTileDim);
  load_panel_async(v_panel, static_cast<const __nv_bfloat16*>(p.v) + g * p.T * kTileDim, c * kTileDim);
  cp_async_commit();
  constexpr int kEntryWords = pair_record_words<G>();
  __shared__ float row_weight[kRows];  // w_c / l of the row
  fill_row_table<G, kEntryWords>(row_q, row_out, 64 * n_steps, p, t0, seg, desc, records, g);
  for (int rr = threadIdx.x; rr < 64 * n_steps; rr += kPackedThreads) {
    const auto* weights = reinterpret_cast<const __half*>(records + (static_cast<int64_t>(desc.first) + rr / G) *
                                                                        kEntryWords + 1);
    row_weight[rr] = rr < desc.count * G ? __half2float(weights[rr % G]) : 0.0f;
  }
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
  // Base-2 softmax as the mma.sync kernel's (c = scale log2 e > 0), the landmark key (column 63)
  // masked.
  const float c2 = p.scale * 1.4426950408889634f;
  const bool mask_landmark = p.landmarks && lane % 4 == 3;
  const int row_in_step = 16 * warp + lane % 8 + 8 * ((lane / 8) % 2);  // stmatrix row address
  issue_q(0, q_stages);
  for (int s = 0; s < n_steps; ++s) {
    unsigned char* stage = q_stages + (s & 1) * kV9Panel;
    cp_async_wait_all();  // this step's q (and, at s = 0, K and V)
    wg::fence_proxy_async();
    __syncthreads();  // q visible to the tensor cores; every warp is done with the stage refilled now
    if (s + 1 < n_steps) issue_q(s + 1, q_stages + ((s + 1) & 1) * kV9Panel);
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
    for (int r = 0; r < 2; ++r)  // the row's fusion weight over its sum
      inv[r] = row_weight[64 * s + 16 * warp + lane / 4 + 8 * r] / quad_sum(row_sum[r]);
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
    // The normalised rows as fp16 into the stage (the tensor cores are done with its q), the
    // warp's own 16 rows, then 16-byte reductions of those rows.
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
      red_add_f16x8(o16 + row_q[rr] + col, x);
    }
  }
}

// The dynamic shared memory of the wgmma chunk kernel, on 1024-byte boundaries (the swizzle's atom).
__device__ __forceinline__ unsigned char* v9_smem() {
  extern __shared__ __align__(16) unsigned char dynamic_smem[];
  return reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(dynamic_smem) + wg::kAtomBytes - 1) &
                                          ~static_cast<uintptr_t>(wg::kAtomBytes - 1));
}

// chunked_v26 on: the wgmma chunk kernel's items taken by a grid of as many blocks as fit on the
// device at once, each taking its next item from the segment's cursor (an atomicAdd, issued at
// the start of the current item and read after it), until the segment's n_items are taken. No
// block for an item that does not exist (a block per item's grid is the bound Hkv seg K / pairs +
// Hkv nc, ~40% above the items at 512K) and no block launch per item. records: chunk_item_v9's.
// kChained: chunked_v35 (wait_previous_then_allow_next).
template <int G, bool kChained = false>
__global__ void __launch_bounds__(kPackedThreads, 4)
    chunk_attention_persistent_kernel(LaunchParams p, int64_t t0, int64_t seg, int64_t nc,
                                      const int32_t* items, const ItemDesc* item_desc,
                                      const uint32_t* records, __half* o16, int32_t* item_cursor) {
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
    chunk_item_v9<G>(p, t0, seg, nc, desc, records, o16, smem);
    if (threadIdx.x == 0) next_item = next;
    __syncthreads();  // next_item visible; every warp done with the panels, stages and row tables
  }
}

// chunk_attention_persistent_kernel with as many blocks as are resident on the device at once (at
// most `bound`, the items' upper bound); kChained: chunked_v35 (launched in the chain of
// programmatic launches).
template <int G, bool kChained = false>
void launch_chunk_persistent(unsigned bound, cudaStream_t stream, const LaunchParams& p, int64_t t0,
                             int64_t seg, int64_t nc, const int32_t* items, const ItemDesc* item_desc,
                             const uint32_t* records, __half* o16, int32_t* item_cursor) {
  constexpr int kBytes = kV9SmemBytes;
  static constexpr auto kernel = chunk_attention_persistent_kernel<G, kChained>;
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
                        records, o16, item_cursor);
  else
    chunk_attention_persistent_kernel<G><<<grid, kPackedThreads, kBytes, stream>>>(p, t0, seg, nc, items, item_desc,
                                                                                  records, o16, item_cursor);
}

// chunked_v21's chunk kernel (mma.sync; chunked_v10, v11's): one block per item descriptor, its
// rows (pair x head) first turned into their q element offsets (= their o16 offsets) and weights
// in shared memory, the weights w_c / l in bucket order from pair_weight (written by
// fusion_pair_weights_kernel). A warp step is one 16-row slice (the q rows by cp.async into one of
// the warp's two stages, the next slice's while this one computes); each row is scaled by its
// weight over its softmax sum before its fp16 rounding and added into o16 (f16x2 reductions).
template <int G>
__global__ void __launch_bounds__(kPackedThreads, 5)
    chunk_attention_f16_kernel(LaunchParams p, int64_t t0, int64_t seg, int64_t nc,
                               const int32_t* items, const ItemDesc* item_desc,
                               const uint32_t* bucket, const float* pair_weight, __half* o16) {
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
      row_weight[rr] = pair_weight[static_cast<int64_t>(desc.first) * G + rr];
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
    uint32_t qa[4][4];
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) ldmatrix_x4(qa[ks], frag_row + 16 * ks);
    float sc[8][4];
    qk_tile(sc, qa, ks_tile);
    if (mask_landmark) sc[7][1] = sc[7][3] = kNegInf;
    float row_max[2] = {kNegInf, kNegInf};
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) row_max[e / 2] = fmaxf(row_max[e / 2], sc[nt][e]);
    float neg_max[2], row_sum[2] = {0.0f, 0.0f}, scale[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) neg_max[r] = -quad_max(row_max[r]) * c2;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        sc[nt][e] = ex2_approx(fmaf(sc[nt][e], c2, neg_max[e / 2]));
        row_sum[e / 2] += sc[nt][e];
      }
#pragma unroll
    for (int r = 0; r < 2; ++r)
      scale[r] = row_weight[16 * s + lane / 4 + 8 * r] / quad_sum(row_sum[r]);
    uint32_t pa[4][4];
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      pa[ks][0] = pack_bf16(sc[2 * ks][0], sc[2 * ks][1]);
      pa[ks][1] = pack_bf16(sc[2 * ks][2], sc[2 * ks][3]);
      pa[ks][2] = pack_bf16(sc[2 * ks + 1][0], sc[2 * ks + 1][1]);
      pa[ks][3] = pack_bf16(sc[2 * ks + 1][2], sc[2 * ks + 1][3]);
    }
    float oc[8][4] = {};
    pv_tile_packed(oc, pa, vs_tile);
    __syncwarp();
#pragma unroll
    for (int nt = 0; nt < 8; nt += 2)
      stmatrix_x4(frag_row + 8 * nt,
                  pack_half2(oc[nt][0] * scale[0], oc[nt][1] * scale[0]),
                  pack_half2(oc[nt][2] * scale[1], oc[nt][3] * scale[1]),
                  pack_half2(oc[nt + 1][0] * scale[0], oc[nt + 1][1] * scale[0]),
                  pack_half2(oc[nt + 1][2] * scale[1], oc[nt + 1][3] * scale[1]));
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

// chunked_v21, after the segment's chunk kernel: o = o16 in fp32 (one thread per half2).
__global__ void __launch_bounds__(256) convert_o16_kernel(LaunchParams p, int64_t t0, int64_t tn,
                                                          const __half* o16, float* o) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * 256 + threadIdx.x;  // half2 index
  const int64_t per_head = tn * kTileDim / 2;
  if (i >= p.Hq * per_head) return;
  const int64_t h = i / per_head, at = (h * p.T + t0) * kTileDim / 2 + i % per_head;
  const float2 v = __half22float2(reinterpret_cast<const __half2*>(o16)[at]);
  reinterpret_cast<float2*>(o)[at] = v;
}

// chunked_v24 on (v30, v35, v36), after the segment's chunk kernel: o = o16 with 16 bytes of o16 per thread (8
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

__device__ __forceinline__ void store4(__half* at, float4 x) {
  __half2* h2 = reinterpret_cast<__half2*>(at);
  h2[0] = __floats2half2_rn(x.x, x.y);
  h2[1] = __floats2half2_rn(x.z, x.w);
}

// chunked_v11, one warp per (group, query) of the segment: fusion_weights_kernel<__half>'s work
// for each head of the group (lse, o16 started at the window term), and each selected slot's
// weight w_c / l (the same arithmetic as v10's chunk kernel, so the same values), stored with
// the group's G heads side by side at the pair's position in the segment's bucket (the
// scatter's offset + rank): the chunk kernel then reads its rows' weights in order, one 32-byte
// sector per pair for G = 8, instead of two scattered 4-byte loads per row.
// Every head's selected scores, lse_swa and o_swa row are loaded before the first head's
// arithmetic (chunked_v13), with head j's o_swa row held by half-warp j % 2 (16 lanes x 16 bytes;
// chunked_v15: half the registers for the rows, 4 blocks per SM).
// Where fusion_pair_weights_kernel puts the pair weights of query t: segment s = t / seg (counted
// from t0's) has its pairs' bucket offsets at offsets + s offsets_stride and its pair weights at
// pair_weight + s pair_weight_stride (one segment per launch: s = 0).
struct SegmentTables {
  int64_t seg;
  const int32_t* offsets;
  int64_t offsets_stride;
  float* pair_weight;
  int64_t pair_weight_stride;
};
// The window rows (o_swa) of one query's G heads as a warp of pair_weights_block holds them
// (half-warps): a row (64 fp32 or fp16 values) is spread over kLanes lanes, 16 bytes
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

// Block `block` of fusion_pair_weights_kernel (below).
// OSwa: float (the API's o_swa), or __half (an fp16 o_swa, chunked_v24 on with RowType::f16: head
// j's 128-byte row held by quarter-warp j % 4, 16 bytes per lane).
// kPairWeights: the format of the pair weights at tables.pair_weight (PairWeights; f16_records,
// chunked_v30: each pair's record, so no scatter is needed).
template <int G, typename OSwa = float, PairWeights kPairWeights = PairWeights::f32>
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
  }
  float a[G][2], a_swa[G];
  WarpWindowRows<G, OSwa> window_rows;
  auto load_scores = [&](int j) {
    const int64_t row = (g * G + j) * p.T + t;
    const float* score = selected_score + row * K;
#pragma unroll
    for (int i = 0; i < 2; ++i) a[j][i] = valid[i] ? score[lane + kWarp * i] : kNegInf;
    a_swa[j] = lse_swa[row];
  };
#pragma unroll
  for (int j = 0; j < G; ++j) load_scores(j);
  window_rows.load(o_swa, g, t, p.T, lane);
  float w[2][G];
#pragma unroll
  for (int j = 0; j < G; ++j) {
    const int64_t row = (g * G + j) * p.T + t;
    float m = warp_max(fmaxf(fmaxf(a[j][0], a[j][1]), a_swa[j]));
    if (p.softmax1) m = fmaxf(m, 0.0f);
    float l = warp_sum(exp_diff(a[j][0], m) + exp_diff(a[j][1], m));
    const float w_swa = exp_diff(a_swa[j], m);
    l += w_swa;
    if (p.softmax1) l += exp_diff(0.0f, m);
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
    for (int i = 0; i < 2; ++i) w[i][j] = exp_diff(a[j][i], m) * inv;
    window_rows.store_scaled(j, w_swa * inv, o16 + row * kTileDim, lane);
    if (lane == 0) lse[row] = l > 0.0f ? m + __logf(l) : kNegInf;
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (!valid[i]) continue;
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
template <int G, typename OSwa = float, PairWeights kPairWeights = PairWeights::f32, bool kChained = false>
__global__ void __launch_bounds__(kReduceWarps * kWarp, 4)
    fusion_pair_weights_kernel(LaunchParams p, int64_t t0, int64_t tn, int64_t nc,
                               const int32_t* selection, const float* selected_score,
                               const OSwa* o_swa, const float* lse_swa, const int32_t* rank,
                               SegmentTables tables, __half* o16, float* lse) {
  wait_previous_then_allow_next<kChained>();
  pair_weights_block<G, OSwa, kPairWeights>(blockIdx.x, p, t0, tn, nc, selection, selected_score, o_swa, lse_swa,
                                            rank, tables, o16, lse);
}

size_t round_up(size_t bytes) { return (bytes + 255) / 256 * 256; }

// Queries per segment (chunked_v19 on): the segment's fp16 o and bf16 q rows in the whole L2
// (gpu/NOTES.md "sparse v15", "sparse v19, v20").
int64_t f16_segment_queries(const LaunchParams& p) {
  if (g_segment_queries > 0) return g_segment_queries < p.T ? g_segment_queries : p.T;
  int device = 0, l2_bytes = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device) != cudaSuccess || l2_bytes <= 0)
    l2_bytes = 40 << 20;
  const int64_t per_query = p.Hq * kTileDim * static_cast<int64_t>(2 * sizeof(__half));
  int64_t seg = static_cast<int64_t>(l2_bytes) / per_query;
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

// chunked_v28, v29: log2 of the describe's threads per chunk: the chunks' mean item count
// (seg K / (per_item nc)) rounded up to a power of two, at most 32 (16K: 32; 128K: 4; 512K: 1).
int log2_describe_lanes(const LaunchParams& p, int64_t seg, int per_item) {
  const int64_t nc = p.T / p.S, mean = (seg * p.K + per_item * nc - 1) / (per_item * (nc > 0 ? nc : 1));
  int bits = 0;
  while (bits < 5 && (int64_t{1} << bits) < mean) ++bits;
  return bits;
}

// chunked_v29 on (v30, v35, v36): the describe (blocks [0, describe_blocks)) and the pair weights
// of segment 0 (queries [0, tn): the rest) in one launch of 256-thread blocks: both read only the
// count's and the scan's results, so the chunk kernel is the first to need them all; the pair
// weights as v30's records (no scatter). kChained: chunked_v35 (wait_previous_then_allow_next);
// kLaneSlots: chunked_v36 (pair_records_block).
template <int G, typename OSwa, bool kChained = false, bool kLaneSlots = false>
__global__ void __launch_bounds__(kReduceWarps * kWarp, 4)
    bucket_and_weights_kernel(DescribeArgs describe, unsigned describe_blocks, LaunchParams p, int64_t tn,
                              int64_t nc, const int32_t* selection, const float* selected_score, const OSwa* o_swa,
                              const float* lse_swa, const int32_t* rank, SegmentTables tables, __half* o16,
                              float* lse) {
  wait_previous_then_allow_next<kChained>();
  static_assert(kReduceWarps * kWarp == 256, "the describe runs 256-thread blocks");
  if (blockIdx.x < describe_blocks)
    describe_segment_items(static_cast<int64_t>(blockIdx.x) * 256 + threadIdx.x, describe);
  else if constexpr (kLaneSlots && G <= 8)
    pair_records_block<G, OSwa>(blockIdx.x - describe_blocks, p, 0, tn, nc, selection, selected_score, o_swa,
                                lse_swa, rank, tables, o16, lse);
  else
    pair_weights_block<G, OSwa, PairWeights::f16_records>(blockIdx.x - describe_blocks, p, 0, tn, nc, selection,
                                                          selected_score, o_swa, lse_swa, rank, tables, o16, lse);
}

// bucket_and_weights_kernel for segment 0's tn queries; kChained: chunked_v35; kLaneSlots: chunked_v36.
template <int G, bool kChained = false, bool kLaneSlots = false>
void launch_bucket_and_weights(const DescribeArgs& describe, unsigned describe_blocks, const LaunchParams& p,
                               int64_t tn, int64_t nc, const int32_t* selection, const float* selected_score,
                               const FusionRows& rows, const float* lse_swa, const int32_t* rank,
                               const SegmentTables& tables, __half* o16, float* lse, cudaStream_t stream) {
  const unsigned blocks = describe_blocks + static_cast<unsigned>((p.Hkv * tn + kReduceWarps - 1) / kReduceWarps);
  if constexpr (kChained) {
    if (rows.o_swa_type == RowType::f16)
      launch_programmatic(true, bucket_and_weights_kernel<G, __half, true, kLaneSlots>, dim3(blocks),
                          kReduceWarps * kWarp, 0, stream, describe, describe_blocks, p, tn, nc, selection,
                          selected_score, static_cast<const __half*>(rows.o_swa), lse_swa, rank, tables, o16, lse);
    else
      launch_programmatic(true, bucket_and_weights_kernel<G, float, true, kLaneSlots>, dim3(blocks),
                          kReduceWarps * kWarp, 0, stream, describe, describe_blocks, p, tn, nc, selection,
                          selected_score, static_cast<const float*>(rows.o_swa), lse_swa, rank, tables, o16, lse);
  } else if (rows.o_swa_type == RowType::f16)
    bucket_and_weights_kernel<G, __half><<<blocks, kReduceWarps * kWarp, 0, stream>>>(
        describe, describe_blocks, p, tn, nc, selection, selected_score, static_cast<const __half*>(rows.o_swa),
        lse_swa, rank, tables, o16, lse);
  else
    bucket_and_weights_kernel<G, float><<<blocks, kReduceWarps * kWarp, 0, stream>>>(
        describe, describe_blocks, p, tn, nc, selection, selected_score, static_cast<const float*>(rows.o_swa),
        lse_swa, rank, tables, o16, lse);
}

// The pairs of all query segments bucketed at once (one count with ranks, one scan launch with a
// block per segment, one describe), then per segment the pair weights (o16 started at the window
// term), the f16x2-reducing chunk kernel and o = o16. chunked_v21: the ranks counted per tile,
// the describe and a scatter of the pairs into buckets, the fp32 pair weights in bucket order,
// the mma.sync chunk kernel (chunk_attention_f16_kernel), segments of the whole L2.
// chunked_v30: the describe and segment 0's pair weights in one launch (bucket_and_weights_kernel,
// its descriptors written by several threads per chunk), each pair's bucket entry and fp16 weights
// in one record written by the weights kernel (no scatter, no bucket), the persistent wgmma chunk
// kernel, segments that split T evenly, the count's tiles shortened at short T, o16 converted 16
// bytes per thread (convert_discard_o16_kernel, o_swa and o of any RowType the API admits).
// chunked_v35: v30 with the kernels after the count chained by programmatic dependent launch;
// chunked_v36: v35 with pair_records_block where G <= 8 and K <= 32 (lane_slots), v35's weights
// elsewhere. Scratch: the ranks (4 bytes per pair), v21's buckets (4 bytes per pair), the counts
// and descriptors of every segment, the pair weights of one segment and o16.
// rows: o_swa and o as the caller handed them (fp32 for chunked_v21, launch_fuse_chunked).
template <int G>
void launch_bucketed_once_g(const LaunchParams& p, const int32_t* selection,
                            const float* selected_score, const FusionRows& rows, const float* lse_swa,
                            float* lse, SparseKernel kernel, cudaStream_t stream) {
  constexpr int kPairs = pairs_per_item<G>();
  const auto* o_swa = static_cast<const float*>(rows.o_swa);  // RowType::f32 for chunked_v21
  auto* o = static_cast<float*>(rows.o);                       // RowType::f32 for chunked_v21
  // chunked_v30, v35, v36: pair records, the persistent chunk kernel; v35, v36: chained.
  const bool records = kernel != SparseKernel::chunked_v21;
  const bool chained = kernel == SparseKernel::chunked_v35 || kernel == SparseKernel::chunked_v36;
  const bool lane_slots = kernel == SparseKernel::chunked_v36 && G <= 8 && p.K <= 32;
  const PairWeights weight_format = records ? PairWeights::f16_records : PairWeights::f32;
  const int64_t nc = p.T / p.S, n_ch = p.Hkv * nc;
  const int64_t seg = records ? balanced_segment_queries(p, f16_segment_queries(p)) : f16_segment_queries(p);
  // The ranks counted per tile of queries in shared memory (where the group's chunks' histogram fits).
  const bool tiled_count = nc <= kCountMaxChunks;
  const int64_t n_seg = (p.T + seg - 1) / seg;
  const int64_t n_pairs = p.Hkv * p.T * p.K, bucket_stride = p.Hkv * seg * p.K;
  const int64_t max_items = (bucket_stride + kPairs - 1) / kPairs + n_ch;
  const size_t counts_bytes = round_up(static_cast<size_t>(n_seg * (n_ch + 1)) * sizeof(int32_t));
  // The persistent chunk kernel's item cursor per segment, zeroed with the counts (one memset).
  const size_t cursor_bytes = records ? round_up(static_cast<size_t>(n_seg) * sizeof(int32_t)) : 0;
  const size_t rank_bytes = round_up(static_cast<size_t>(n_pairs) * sizeof(int32_t));
  const size_t bucket_bytes =
      records ? 0 : round_up(static_cast<size_t>(n_seg * bucket_stride) * sizeof(uint32_t));
  const size_t desc_bytes = round_up(static_cast<size_t>(n_seg * max_items) * sizeof(ItemDesc));
  // The segment's pair weights [bucket_stride, G] (v21) or records, in 32-bit words per pair
  // (counted as floats below), then o in fp16 [Hq, T, 64].
  const int64_t pair_weight_stride = bucket_stride * pair_weight_words<G>(weight_format);
  const size_t weights_bytes = round_up(static_cast<size_t>(pair_weight_stride) * sizeof(float));
  const size_t partial_bytes =
      weights_bytes + round_up(static_cast<size_t>(p.Hq * p.T * kTileDim) * sizeof(__half));
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
  auto* item_cursor = reinterpret_cast<int32_t*>(take(cursor_bytes));
  auto* offsets = reinterpret_cast<int32_t*>(take(counts_bytes));
  auto* items = reinterpret_cast<int32_t*>(take(counts_bytes));
  auto* rank = reinterpret_cast<int32_t*>(take(rank_bytes));
  auto* bucket = reinterpret_cast<uint32_t*>(take(bucket_bytes));
  auto* item_desc = reinterpret_cast<ItemDesc*>(take(desc_bytes));
  auto* partial = reinterpret_cast<__half*>(take(partial_bytes));
  auto* pair_weight = reinterpret_cast<float*>(partial);  // one segment's at a time
  auto* o16 = reinterpret_cast<__half*>(reinterpret_cast<char*>(partial) + weights_bytes);
  const auto weight_blocks = [&](int64_t tn) {
    return static_cast<unsigned>((p.Hkv * tn + kReduceWarps - 1) / kReduceWarps);
  };
  const auto segment_tables = [&](int64_t t0) {
    return SegmentTables{seg, offsets + t0 / seg * (n_ch + 1), n_ch + 1, pair_weight, pair_weight_stride};
  };
  if (n_ch > 0 && n_pairs > 0) {
    cudaMemsetAsync(counts, 0, counts_bytes + cursor_bytes, stream);  // the cursors follow the counts
    // Blocks past a segment's item count read a descriptor before they know it: never stale bytes
    // (the persistent chunk kernel reads only the descriptors of items that exist).
    if (!records) cudaMemsetAsync(item_desc, 0, desc_bytes, stream);
    const auto TK = static_cast<uint32_t>(p.T * p.K), K = static_cast<uint32_t>(p.K);
    const auto seg32 = static_cast<uint32_t>(seg), nc32 = static_cast<uint32_t>(nc);
    const auto n_ch32 = static_cast<uint32_t>(n_ch), n_pairs32 = static_cast<uint32_t>(n_pairs);
    const auto blocks = static_cast<unsigned>((n_pairs + 255) / 256);
    if (tiled_count) {
      const uint32_t tile_queries = records ? short_count_tile_queries(p, seg, n_seg) : count_tile_queries(K);
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
                                records ? log2_describe_lanes(p, seg, kPairs) : 0, item_desc};
    const auto describe_blocks =
        static_cast<unsigned>(((n_seg * n_ch << describe.log2_lanes) + 255) / 256);
    if (records) {  // with segment 0's pair weights, no scatter
      (lane_slots ? launch_bucket_and_weights<G, true, true>
       : chained  ? launch_bucket_and_weights<G, true>
                  : launch_bucket_and_weights<G>)(describe, describe_blocks, p, seg < p.T ? seg : p.T, nc,
                                                  selection, selected_score, rows, lse_swa, rank,
                                                  segment_tables(0), o16, lse, stream);
    } else {
      describe_segment_items_kernel<<<describe_blocks, 256, 0, stream>>>(describe);
      const ScatterArgs scatter{selection, rank, TK, K, seg32, nc32, n_ch32, n_pairs32, offsets, bucket_stride,
                                bucket};
      scatter_ranked_pairs_kernel<<<blocks, 256, 0, stream>>>(scatter);
    }
  }
  const auto launch_pair_weights = [&](int64_t t0, int64_t tn) {
    const auto group_blocks = weight_blocks(tn);
    const SegmentTables tables = segment_tables(t0);
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
      if (rows.o_swa_type == RowType::f16)
        launch_programmatic(true, fusion_pair_weights_kernel<G, __half, PairWeights::f16_records, true>,
                            dim3(group_blocks), kReduceWarps * kWarp, 0, stream, p, t0, tn, nc, selection,
                            selected_score, static_cast<const __half*>(rows.o_swa), lse_swa, rank, tables, o16, lse);
      else
        launch_programmatic(true, fusion_pair_weights_kernel<G, float, PairWeights::f16_records, true>,
                            dim3(group_blocks), kReduceWarps * kWarp, 0, stream, p, t0, tn, nc, selection,
                            selected_score, o_swa, lse_swa, rank, tables, o16, lse);
    } else if (rows.o_swa_type == RowType::f16) {  // chunked_v30 (fusion_rows_apply)
      fusion_pair_weights_kernel<G, __half, PairWeights::f16_records>
          <<<group_blocks, kReduceWarps * kWarp, 0, stream>>>(p, t0, tn, nc, selection, selected_score,
                                                             static_cast<const __half*>(rows.o_swa), lse_swa,
                                                             rank, tables, o16, lse);
    } else if (records) {
      fusion_pair_weights_kernel<G, float, PairWeights::f16_records>
          <<<group_blocks, kReduceWarps * kWarp, 0, stream>>>(p, t0, tn, nc, selection, selected_score, o_swa,
                                                             lse_swa, rank, tables, o16, lse);
    } else {
      fusion_pair_weights_kernel<G><<<group_blocks, kReduceWarps * kWarp, 0, stream>>>(
          p, t0, tn, nc, selection, selected_score, o_swa, lse_swa, rank, tables, o16, lse);
    }
  };
  for (int64_t s = 0; s < n_seg; ++s) {
    const int64_t t0 = s * seg, tn = p.T - t0 < seg ? p.T - t0 : seg;
    // Segment 0's weights of chunked_v30-v36 came with the descriptors above.
    if (!(records && s == 0)) launch_pair_weights(t0, tn);
    if (n_ch > 0 && n_pairs > 0) {
      const auto grid = static_cast<unsigned>((p.Hkv * tn * p.K + kPairs - 1) / kPairs + n_ch);
      constexpr int kBytes = kWarpsPerBlock * 2 * 16 * kTilePitch * sizeof(__nv_bfloat16);
      // The segment's pair records in place of the bucket.
      const auto* pair_records = reinterpret_cast<const uint32_t*>(pair_weight);
      if (chained)
        launch_chunk_persistent<G, true>(grid, stream, p, t0, seg, nc, items + s * (n_ch + 1),
                                         item_desc + s * max_items, pair_records, o16, item_cursor + s);
      else if (records)
        launch_chunk_persistent<G>(grid, stream, p, t0, seg, nc, items + s * (n_ch + 1), item_desc + s * max_items,
                                   pair_records, o16, item_cursor + s);
      else
        chunk_attention_f16_kernel<G><<<grid, kPackedThreads, kBytes, stream>>>(
            p, t0, seg, nc, items + s * (n_ch + 1), item_desc + s * max_items, bucket + s * bucket_stride,
            pair_weight, o16);
    }
    if (records) {
      const auto blocks8 = static_cast<unsigned>((p.Hq * tn * kTileDim / 8 + 255) / 256);
      if (chained && rows.o_type == RowType::bf16)
        launch_programmatic(true, convert_discard_o16_kernel<__nv_bfloat16, true>, dim3(blocks8), 256, 0, stream,
                            p, t0, tn, o16, static_cast<__nv_bfloat16*>(rows.o));
      else if (chained)
        launch_programmatic(true, convert_discard_o16_kernel<float, true>, dim3(blocks8), 256, 0, stream, p, t0,
                            tn, o16, o);
      else if (rows.o_type == RowType::bf16)
        convert_discard_o16_kernel<<<blocks8, 256, 0, stream>>>(p, t0, tn, o16, static_cast<__nv_bfloat16*>(rows.o));
      else
        convert_discard_o16_kernel<<<blocks8, 256, 0, stream>>>(p, t0, tn, o16, o);
    } else {
      const int64_t halves2 = p.Hq * tn * kTileDim / 2;
      convert_o16_kernel<<<static_cast<unsigned>((halves2 + 255) / 256), 256, 0, stream>>>(p, t0, tn, o16, o);
    }
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

bool fusion_rows_apply(SparseKernel kernel) { return kernel != SparseKernel::chunked_v21; }

void launch_fuse_chunked(const LaunchParams& p, const int32_t* selection,
                         const float* selected_score, const FusionRows& rows, const float* lse_swa,
                         float* lse, cudaStream_t stream) {
  const SparseKernel kernel = sparse_kernel();
  if (uses_wgmma(kernel) && !wgmma_runs_on_current_device())
    refuse_wgmma_kernel("sparse_kernel", sparse_kernel_name(kernel), "chunked_v21, the default here");
  switch (p.Hq / p.Hkv) {
    case 1: return launch_bucketed_once_g<1>(p, selection, selected_score, rows, lse_swa, lse, kernel, stream);
    case 2: return launch_bucketed_once_g<2>(p, selection, selected_score, rows, lse_swa, lse, kernel, stream);
    case 4: return launch_bucketed_once_g<4>(p, selection, selected_score, rows, lse_swa, lse, kernel, stream);
    case 8: return launch_bucketed_once_g<8>(p, selection, selected_score, rows, lse_swa, lse, kernel, stream);
    default: return launch_bucketed_once_g<16>(p, selection, selected_score, rows, lse_swa, lse, kernel, stream);
  }
}

}  // namespace hils::gpu::detail
