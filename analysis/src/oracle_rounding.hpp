// The oracle's bf16-rounding analysis of a hierarchical fusion's lse (private to the oracle;
// oracle_rounding.cpp, called by compare_fused in oracle.cpp).
#pragma once

#include <vector>

#include "hils/analysis/oracle.hpp"
#include "oracle_context.hpp"

namespace hils::oracle::detail {

// The statistics over all lse rows (hierarchical fusion, bf16 scores): the mean error and the
// logit-scale slope sum g e / sum g^2, each against what a correct kernel's rounding gives.
void check_lse_shifts(const Context& ctx, const std::vector<IndexMatrix>& selection,
                      const std::vector<HeadOutputs<double>>& truth,
                      const std::vector<HeadOutputs<float>>& base, const KernelOutputs& kernel,
                      TensorReport& report);

}  // namespace hils::oracle::detail
