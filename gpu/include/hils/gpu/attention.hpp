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
// Throws std::invalid_argument naming the first bad field of the shapes and the spec: sizes and
// the spec's numbers (S, W, K, scale as the reference takes them), and buffers of at most 2^59
// bytes (a garbage or overflowed shape is refused, not wrapped).
void validate_shape(const MechanismSpec& spec, const Shape& shape);
// validate_shape, then the input pointers, the prior, and Hkv <= 65535 where the packed kernels
// run. Each stage also refuses a null pointer among the outputs it writes and the scratch it
// reads (a kernel writing through null would leave a sticky CUDA error).
void validate(const MechanismSpec& spec, const Shape& shape, const DeviceInputs& in);

// Use the packed tensor-core kernels where they apply (bf16, d = dv = S = 64, G | 16): on by
// default; off runs the SIMT kernels everywhere (tests compare both with the reference).
void set_packed_kernels(bool enabled);
bool packed_kernels();
// Queries per segment of the chunk-major sparse stage (packed shapes): 0 (default) sizes it from
// the L2 size; tests set small values to cover several segments.
void set_sparse_segment_queries(int64_t queries);
// Which chunk-major sparse stage runs on the packed shapes (gpu/NOTES.md has each version's
// numbers); process-wide like set_packed_kernels. All compute the same fusion (Eq. 10). The
// values are stable codes (the C API's and the Python binding's): the versions removed in session
// 17 keep their codes unused (gpu/NOTES.md "Kernels removed in session 17": their code is at
// commit ad5fb84), so no kept kernel is renumbered.
enum class SparseKernel {
  chunked_v21 = 17,  // pairs bucketed once per call with their ranks counted per tile of queries
                     // in shared memory, each row's fusion weights formed first (o_swa rows split
                     // over half-warps) and stored in bucket order, then an mma.sync chunk kernel
                     // adding w_c o_c into an fp16 copy of o by f16x2 reductions (no scratch of
                     // partials, no reduce; o's last bits vary from run to run), query segments of
                     // the whole L2: the sparse stage without wgmma
  chunked_v30 = 26,  // the wgmma chunk kernel (sm_90a), persistent (each block takes items from
                     // a cursor), segments that split T evenly, the item descriptors, the count's
                     // scan and segment 0's weights in one launch, each pair's bucket entry and
                     // fp16 weights in one record written by the weights kernel (no scatter)
  chunked_v35 = 29,  // chunked_v30 with its kernels chained by programmatic dependent launch (each
                     // launched while the previous one finishes, waiting for it on the device)
  chunked_v36 = 30,  // chunked_v35 with the pair weights formed by lanes that each hold one head's
                     // scores of G slots (G <= 8, K <= 32; v35's elsewhere): the same values
};
// Every SparseKernel, in the order of their values.
constexpr SparseKernel kSparseKernels[] = {SparseKernel::chunked_v21, SparseKernel::chunked_v30,
                                           SparseKernel::chunked_v35, SparseKernel::chunked_v36};
// The kernel's name as above ("chunked_v21", ...).
const char* sparse_kernel_name(SparseKernel kernel);
// Whether the sparse stage runs wgmma (sm_90a; wgmma_available below). Every kernel is listed,
// so that a new one cannot be left out (-Wswitch).
constexpr bool uses_wgmma(SparseKernel kernel) {
  switch (kernel) {
    case SparseKernel::chunked_v21: return false;
    case SparseKernel::chunked_v30:
    case SparseKernel::chunked_v35:
    case SparseKernel::chunked_v36: return true;
  }
  return true;
}
// The default sparse stage where wgmma can run (wgmma_available, below): chunked_v36 (v35 with a
// pair-weights kernel whose lanes hold (head, G slots), the same values; v35 is v30 with its
// kernels chained by programmatic dependent launch; v30 as above; it also takes fuse_rows' fp16
// o_swa and bf16 o).
constexpr SparseKernel kDefaultSparseKernel = SparseKernel::chunked_v36;
// The sparse stage without wgmma where wgmma cannot run: chunked_v21 (its weights kernel, count
// and segments with an mma.sync chunk kernel).
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
// version's numbers); process-wide like set_sparse_kernel. All compute the window branch of
// reference/SEMANTICS.md §2. The values are stable codes, as SparseKernel's (the versions removed
// in session 17 keep theirs unused; gpu/NOTES.md "Kernels removed in session 17").
enum class WindowKernel {
  mma_v9 = 1,      // 128 rows per block (M = 128 / G queries x G heads), the mask only on tiles
                   // that cut a row's window, base-2 softmax (mma.sync)
  wgmma_v18 = 10,  // mma_v9's block as two warpgroups issuing wgmma m64n64k16 (sm_90a), the K/V
                   // tiles copied two ahead by the tensor memory accelerator (TMA)
  wgmma_v19 = 11,  // wgmma_v18 with a lazy maximum (raised when passed by 2^8) and tree maxima
  wgmma_v20 = 12,  // wgmma_v19 with per-stage "empty" mbarriers instead of a block barrier per tile
};
// Every WindowKernel, in the order of their values.
constexpr WindowKernel kWindowKernels[] = {WindowKernel::mma_v9, WindowKernel::wgmma_v18,
                                           WindowKernel::wgmma_v19, WindowKernel::wgmma_v20};
// The kernel's name as above ("mma_v9", ...).
const char* window_kernel_name(WindowKernel kernel);
// Whether the kernel runs wgmma (sm_90a; wgmma_available below). Every kernel is listed, so
// that a new one cannot be left out (-Wswitch).
constexpr bool uses_wgmma(WindowKernel kernel) {
  switch (kernel) {
    case WindowKernel::mma_v9: return false;
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
// nearest; every packed window kernel, for fuse_rows): half the bytes. Elsewhere,
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
// Which packed selection kernel runs (gpu/NOTES.md has each version's numbers). The values are
// stable codes, as SparseKernel's (the versions removed in session 17 keep theirs unused;
// gpu/NOTES.md "Kernels removed in session 17"). All but two_pass_v25 give the same selection
// (selections_identical_to_v8); v25 may differ at near ties, within the oracle's margin. The
// selected scores (the hierarchical fusion's logits) of two_pass_v21, two_pass_v22 and two_pass_v25
// are sums over the bf16 k' the ranking scored (v25 v22's scores of its own selection); the others
// sum the fp32 k' (v26) or an fp16 copy of it (v27). two_pass_v27 is the default
// (kDefaultSelectKernel): v8 scored by wgmma on sm_90a with 128 queries per block, pass 2's per-step
// overhead trimmed and two k' tiles per pass-1 step (v15), pass 2's copy state in 32 bits and the
// selected scores by a kernel of their own (v21, v22) that reads an fp16 copy of k' (v27: the bf16
// rows of v22 moved the fusion logits by ~0.3 and o past the oracle's tolerance when |s_hat| ~ 150;
// fp32 rows, v26, cost ~4 ms at 512K; gpu/NOTES.md v16 to v27). v4, v5, v8, v15, v21, v22, v25 and
// v26 stay reachable by name: the fallbacks, the independent checks of the tests and the
// benchmark's comparison points (gpu/NOTES.md "Kernels removed in session 17").
// one_pass_v5 applies to the default group rule (max_normalized); for the others it falls back
// to two_pass_v4. v8 forms its bound for K <= 32 and the normalised group rules and takes K <= 32
// (else two_pass_v4), and so do v15 to v25.
enum class SelectKernel {
  two_pass_v4 = 0,   // pass 1: log Z_hat per head; pass 2: group scores offered to the top-K lists
  one_pass_v5 = 1,   // per head a running log Z_hat and its K best; the union ranked at the end
  two_pass_v8 = 4,   // v4 plus a pass-1 lower bound of the K-th group score over 64 slots that
                     // prunes the offers, candidates appended to per-row buffers (no ranking in
                     // pass 2; K <= 32, else two_pass_v4)
  two_pass_v15 = 11,  // v8 scored by wgmma (sm_90a) with 128 queries per block, pass 2's q~ staged
                      // in shared memory and its per-step copies, descriptors and resets trimmed,
                      // the writer's loads one unit ahead, two k' tiles per pass-1 step (K <= 32,
                      // else two_pass_v4); also the path of v21, v22 and v25 where Hq T 64 >= 2^32
  two_pass_v21 = 17,  // v15 with pass 2's copy state in 32 bits (no spills) and the selected scores
                      // by a kernel of their own that sums them from the bf16 k' rows the ranking
                      // scored: v8's selections, scores NOT v8's bits (they differ by k''s bf16
                      // rounding; gpu/NOTES.md v20, v21)
  two_pass_v22 = 18,  // v21 with the scores kernel's loads untested and 4 blocks per SM: v21's bytes
  two_pass_v25 = 19,  // v22 with pass 2's bias and log Z_hat as a fifth wgmma k-step (max_normalized):
                      // NOT v8's bits (group scores rounded otherwise; pass 1's bound taken with a
                      // margin); v22 at 16 heads per group (shared memory); gpu/NOTES.md v25
  two_pass_v26 = 20,  // v22 with its scores kernel summing the fp32 k' rows: v8's selections and
                      // selected scores within fp32 rounding of v8's (the hierarchical fusion's
                      // logits; v22's bf16 k' moved them by ~0.3 at |s_hat| ~ 150, gpu/NOTES.md v26)
  two_pass_v27 = 21,  // v22 with its scores kernel summing an fp16 copy of k' (v22's bytes, 2^-11
                      // relative rounding instead of 2^-8; a score that k' beyond fp16's range
                      // makes non-finite is summed again from fp32 k')
};
// Every SelectKernel, in the order of their values.
constexpr SelectKernel kSelectKernels[] = {SelectKernel::two_pass_v4,  SelectKernel::one_pass_v5,
                                           SelectKernel::two_pass_v8,  SelectKernel::two_pass_v15,
                                           SelectKernel::two_pass_v21, SelectKernel::two_pass_v22,
                                           SelectKernel::two_pass_v25, SelectKernel::two_pass_v26,
                                           SelectKernel::two_pass_v27};
constexpr SelectKernel kDefaultSelectKernel = SelectKernel::two_pass_v27;
// The selection without wgmma where wgmma cannot run (wgmma_available).
constexpr SelectKernel kSelectKernelWithoutWgmma = SelectKernel::two_pass_v8;
// The kernel's name as above ("two_pass_v22", ...).
const char* select_kernel_name(SelectKernel kernel);
// Whether the kernel runs wgmma (sm_90a): two_pass_v15 and later. Every kernel is listed, so
// that a new one cannot be left out (-Wswitch).
constexpr bool uses_wgmma(SelectKernel kernel) {
  switch (kernel) {
    case SelectKernel::two_pass_v4:
    case SelectKernel::one_pass_v5:
    case SelectKernel::two_pass_v8: return false;
    case SelectKernel::two_pass_v15:
    case SelectKernel::two_pass_v21:
    case SelectKernel::two_pass_v22:
    case SelectKernel::two_pass_v25:
    case SelectKernel::two_pass_v26:
    case SelectKernel::two_pass_v27: return true;
  }
  return true;
}

// Whether the kernel's selections equal v8's bit for bit by construction: every kernel but
// two_pass_v25 (the selected scores of two_pass_v21 and two_pass_v22 differ from v8's; see above).
constexpr bool selections_identical_to_v8(SelectKernel kernel) { return kernel != SelectKernel::two_pass_v25; }

// Whether the wgmma kernels (uses_wgmma: selections from two_pass_v15, sparse stages from
// chunked_v30, window kernels from wgmma_v18) can run on the current GPU with this build: its
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
// (f32 or bf16). Other than f32 needs the chunk-major sparse stage chunked_v30, v35 or v36
// (packed shapes, set_sparse_kernel); elsewhere, and for other types, std::invalid_argument
// names the field.
// The arithmetic is fuse's (fp32, o summed in fp16); an fp16 o_swa rounds the window rows to
// 11 bits before their weight, a bf16 o rounds the result to 8 bits.
void fuse_rows(const MechanismSpec& spec, const Shape& shape, const DeviceInputs& in,
               const int32_t* selection, const float* selected_score, const void* o_swa,
               RowType o_swa_type, const float* lse_swa, void* o, RowType o_type, float* lse,
               cudaStream_t stream = nullptr);

// Bytes of scratch memory run_mechanism needs; throws as validate_shape for a bad shape or spec.
size_t workspace_bytes(const MechanismSpec& spec, const Shape& shape);
// The whole mechanism; `workspace` holds workspace_bytes(spec, shape) device bytes.
void run_mechanism(const MechanismSpec& spec, const Shape& shape, const DeviceInputs& in,
                   const DeviceOutputs& out, void* workspace, cudaStream_t stream = nullptr);

}  // namespace hils::gpu
