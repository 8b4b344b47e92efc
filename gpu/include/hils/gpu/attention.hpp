// Host API of the CUDA kernels: the reference's stage names (window -> summarize -> score ->
// select -> fuse) on device pointers, with the reference's MechanismSpec (reference/SEMANTICS.md
// §2–5). C++17 and free of Eigen so that nvcc and plain C++ callers both include it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <optional>

#include "hils/spec.hpp"

namespace hils::gpu {

// Element type of q, k, v, q~ and the prior; arithmetic is always fp32.
enum class DType { f32, bf16 };

// One layer's shapes. Query head h reads KV head h / G, G = Hq / Hkv.
struct Shape {
  int64_t T = 0, Hq = 0, Hkv = 0, d = 0, dv = 0;
};

// Device pointers, head-major and contiguous: q [Hq, T, d], k [Hkv, T, d], v [Hkv, T, dv].
struct DeviceInputs {
  DType dtype = DType::f32;
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const void* q_retrieval = nullptr;  // [Hq, T, d]; nullptr means q~ = q
  const void* prior = nullptr;        // PriorRule shared/given: [Hq, prior_rows, d]
  int64_t prior_rows = 0;             // 1 (one shared row per head) or n_chunks
};

// Device outputs of a whole mechanism (fp32 / int32). Null pointers are skipped where marked.
struct DeviceOutputs {
  float* o = nullptr;             // [Hq, T, dv]
  float* lse = nullptr;           // [Hq, T]
  float* o_window = nullptr;      // [Hq, T, dv], optional
  float* lse_window = nullptr;    // [Hq, T], optional
  int32_t* selection = nullptr;   // [Hkv, T, K], optional
  float* surrogate = nullptr;     // [Hq, T, n_chunks], optional (-inf outside V(t))
  float* summary_key = nullptr;   // [Hq, n_chunks, d], optional
  float* summary_bias = nullptr;  // [Hq, n_chunks], optional
  float* exact = nullptr;         // [Hq, T, n_chunks], optional (-inf outside V(t))
};

// Complete chunks floor(T / S).
int64_t n_chunks(const MechanismSpec& spec, int64_t T);
// Logit scale sigma: spec.scale, or 1/sqrt(d) when 0.
float logit_scale(const MechanismSpec& spec, int64_t d);
// Throws std::invalid_argument naming the first bad field (shapes, spec, pointers).
void validate(const MechanismSpec& spec, const Shape& shape, const DeviceInputs& in);

// Use the packed tensor-core kernels where they apply (bf16, d = dv = S = 64, G | 16): on by
// default; off runs the SIMT kernels everywhere (tests compare both with the reference).
void set_packed_kernels(bool enabled);
bool packed_kernels();
// Queries per segment of the chunk-major sparse stage (packed shapes): 0 (default) sizes it from
// a 1 GiB budget of fp16 partials (chunked_v4, v6, v7, v8) or from the L2 size (atomic_v5); tests set
// small values to cover several segments.
void set_sparse_segment_queries(int64_t queries);
// Which chunk-major sparse stage runs on the packed shapes (gpu/NOTES.md has each version's
// numbers); process-wide like set_packed_kernels. All compute the same fusion (Eq. 10).
enum class SparseKernel {
  chunked_v4,  // fp16 intra-chunk outputs o_c in a scratch, then a reduce per (query, head)
  atomic_v5,   // fusion weights first, then w_c * o_c added into o in fp32 (no scratch, no
               // reduce; o's last bits vary from run to run with the order of the additions)
  chunked_v6,  // chunked_v4 with fewer instructions per 16-row slice (softmax in base 2)
  chunked_v7,  // chunked_v6 with two slices per warp step (each K/V fragment serves both);
               // the same arithmetic per row as chunked_v6, so the same bits
  chunked_v8,  // chunked_v6's chunk kernel with the pairs bucketed once per call (all query
               // segments in one count, scan and scatter): the same bits as chunked_v6
  chunked_v9,  // chunked_v8 with the chunk kernel on wgmma (sm_90a): 64-row steps, q, K and V
               // read by the tensor cores from swizzled shared memory
  chunked_v10,  // chunked_v8's bucketing, fusion weights first, then the chunk kernel adds
                // w_c o_c into an fp16 copy of o by f16x2 vector reductions (no scratch of
                // partials, no reduce); o's last bits vary from run to run (fp16 sums)
  chunked_v11,  // chunked_v10 with each row's fusion weight formed before the chunk kernel and
                // stored in bucket order (read in order instead of two scattered loads per row)
  chunked_v12,  // chunked_v11 with chunked_v9's chunk kernel (wgmma, sm_90a)
  chunked_v13,  // chunked_v12 with the pair-weights kernel's loads of the group's G heads
                // issued before their arithmetic (the same values)
  chunked_v14,  // chunked_v13 with one 128-byte bulk reduction (TMA) per row instead of eight
                // 16-byte f16x2 reductions (sm_90a)
  chunked_v15,  // chunked_v13 with the pair-weights kernel's o_swa rows split over half-warps
                // (fewer registers, more warps per SM; the same values) and query segments of
                // 3/4 of the L2 instead of 1/2
  chunked_v16,  // chunked_v11 (no wgmma) with chunked_v15's pair-weights kernel and query
                // segments of 3/4 of the L2
  chunked_v17,  // chunked_v15 with the pair weights of every query segment formed in one
                // launch before the first chunk kernel (the same values)
  chunked_v18,  // chunked_v15 with the segment's fp16 o laid out [queries, Hq, 64], so that a
                // pair's G heads are reduced into adjacent rows
  chunked_v19,  // chunked_v15 with the pairs' ranks counted per tile of queries in shared
                // memory (a global atomic per tile and chunk, not per pair) and query segments
                // of the whole L2
  chunked_v20,  // chunked_v19 with segment s + 1's weights kernel started in the last wave of
                // segment s's chunk kernel and s + 1's chunk kernel in the last wave of s's
                // o16 -> o conversion (programmatic dependent launch; the same values)
  chunked_v21,  // chunked_v16 (no wgmma) with chunked_v19's count per tile and segments
  chunked_v22,  // chunked_v19 with segment s + 1's weights kernel and segment s's o16 -> o
                // conversion in one launch (the same values)
  chunked_v23,  // chunked_v19 with each pair's bucket entry written by the pair-weights kernel
                // (which forms its bucket position anyway) instead of a scatter launch over
                // every pair (the same buckets, so the same values)
  chunked_v24,  // chunked_v23 with the o16 -> o conversion reading 16 bytes per thread and
                // discarding the o16 lines it has read from the L2 (no write-back of dead
                // lines; the same values)
  chunked_v25,  // chunked_v19 (its scatter launch) with chunked_v24's o16 -> o conversion
  chunked_v26,  // chunked_v25 with a persistent chunk kernel (as many blocks as are resident,
                // each taking items from a cursor: no block per item bound, no launch per item),
                // segments that split T evenly, the count's tiles shortened at short T (the same
                // values)
  chunked_v27,  // chunked_v26 with the q rows fetched two 64-row steps ahead (three stages)
  chunked_v28,  // chunked_v26 with the item descriptors written by several threads per chunk
  chunked_v29,  // chunked_v28 with the descriptors, the scatter and the first segment's pair
                // weights in one launch
  chunked_v30,  // chunked_v29 with each pair's bucket entry and weights (fp16) in one record
                // written by the weights kernel (no scatter)
  chunked_v31,  // chunked_v29 with the pair weights in fp16
  chunked_v32,  // chunked_v30 with the fp16 weights alone, the pair's query in their spare bits
                // (G a multiple of 8; v30's records elsewhere)
  chunked_v35,  // chunked_v30 with its kernels chained by programmatic dependent launch (each
                // launched while the previous one finishes, waiting for it on the device)
  chunked_v36,  // chunked_v35 with the pair weights formed by lanes that each hold one head's
                // scores of G slots (G <= 8, K <= 32; v35's elsewhere): the same values
};
// Every SparseKernel, in the order of their values.
constexpr SparseKernel kSparseKernels[] = {SparseKernel::chunked_v4, SparseKernel::atomic_v5,
                                           SparseKernel::chunked_v6, SparseKernel::chunked_v7,
                                           SparseKernel::chunked_v8, SparseKernel::chunked_v9,
                                           SparseKernel::chunked_v10, SparseKernel::chunked_v11,
                                           SparseKernel::chunked_v12, SparseKernel::chunked_v13,
                                           SparseKernel::chunked_v14, SparseKernel::chunked_v15,
                                           SparseKernel::chunked_v16, SparseKernel::chunked_v17,
                                           SparseKernel::chunked_v18, SparseKernel::chunked_v19,
                                           SparseKernel::chunked_v20, SparseKernel::chunked_v21,
                                           SparseKernel::chunked_v22, SparseKernel::chunked_v23,
                                           SparseKernel::chunked_v24, SparseKernel::chunked_v25,
                                           SparseKernel::chunked_v26, SparseKernel::chunked_v27,
                                           SparseKernel::chunked_v28, SparseKernel::chunked_v29,
                                           SparseKernel::chunked_v30, SparseKernel::chunked_v31,
                                           SparseKernel::chunked_v32, SparseKernel::chunked_v35,
                                           SparseKernel::chunked_v36};
// The kernel's name as above ("chunked_v4", ...).
const char* sparse_kernel_name(SparseKernel kernel);
// Whether the sparse stage runs wgmma (sm_90a; wgmma_available below). Every kernel is listed,
// so that a new one cannot be left out (-Wswitch).
constexpr bool uses_wgmma(SparseKernel kernel) {
  switch (kernel) {
    case SparseKernel::chunked_v4:
    case SparseKernel::atomic_v5:
    case SparseKernel::chunked_v6:
    case SparseKernel::chunked_v7:
    case SparseKernel::chunked_v8:
    case SparseKernel::chunked_v10:
    case SparseKernel::chunked_v11:
    case SparseKernel::chunked_v16:
    case SparseKernel::chunked_v21: return false;
    case SparseKernel::chunked_v9:
    case SparseKernel::chunked_v12:
    case SparseKernel::chunked_v13:
    case SparseKernel::chunked_v14:
    case SparseKernel::chunked_v15:
    case SparseKernel::chunked_v17:
    case SparseKernel::chunked_v18:
    case SparseKernel::chunked_v19:
    case SparseKernel::chunked_v20:
    case SparseKernel::chunked_v22:
    case SparseKernel::chunked_v23:
    case SparseKernel::chunked_v24:
    case SparseKernel::chunked_v25:
    case SparseKernel::chunked_v26:
    case SparseKernel::chunked_v27:
    case SparseKernel::chunked_v28:
    case SparseKernel::chunked_v29:
    case SparseKernel::chunked_v30:
    case SparseKernel::chunked_v31:
    case SparseKernel::chunked_v32:
    case SparseKernel::chunked_v35:
    case SparseKernel::chunked_v36: return true;
  }
  return true;
}
// The default sparse stage where wgmma can run (wgmma_available, below): chunked_v36 (v35 with a
// pair-weights kernel whose lanes hold (head, G slots), the same values; v35 is v30 with its
// kernels chained by programmatic dependent launch; v30 is v29 with each pair's bucket entry and
// fp16 weights in one record from the weights kernel, no scatter; v29 is v25's arithmetic with
// the persistent chunk kernel, even segments and fewer, shorter launches at short T; it also
// takes fuse_rows' fp16 o_swa and bf16 o).
constexpr SparseKernel kDefaultSparseKernel = SparseKernel::chunked_v36;
// The sparse stage without wgmma where wgmma cannot run: chunked_v21 (v19's weights kernel,
// count and segments with v6's mma.sync chunk kernel).
constexpr SparseKernel kSparseKernelWithoutWgmma = SparseKernel::chunked_v21;
// kDefaultSparseKernel where wgmma_available(), else kSparseKernelWithoutWgmma.
SparseKernel default_sparse_kernel();
// The sparse stage of the following calls, process-wide: a named kernel (refused when it would
// run, if it needs wgmma where wgmma cannot run), or std::nullopt (the start value) for
// default_sparse_kernel() at each call.
void set_sparse_kernel(std::optional<SparseKernel> kernel);
// The sparse stage that runs now: the one set, else default_sparse_kernel().
SparseKernel sparse_kernel();

// Which packed window kernel window_attention runs on the packed shapes (gpu/NOTES.md has each
// version's numbers); process-wide like set_sparse_kernel. Both compute the window branch of
// reference/SEMANTICS.md §2.
enum class WindowKernel {
  mma_v4,   // 64 rows (M = 64 / G queries x G heads) per block, the element mask on every tile
  mma_v9,   // 128 rows per block, the mask only on tiles that cut a row's window, base-2 softmax
  mma_v10,  // mma_v9 with 64 rows (4 warps) per block, 4 blocks per SM
  wgmma_v11,  // mma_v9's block as two warpgroups issuing wgmma m64n64k16 (sm_90a)
  wgmma_v12,  // wgmma_v11 with fewer instructions per tile (copies, descriptors, exponentials)
  wgmma_v13,  // wgmma_v12 with running copy sources and descriptor low words worked out once
  wgmma_v14,  // wgmma_v13 with tile i-1's P V under tile i's softmax (FA3's intra-warpgroup overlap)
  wgmma_v15,  // wgmma_v14 with the K/V copies two tiles ahead instead of one
  wgmma_v16,  // wgmma_v15 with tile i-1's P V issued after tile i's masks
  wgmma_v17,  // wgmma_v13's step (no overlap) with wgmma_v15's copies two tiles ahead
  wgmma_v18,  // wgmma_v17 with the K/V tiles copied by the tensor memory accelerator (TMA)
  wgmma_v19,  // wgmma_v18 with a lazy maximum (raised when passed by 2^8) and tree maxima
  wgmma_v20,  // wgmma_v19 with per-stage "empty" mbarriers instead of a block barrier per tile
};
// Every WindowKernel, in the order of their values.
constexpr WindowKernel kWindowKernels[] = {WindowKernel::mma_v4, WindowKernel::mma_v9,
                                           WindowKernel::mma_v10, WindowKernel::wgmma_v11,
                                           WindowKernel::wgmma_v12, WindowKernel::wgmma_v13,
                                           WindowKernel::wgmma_v14, WindowKernel::wgmma_v15,
                                           WindowKernel::wgmma_v16, WindowKernel::wgmma_v17,
                                           WindowKernel::wgmma_v18, WindowKernel::wgmma_v19,
                                           WindowKernel::wgmma_v20};
// The kernel's name as above ("mma_v4", ...).
const char* window_kernel_name(WindowKernel kernel);
// Whether the kernel runs wgmma (sm_90a; wgmma_available below). Every kernel is listed, so
// that a new one cannot be left out (-Wswitch).
constexpr bool uses_wgmma(WindowKernel kernel) {
  switch (kernel) {
    case WindowKernel::mma_v4:
    case WindowKernel::mma_v9:
    case WindowKernel::mma_v10: return false;
    case WindowKernel::wgmma_v11:
    case WindowKernel::wgmma_v12:
    case WindowKernel::wgmma_v13:
    case WindowKernel::wgmma_v14:
    case WindowKernel::wgmma_v15:
    case WindowKernel::wgmma_v16:
    case WindowKernel::wgmma_v17:
    case WindowKernel::wgmma_v18:
    case WindowKernel::wgmma_v19:
    case WindowKernel::wgmma_v20: return true;
  }
  return true;
}
constexpr WindowKernel kDefaultWindowKernel = WindowKernel::wgmma_v20;
// The window kernel without wgmma where wgmma cannot run (wgmma_available).
constexpr WindowKernel kWindowKernelWithoutWgmma = WindowKernel::mma_v9;
// kDefaultWindowKernel where wgmma_available(), else kWindowKernelWithoutWgmma.
WindowKernel default_window_kernel();
// std::nullopt (the state at start): default_window_kernel(). A wgmma kernel named here is
// refused by window_attention where wgmma cannot run (wgmma_available).
void set_window_kernel(std::optional<WindowKernel> kernel);
// The kernel that window_attention runs now: the one set, else default_window_kernel().
WindowKernel window_kernel();

// ---- Stages, each callable alone --------------------------------------------------------

// Window branch (reference/SEMANTICS.md §2): o_swa [Hq, T, dv], lse_swa [Hq, T].
void window_attention(const MechanismSpec& spec, const Shape& shape, const DeviceInputs& in,
                      float* o_swa, float* lse_swa, cudaStream_t stream = nullptr);
// Element type of a row block [Hq, T, dv] handed between stages: fp32 (fuse's, the API's), fp16,
// or bf16 (the type SDPA returns o in for bf16 inputs).
enum class RowType { f32, f16, bf16 };
// window_attention with o_swa stored as o_swa_type: f32, or f16 (the fp32 value rounded to
// nearest; the packed window kernels from mma_v9 on, for fuse_rows): half the bytes. Elsewhere,
// and for bf16, std::invalid_argument names the field.
void window_attention_rows(const MechanismSpec& spec, const Shape& shape, const DeviceInputs& in,
                           void* o_swa, RowType o_swa_type, float* lse_swa,
                           cudaStream_t stream = nullptr);
// Full causal attention over every attendable j <= t: o [Hq, T, dv], lse [Hq, T].
void full_attention(const MechanismSpec& spec, const Shape& shape, const DeviceInputs& in,
                    float* o, float* lse, cudaStream_t stream = nullptr);
// Exact chunk log-masses L(t,c) for c in V(t), -inf elsewhere: [Hq, T, n_chunks].
void exact_chunk_log_mass(const MechanismSpec& spec, const Shape& shape,
                          const DeviceInputs& in, float* exact, cudaStream_t stream = nullptr);
// Chunk summaries (reference/SEMANTICS.md §3): key [Hq, n_chunks, d], bias [Hq, n_chunks].
// Not for exact.
void summarize(const MechanismSpec& spec, const Shape& shape, const DeviceInputs& in,
               float* key, float* bias, cudaStream_t stream = nullptr);
// Surrogate scores s_hat = sigma q~ . k' + b' for c in V(t), -inf elsewhere: [Hq, T, n_chunks].
void surrogate_scores(const MechanismSpec& spec, const Shape& shape, const DeviceInputs& in,
                      const float* key, const float* bias, float* scores,
                      cudaStream_t stream = nullptr);
// Which packed selection kernel runs (gpu/NOTES.md has each version's numbers). All but
// two_pass_v18, two_pass_v19 and two_pass_v25 give the same selection
// (selections_identical_to_v8); those three may differ at near ties, within the oracle's margin.
// All but those and two_pass_v20 to two_pass_v22 give the same selected scores (v25 v22's scores
// of its own selection); v20 to v22 sum them from the bf16 k' the ranking
// scored. two_pass_v22 is the default (kDefaultSelectKernel): v16 (v10, i.e. v8 scored by wgmma on
// sm_90a with 128 queries per block, pass 2's per-step overhead trimmed (v12), two k' tiles per
// pass-1 step (v15) and pass 2's copy state in 32 bits) with the selected scores by a kernel of
// their own (v17) that reads the bf16 k' rows (v20) and sums them in fewer instructions (v21, v22:
// v20's bytes; gpu/NOTES.md v21, v22); v4 to v21 stay reachable as the benchmark's comparison points.
// one_pass_v5 applies to the default group rule (max_normalized); for the others it falls back
// to two_pass_v4. v6 and v8 form their bounds for K <= 32 and the normalised group rules; v6 runs
// as v4 otherwise, v8 takes K <= 32 (else two_pass_v4), and so do v9 to v22.
enum class SelectKernel {
  two_pass_v4,  // pass 1: log Z_hat per head; pass 2: group scores offered to the top-K lists
  one_pass_v5,  // per head a running log Z_hat and its K best; the union ranked at the end
  two_pass_v6,  // v4 plus a pass-1 lower bound of the K-th group score that prunes the offers
  two_pass_v7,  // v4 with the offers of 8 rows at once per warp into unsorted sets (K <= 32,
                // else two_pass_v4)
  two_pass_v8,  // v6's bound over 64 slots, candidates appended to per-row buffers (no ranking
                // in pass 2; K <= 32, else two_pass_v4)
  two_pass_v9,  // v8 with the scoring on wgmma (sm_90a; K <= 32, else two_pass_v4)
  two_pass_v10,  // v9 with 128 queries per block and pass 2's q~ staged in shared memory
  two_pass_v11,  // v10 with the selected-score writer's loads one unit ahead (K <= 32, else
                 // two_pass_v4)
  two_pass_v12,  // v11 with pass 2's per-step copies, descriptors and resets trimmed
  two_pass_v13,  // v12 with pass 2 head-major for max_normalized: each head appends its own
                 // values above the bound, q~ staged once per head (K <= 32, else two_pass_v4)
  two_pass_v14,  // v13 with two k' tiles per pass-1 step
  two_pass_v15,  // v12 with two k' tiles per pass-1 step
  two_pass_v16,  // v15 with pass 2's copy state in 32 bits (no spills)
  two_pass_v17,  // v16 with the selected scores by a kernel of their own (more warps per SM)
  two_pass_v18,  // v16 with pass 1's mass summed without a running maximum (NOT the same bits as
                 // v8: log Z_hat differs in its last bits; H100 512K -1% against v16, not faster
                 // at 16K-128K; gpu/NOTES.md v18)
  two_pass_v19,  // v18 with one pass-1 exponential in eight on the FMA pipe (a polynomial)
  two_pass_v20,  // v17 with the selected scores summed from the bf16 k' rows the ranking scored
                 // (half the writer's bytes): v16's selections, scores NOT v8's bits (they differ
                 // by k''s bf16 rounding; gpu/NOTES.md v20)
  two_pass_v21,  // v20 with its scores kernel's sums in fewer instructions (entries read once per
                 // query, one reduce-scatter per head): v20's selections and scores bit for bit
  two_pass_v22,  // v21 with the scores kernel's loads untested and 4 blocks per SM: v20's bytes
  two_pass_v25,  // v22 with pass 2's bias and log Z_hat as a fifth wgmma k-step (max_normalized):
                 // NOT v8's bits (group scores rounded otherwise; pass 1's bound taken with a
                 // margin); v22 at 16 heads per group (shared memory); gpu/NOTES.md v25
};
// Every SelectKernel, in the order of their values.
constexpr SelectKernel kSelectKernels[] = {
    SelectKernel::two_pass_v4, SelectKernel::one_pass_v5,  SelectKernel::two_pass_v6,
    SelectKernel::two_pass_v7, SelectKernel::two_pass_v8,  SelectKernel::two_pass_v9,
    SelectKernel::two_pass_v10, SelectKernel::two_pass_v11, SelectKernel::two_pass_v12,
    SelectKernel::two_pass_v13, SelectKernel::two_pass_v14, SelectKernel::two_pass_v15,
    SelectKernel::two_pass_v16, SelectKernel::two_pass_v17, SelectKernel::two_pass_v18,
    SelectKernel::two_pass_v19, SelectKernel::two_pass_v20, SelectKernel::two_pass_v21,
    SelectKernel::two_pass_v22, SelectKernel::two_pass_v25};
constexpr SelectKernel kDefaultSelectKernel = SelectKernel::two_pass_v22;
// The selection without wgmma where wgmma cannot run (wgmma_available).
constexpr SelectKernel kSelectKernelWithoutWgmma = SelectKernel::two_pass_v8;
// The kernel's name as above ("two_pass_v12", ...).
const char* select_kernel_name(SelectKernel kernel);
// Whether the kernel runs wgmma (sm_90a): two_pass_v9 and later. Every kernel is listed, so
// that a new one cannot be left out (-Wswitch).
constexpr bool uses_wgmma(SelectKernel kernel) {
  switch (kernel) {
    case SelectKernel::two_pass_v4:
    case SelectKernel::one_pass_v5:
    case SelectKernel::two_pass_v6:
    case SelectKernel::two_pass_v7:
    case SelectKernel::two_pass_v8: return false;
    case SelectKernel::two_pass_v9:
    case SelectKernel::two_pass_v10:
    case SelectKernel::two_pass_v11:
    case SelectKernel::two_pass_v12:
    case SelectKernel::two_pass_v13:
    case SelectKernel::two_pass_v14:
    case SelectKernel::two_pass_v15:
    case SelectKernel::two_pass_v16:
    case SelectKernel::two_pass_v17:
    case SelectKernel::two_pass_v18:
    case SelectKernel::two_pass_v19:
    case SelectKernel::two_pass_v20:
    case SelectKernel::two_pass_v21:
    case SelectKernel::two_pass_v22:
    case SelectKernel::two_pass_v25: return true;
  }
  return true;
}

// Whether the kernel's selections equal v8's bit for bit by construction: every kernel but
// two_pass_v18, two_pass_v19 and two_pass_v25 (the selected scores of two_pass_v20 to
// two_pass_v22 differ from v8's; see above).
constexpr bool selections_identical_to_v8(SelectKernel kernel) {
  return kernel != SelectKernel::two_pass_v18 && kernel != SelectKernel::two_pass_v19 &&
         kernel != SelectKernel::two_pass_v25;
}

// Whether the wgmma kernels (uses_wgmma: selections from two_pass_v9, sparse stages such as
// chunked_v9, window kernels from wgmma_v11) can run on the current GPU with this build: its
// code for the GPU must be sm_90a (HILS_CUDA_ARCHITECTURES=90a and an sm_90 GPU). Probed once
// per device, at the first call, by a one-thread kernel and a copy on the default stream (a
// program that captures CUDA graphs makes one call before capturing). Where they cannot run,
// the default selection is kSelectKernelWithoutWgmma (default_select_kernel), the default sparse stage
// kSparseKernelWithoutWgmma (default_sparse_kernel), the default window kernel
// kWindowKernelWithoutWgmma (default_window_kernel), and naming a wgmma kernel (select_chunks'
// `kernel`, set_sparse_kernel, set_window_kernel) is refused when it would run, with an
// std::invalid_argument that names the field, the kernel and the build setting.
bool wgmma_available();
// kDefaultSelectKernel where wgmma_available(), else kSelectKernelWithoutWgmma.
SelectKernel default_select_kernel();

// Selection per KV group (reference/SEMANTICS.md §4): [Hkv, T, K], ascending, -1 padded, ties to
// the lower chunk. Scores come from the summaries, or from `exact` [Hq, T, n_chunks] for the exact
// rule. selected_score [Hq, T, K] receives s_hat of each selected chunk (for the fusion).
// `kernel`: default_select_kernel() when not given.
void select_chunks(const MechanismSpec& spec, const Shape& shape, const DeviceInputs& in,
                   const float* key, const float* bias, const float* exact,
                   const float* lse_swa, int32_t* selection, float* selected_score,
                   cudaStream_t stream = nullptr,
                   std::optional<SelectKernel> kernel = std::nullopt);
// Fusion (reference/SEMANTICS.md §5) of a given selection: hierarchical (Eq. 10) or flat (Eq. 3).
// selected_score is needed for hierarchical fusion only.
void fuse(const MechanismSpec& spec, const Shape& shape, const DeviceInputs& in,
          const int32_t* selection, const float* selected_score, const float* o_swa,
          const float* lse_swa, float* o, float* lse, cudaStream_t stream = nullptr);
// fuse (hierarchical fusion) with o_swa read as o_swa_type (f32 or f16) and o written as o_type
// (f32 or bf16). Other than f32 needs the chunk-major sparse stage chunked_v24 to chunked_v36
// (packed shapes, set_sparse_kernel); elsewhere, and for other types, std::invalid_argument
// names the field.
// The arithmetic is fuse's (fp32, o summed in fp16); an fp16 o_swa rounds the window rows to
// 11 bits before their weight, a bf16 o rounds the result to 8 bits.
void fuse_rows(const MechanismSpec& spec, const Shape& shape, const DeviceInputs& in,
               const int32_t* selection, const float* selected_score, const void* o_swa,
               RowType o_swa_type, const float* lse_swa, void* o, RowType o_type, float* lse,
               cudaStream_t stream = nullptr);

// Bytes of scratch memory run_mechanism needs.
size_t workspace_bytes(const MechanismSpec& spec, const Shape& shape);
// The whole mechanism; `workspace` holds workspace_bytes(spec, shape) device bytes.
void run_mechanism(const MechanismSpec& spec, const Shape& shape, const DeviceInputs& in,
                   const DeviceOutputs& out, void* workspace, cudaStream_t stream = nullptr);

}  // namespace hils::gpu
