// The oracle's comparison of a kernel's gradients (private to the oracle; verify() calls it).
#pragma once

#include <string>
#include <vector>

#include "hils/analysis/oracle.hpp"

namespace hils::oracle::detail {

// Kernel gradients vs run_mechanism_backward in double (truth, on `inputs`, which the oracle
// already rounded for a bf16 kernel) and float (baseline, on `inputs_float`), the selection held
// at `selection`; `truth_forward`, `baseline_forward` are the reference's forward runs (all T
// queries, keep_window), whose window branches the backward reuses. One report per gradient the
// kernel returned, in the order dq, dq_retrieval,
// dk, dv, dprior; a failing one carries a diagnosis when a known fault matches (a chunk's rows
// left zero, the gradient scaled by a constant such as a wrong logit scale, softmax1 flipped).
// A gradient whose fp16 floor's absolute term reaches its largest entry (small upstream
// gradients: even zeros would pass) is named in `not_compared`.
// Throws InvalidArgument for upstream gradients of the wrong shape or not finite.
std::vector<TensorReport> compare_gradients(const MechanismSpec& spec,
                                            const AttentionInputs<double>& inputs,
                                            const AttentionInputs<float>& inputs_float,
                                            const std::vector<IndexMatrix>& selection,
                                            const MechanismOutputs<double>& truth_forward,
                                            const MechanismOutputs<float>& baseline_forward,
                                            const KernelGradients& kernel,
                                            const VerifyOptions& options,
                                            std::vector<std::string>& not_compared);

}  // namespace hils::oracle::detail
