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
//
// The stage's device code is under gpu/src/sparse_chunked/ in the stage's order (gpu/NOTES.md
// "select_packed.cu and sparse_chunked.cu split (session 19)"): common.cuh (formats, item
// descriptors, the chained launches' wait), buckets.cuh (count, scan, describe, scatter),
// weights.cuh (the pair weights), chunks.cuh (the chunk kernels), convert.cuh (o = o16); this unit
// holds their launch code (launch_fuse_chunked, launch_bucketed_once_g) and the stage's settings.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "launch_params.hpp"
#include "scratch_pool.hpp"
#include "mma_common.cuh"
#include "wgmma_common.cuh"

// The stage's headers in stage order (each includes those it builds on).
#include "sparse_chunked/common.cuh"
#include "sparse_chunked/buckets.cuh"
#include "sparse_chunked/weights.cuh"
#include "sparse_chunked/chunks.cuh"
#include "sparse_chunked/convert.cuh"

namespace hils::gpu::detail {
namespace {

int64_t g_segment_queries = 0;  // 0: choose from the L2 size
std::optional<SparseKernel> g_sparse_kernel;  // nullopt: default_sparse_kernel() at each call

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
  // Segment 0's weights of chunked_v30-v36 came with the descriptors above, which run only where
  // there are chunks: with none (T < S) its weights kernel, which starts o16 and lse at the window
  // term, runs here as every other segment's does (before session 21 nothing wrote segment 0's
  // o16 and lse then, and o and lse were whatever the scratch and the output held; gpu/NOTES.md
  // "Careless-user audit (session 21)").
  const bool weights_with_descriptors = records && n_ch > 0 && n_pairs > 0;
  for (int64_t s = 0; s < n_seg; ++s) {
    const int64_t t0 = s * seg, tn = p.T - t0 < seg ? p.T - t0 : seg;
    if (!(weights_with_descriptors && s == 0)) launch_pair_weights(t0, tn);
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