// Scoring and top-K on tensor cores (Eq. 2, 8): a block owns 64 adjacent queries of one
// KV group; each warp 16 of them. Pass 1 accumulates log Z_hat(t,h) per head over tiles of 64
// candidate chunks (s_hat = q~ . k' with k' rounded to bf16, fp32 accumulate); pass 2 forms the
// group score per tile and offers it to a per-query top-K list in shared memory. The reported
// selected_score is recomputed in fp32 from the fp32 summaries (v21, v22, v25: from their bf16
// copy, the values the ranking scored).
// Fast path only: bf16 q~, d = 64, G in {1, 2, 4, 8, 16}, K <= 64, summary key rules.
// The kernels' device code is under gpu/src/select_packed/ (gpu/NOTES.md "select_packed.cu and
// sparse_chunked.cu split (session 19)"): common.cuh (block geometry, scoring helpers), lists.cuh
// (v4's and v5's sorted lists), writers.cuh (selection rows and scores), buffers.cuh (v8's buffers
// and bound), inputs.cuh (the bf16 copy of k', bias2, v25's fold rows), two_pass.cuh, one_pass.cuh;
// this unit holds their launch code (launch_select_packed, launch_select_g, select_smem_bytes).
#include "launch_params.hpp"
#include "scratch_pool.hpp"
#include "mma_common.cuh"
#include "wgmma_common.cuh"

#include <stdexcept>
#include <string>
#include <type_traits>

// The kernels' headers, each including those it builds on.
#include "select_packed/common.cuh"
#include "select_packed/lists.cuh"
#include "select_packed/writers.cuh"
#include "select_packed/buffers.cuh"
#include "select_packed/inputs.cuh"
#include "select_packed/two_pass.cuh"
#include "select_packed/one_pass.cuh"

namespace hils::gpu::detail {
namespace {

size_t select_one_pass_smem_bytes(int64_t K) {
  return (kQueries * kRPitch + 4 * kQueries * K + kQueries) * 4;
}

// Queries per block of each kernel (threads: 2 per query): 128 for the wgmma kernels
// (Scoring::wgmma_q_smem), 64 for the others.
int block_queries(PackedSelect kernel) {
  return uses_wgmma(kernel) ? kBlockQueries<Scoring::wgmma_q_smem> : kQueries;
}

size_t select_smem_bytes(int64_t G, int64_t K, PackedSelect kernel) {
  const size_t v8_bytes = (kQueries * kBufPitch + G * kQueries + 2 * kQueries) * 4;
  if (kernel == PackedSelect::two_pass_v8) return v8_bytes;
  // v25: + the fifth k-step's k-side stages and the q side's low pieces (G x 128 bf16).
  if (kernel == PackedSelect::two_pass_v25)
    return 2 * v8_bytes + 4 * kPanelBytes + wg::kAtomBytes + kFoldPanelFloats * 4 + G * 128 * 2;
  if (uses_wgmma(kernel)) return 2 * v8_bytes + 4 * kPanelBytes + wg::kAtomBytes;
  return (kQueries * kRPitch + G * kQueries + 2 * kQueries * K + 2 * kQueries) * 4;
}

using SelectKernelFn = void (*)(LaunchParams, const float*, const __nv_bfloat16*, const float*,
                                const float*, const float*, int32_t*, float*, int);

// block_t0's first round (select_packed/common.cuh) for a grid of `blocks` blocks of `threads`
// threads: the device's SM count when the grid fits the device in one wave with at least two
// blocks per SM (then every SM takes one block before any takes a second, and the second blocks
// can be the light ones), else 0 (descending work only).
int one_wave_first_round(SelectKernelFn fn, int threads, size_t smem, int64_t blocks) {
  const Residency r = kernel_residency(fn, threads, smem, "select_kernel");
  return r.blocks_per_sm >= 2 && blocks > r.sms && blocks <= r.blocks() ? r.sms : 0;
}

template <int G>
SelectKernelFn select_kernel_of(PackedSelect kernel) {
  switch (kernel) {
    case PackedSelect::two_pass_v4: return select_packed_kernel<G, Offers::sorted>;
    case PackedSelect::one_pass_v5: return select_one_pass_kernel<G>;
    case PackedSelect::two_pass_v8: return select_packed_kernel<G, Offers::buffered>;
    case PackedSelect::two_pass_v15:
      return select_packed_kernel<G, Offers::buffered, Scoring::wgmma_q_smem, Writer::ahead, Lean::pass2>;
    case PackedSelect::two_pass_v21:  // the selection; the scores by selected_scores_lean_kernel
    case PackedSelect::two_pass_v22:  // the same; the scores by selected_scores_lean_kernel<G, true>
    case PackedSelect::two_pass_v26:  // the same; the scores from fp32 k' (selected_scores_lean_kernel<G, true, float>)
    case PackedSelect::two_pass_v27:  // the same; the scores from an fp16 copy of k' (<G, true, __half>)
      return select_packed_kernel<G, Offers::buffered, Scoring::wgmma_q_smem, Writer::separate, Lean::pass2_q32>;
    case PackedSelect::two_pass_v25:  // v22 with the bias and log2 Z_hat as pass 2's fifth k-step
      return select_packed_kernel<G, Offers::buffered, Scoring::wgmma_q_smem, Writer::separate, Lean::pass2_fold>;
  }
  return select_packed_kernel<G, Offers::sorted>;
}

template <int G>
void launch_select_g(const LaunchParams& p, const float* key, const float* bias,
                     const float* lse_swa, int32_t* selection, float* selected_score,
                     PackedSelect kernel, cudaStream_t stream) {
  // Static stages plus this dynamic scratch may pass the 48 KB default: always raise the limit.
  const size_t smem = kernel == PackedSelect::one_pass_v5 ? select_one_pass_smem_bytes(p.K)
                                                          : select_smem_bytes(G, p.K, kernel);
  const SelectKernelFn fn = select_kernel_of<G>(kernel);
  cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  const int queries = block_queries(kernel);
  const dim3 grid(static_cast<unsigned>((p.T + queries - 1) / queries),
                  static_cast<unsigned>(p.Hkv));
  // A bf16 copy of k' and a log2 e scaled bias (stream-ordered scratch) feed the copy engine;
  // v25: and the fifth k-step's k-side rows and max |b2| after them (fold_rows_offset).
  const int64_t n = p.Hq * (p.T / p.S) * kTileDim, n_bias = p.Hq * (p.T / p.S);
  const bool fold = kernel == PackedSelect::two_pass_v25;
  const size_t key_bytes = ((n > 0 ? n : 1) * sizeof(__nv_bfloat16) + 255) / 256 * 256;
  const int64_t bias_floats = fold ? fold_scratch_floats(n_bias) : (n_bias > 0 ? n_bias : 1);
  // v27: an fp16 copy of k' for the selected scores, after the bias floats.
  const bool fp16_scores = kernel == PackedSelect::two_pass_v27;
  const size_t bias_bytes = (bias_floats * sizeof(float) + 255) / 256 * 256;
  auto* scratch = static_cast<char*>(
      take_scratch(key_bytes + bias_bytes + (fp16_scores ? key_bytes : 0), stream, "selection"));
  auto* key_bf16 = reinterpret_cast<__nv_bfloat16*>(scratch);
  auto* bias2 = reinterpret_cast<float*>(scratch + key_bytes);
  auto* key_fp16 = fp16_scores ? reinterpret_cast<__half*>(scratch + key_bytes + bias_bytes) : nullptr;
  auto* fold_rows = fold ? reinterpret_cast<uint4*>(bias2 + fold_rows_offset(n_bias)) : nullptr;
  auto* fold_bias_max = fold ? reinterpret_cast<float*>(fold_rows + n_bias) : nullptr;
  if (fold) cudaMemsetAsync(fold_bias_max, 0, sizeof(float), stream);
  if (n > 0)
    to_bf16_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(
        key, key_bf16, n, bias, bias2, n_bias, fold_rows, fold_bias_max, p.scale * kLog2e, key_fp16);
  const int first_round = one_wave_first_round(fn, 2 * queries, smem, static_cast<int64_t>(grid.x) * grid.y);
  fn<<<grid, 2 * queries, smem, stream>>>(p, key, key_bf16, bias, bias2, lse_swa, selection, selected_score,
                                          first_round);
  // v21, v22, v25: the selected scores after the selection, by a kernel of their own, from bf16 k';
  // v26: the same kernel on the fp32 k'; v27 on an fp16 copy.
  const dim3 scores_grid(static_cast<unsigned>((p.T + 7) / 8), static_cast<unsigned>(p.Hkv));
  if (kernel == PackedSelect::two_pass_v21)  // v21: v20's sums in fewer instructions (K <= 32)
    selected_scores_lean_kernel<G><<<scores_grid, 256, 0, stream>>>(p, key_bf16, key, bias, selection, selected_score);
  if (kernel == PackedSelect::two_pass_v22 || kernel == PackedSelect::two_pass_v25)  // v22: v21's without load
    selected_scores_lean_kernel<G, true><<<scores_grid, 256, 0, stream>>>(p, key_bf16, key, bias, selection,
                                                                          selected_score);
  if (kernel == PackedSelect::two_pass_v26)
    selected_scores_lean_kernel<G, true, float><<<scores_grid, 256, 0, stream>>>(p, key, key, bias, selection,
                                                                                 selected_score);
  if (kernel == PackedSelect::two_pass_v27)
    selected_scores_lean_kernel<G, true, __half><<<scores_grid, 256, 0, stream>>>(p, key_fp16, key, bias,
                                                                                  selection, selected_score);
  give_back_scratch(scratch, stream);
}

}  // namespace

bool packed_select_applies(const LaunchParams& p) {
  const int64_t G = p.Hq / p.Hkv;
  return p.bf16 && p.d == kTileDim && p.K >= 1 && p.K <= 64 && p.key_rule != KeyRule::exact &&
         (G == 1 || G == 2 || G == 4 || G == 8 || G == 16);
}

void launch_select_packed(const LaunchParams& p, const float* key, const float* bias,
                          const float* lse_swa, int32_t* selection, float* selected_score,
                          PackedSelect kernel, cudaStream_t stream) {
  // The one-pass argument holds for the default group rule only; v8's 64-entry buffers (K + 32
  // entries) hold K <= 32, and so do the later kernels'.
  const bool fall_back = (kernel == PackedSelect::one_pass_v5 && p.group_rule != kGroupMaxNormalized) ||
                         (kernel != PackedSelect::two_pass_v4 && kernel != PackedSelect::one_pass_v5 &&
                          p.K > kWarp);
  // v21, v22 and v25 to v27 offset q~ rows in 32 bits (Hq T 64 < 2^32); longer sequences run v15 (the
  // same selection as v21 and v22; v25 differs from it only where it differs from v8; the scores
  // are v8's, not v21's rounding of k' to bf16).
  const bool long_rows = (kernel == PackedSelect::two_pass_v21 || kernel == PackedSelect::two_pass_v22 ||
                          kernel == PackedSelect::two_pass_v25 || kernel == PackedSelect::two_pass_v26 ||
                          kernel == PackedSelect::two_pass_v27) &&
                         p.Hq * p.T * kTileDim > UINT32_MAX;
  // v25 at G = 16: its extra shared memory (select_smem_bytes) would leave one block per SM; v22 runs.
  const bool fold_too_large = kernel == PackedSelect::two_pass_v25 && p.Hq / p.Hkv == 16;
  const PackedSelect one = fall_back   ? PackedSelect::two_pass_v4
                           : long_rows ? PackedSelect::two_pass_v15
                           : fold_too_large ? PackedSelect::two_pass_v22
                                            : kernel;
  if (uses_wgmma(one) && !wgmma_runs_on_current_device())
    refuse_wgmma_kernel("select_kernel", select_kernel_name(one),
                        "two_pass_v4, one_pass_v5 or two_pass_v8; two_pass_v8 is the fastest");
  switch (p.Hq / p.Hkv) {
    case 1: return launch_select_g<1>(p, key, bias, lse_swa, selection, selected_score, one, stream);
    case 2: return launch_select_g<2>(p, key, bias, lse_swa, selection, selected_score, one, stream);
    case 4: return launch_select_g<4>(p, key, bias, lse_swa, selection, selected_score, one, stream);
    case 8: return launch_select_g<8>(p, key, bias, lse_swa, selection, selected_score, one, stream);
    default: return launch_select_g<16>(p, key, bias, lse_swa, selection, selected_score, one, stream);
  }
}

}  // namespace hils::gpu::detail