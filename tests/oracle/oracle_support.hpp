// Test helpers for the oracle: a "kernel" made of the reference's float run, and the specs the
// oracle tests cover.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "case_inputs.hpp"
#include "hils/analysis/oracle.hpp"

namespace hils::oracle::testing {

// Inputs in double -> the same numbers rounded to float.
AttentionInputs<float> to_float(const AttentionInputs<double>& inputs);

// 0, 1, ..., T-1: every query slot.
std::vector<int64_t> all_queries(int64_t T);

// kernel.selection fused in float on `in` (forced_fusion) -> kernel.o, lse and fusion_weights,
// as a kernel fusing its own selection does.
void fuse_own_selection(const MechanismSpec& spec, const AttentionInputs<float>& in,
                        KernelOutputs& kernel);

// How a kernel's score path rounds, each step (identity: kept in float): the Taylor summary
// weights p, the summary keys k' (a whole matrix: a store may scale its rows), the bias b',
// every s_hat.
struct ScoreRounding {
  std::function<float(float)> weights = [](float x) { return x; };
  std::function<Matrix<float>(const Matrix<float>&)> keys = [](const Matrix<float>& m) { return m; };
  std::function<float(float)> bias = [](float x) { return x; };
  std::function<float(float)> scores = [](float x) { return x; };
};

// What that score path computed in float on `in`: per query head s_hat, lse_swa and the k', b'
// it scored with; per KV group the selection made from them (select_chunks).
struct ScorePath {
  std::vector<Matrix<float>> scores, summary_key;
  std::vector<Vector<float>> lse_window, summary_bias;
  std::vector<IndexMatrix> selection;
};
ScorePath rounded_score_path(const MechanismSpec& spec, const AttentionInputs<float>& in,
                             const ScoreRounding& rounding);

// What a kernel of this precision computes from: the inputs (rounded to bf16 or fp16), in float.
AttentionInputs<float> kernel_inputs(const AttentionInputs<double>& inputs, InputPrecision precision);

// Rounds a kernel's outputs as a kernel of these precisions stores them: o, o_window in bf16 for
// bf16 inputs (in fp16, to nearest, for fp16 inputs); with bf16 scores, the summaries, scores and (hierarchical fusion) lse and fusion
// weights in bf16 too, to nearest or (a truncating kernel) toward zero. Idempotent.
void round_as_stored(const MechanismSpec& spec, KernelOutputs& out, InputPrecision precision,
                     InputPrecision score_precision,
                     Bf16Rounding rounding = Bf16Rounding::nearest);

// Every stage of the reference run in float on `inputs`, widened to double: what a correct
// kernel would produce. With bf16 the inputs are rounded to bf16 first and o, o_window are
// stored in bf16 (FlashAttention's habit: bf16 o, fp32 lse); with bf16 scores too, every
// other output is stored in bf16 as well; `rounding` says how (to nearest, or toward zero).
KernelOutputs float_kernel(const MechanismSpec& spec, const AttentionInputs<double>& inputs,
                           InputPrecision precision = InputPrecision::fp32,
                           InputPrecision score_precision = InputPrecision::fp32,
                           Bf16Rounding rounding = Bf16Rounding::nearest);

// A correct kernel that rounds to bf16 wherever one may: inputs; the summary weights p and keys
// k', the bias b'; every s_hat; selects on those; fuses the rounded s_hat with the fp32 lse_swa
// (its logits accumulate in fp32: the oracle holds lse_window to fp32); stores o and lse in bf16 (o: the float fusion of its selection). Every rounding to
// nearest, or (a truncating kernel) every one toward zero. Gives o, lse and the selection
// (the other stages as float_kernel gives them). Hierarchical specs with summaries.
KernelOutputs bf16_everywhere_kernel(const MechanismSpec& spec, const AttentionInputs<double>& inputs,
                                     Bf16Rounding rounding = Bf16Rounding::nearest);

// In group 0's `selection`, the last query's strongest chosen chunk (by the reference's group
// scores on `inputs`) replaced by its weakest candidate left out; throws InvalidArgument when
// the last query has no more than K candidates.
struct ChunkSwap {
  int64_t t, best, worst;  // the query, the chunk taken out, the chunk put in
};
ChunkSwap swap_strongest_for_weakest(const MechanismSpec& spec,
                                    const AttentionInputs<double>& inputs, IndexMatrix& selection);

// That swap in the kernel's selection, and o, lse, fusion weights fused in float on
// `kernel_in` from it, as a kernel with a top-k bug would produce. Returns a line naming the
// swap.
std::string plant_wrong_chunk(const MechanismSpec& spec, const AttentionInputs<double>& inputs,
                              const AttentionInputs<float>& kernel_in, KernelOutputs& kernel);

// A correct backward kernel: Gaussian upstream gradients do, dlse (from `seed`; do in bf16 or
// fp16 for a kernel of that precision) and run_mechanism_backward in float on the inputs rounded
// to `precision`, with `selection` held fixed, widened (stored in bf16 or fp16 likewise).
KernelGradients float_gradients(const MechanismSpec& spec, const AttentionInputs<double>& inputs,
                                const std::vector<IndexMatrix>& selection, uint64_t seed,
                                InputPrecision precision = InputPrecision::fp32);

// The specs the oracle is exercised on, with a case's geometry: every preset (kPresets) and every
// key rule (cases::with_every_key_rule; today the presets have them all). Specs that need
// landmarks (lmk, hils) are skipped for cases without landmarks; hils switches to the shared
// prior there.
std::vector<MechanismSpec> specs_for(const cases::Case& c);

// The first case of the table with this name (throws if none).
using cases::case_named;

}  // namespace hils::oracle::testing
