// Test helpers for the oracle: a "kernel" made of the reference's float run, and the specs the
// oracle tests cover.
#pragma once

#include <string>
#include <vector>

#include "case_inputs.hpp"
#include "hils/analysis/oracle.hpp"

namespace hils::oracle::testing {

// Every stage of the reference run in float on `inputs`, widened to double: what a correct
// kernel would produce. With bf16 the inputs are rounded to bf16 first and o, o_window are
// stored in bf16 (FlashAttention's habit: bf16 o, fp32 lse); with bf16 scores too, every
// other output is stored in bf16 as well.
KernelOutputs float_kernel(const MechanismSpec& spec, const AttentionInputs<double>& inputs,
                           InputPrecision precision = InputPrecision::fp32,
                           InputPrecision score_precision = InputPrecision::fp32);

// A correct backward kernel: Gaussian upstream gradients do, dlse (from `seed`; do in bf16
// for a bf16 kernel) and run_mechanism_backward in float with `selection` held fixed, widened
// (stored in bf16 for a bf16 kernel).
KernelGradients float_gradients(const MechanismSpec& spec, const AttentionInputs<double>& inputs,
                                const std::vector<IndexMatrix>& selection, uint64_t seed,
                                InputPrecision precision = InputPrecision::fp32);

// The presets the oracle is exercised on, with a case's geometry. Presets that need landmarks
// (lmk, hils) are skipped for cases without landmarks; hils switches to the shared prior there.
std::vector<MechanismSpec> specs_for(const cases::Case& c);

// The first case of the table with this name (throws if none).
using cases::case_named;

}  // namespace hils::oracle::testing
