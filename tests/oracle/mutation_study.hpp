// The oracle's power, measured (issue 13): planted bugs of graded size, in a "kernel" made of
// the reference's float run with its outputs stored as the claimed precision stores them.
// Shared by the CI test (test_oracle_power.cpp, small cases) and the larger study behind the
// `slow` label.
#pragma once

#include <string>
#include <vector>

#include "oracle_support.hpp"

namespace hils::oracle::testing {

// One kind of planted bug; sizes are graded from small to large (one size for an on/off bug).
struct BugKind {
  std::string name;          // "logit scale", "value noise", "extra softmax1 logit", ...
  std::string unit;          // how a size reads ("%" of the scale, "% of max|v|", "")
  std::vector<double> sizes;
};

// The claimed precision of a kernel: inputs, then scores.
struct Claim {
  InputPrecision precision = InputPrecision::fp32;
  InputPrecision score_precision = InputPrecision::fp32;
  std::string label() const;  // "fp32/fp32", "bf16/fp32", "bf16/bf16"
};

// The three claims of the study.
std::vector<Claim> study_claims();

// The sixteen kinds of bug (issue 13), with their graded sizes, and a logit scale too small by
// the same grades (not one of the sixteen; a truncating kernel's bias points that way).
std::vector<BugKind> bug_kinds();

// What a kernel with this bug of this size produced (o, lse and selection only, what most
// kernels give), stored as `claim` stores it, and the spec it claims to implement. `spec` is the
// spec the user asks about; the softmax1 bugs flip it on one side.
struct PlantedKernel {
  MechanismSpec declared;
  KernelOutputs outputs;
};
PlantedKernel planted_kernel(const BugKind& kind, double size, const MechanismSpec& spec,
                             const AttentionInputs<double>& inputs, const Claim& claim);

// The outputs a kernel author usually dumps: o, lse and the selection.
KernelOutputs minimal_outputs(const KernelOutputs& all);

// One row of the study: the smallest size of a kind the oracle catches (0 = none caught).
struct PowerRow {
  std::string kind, unit;
  double smallest_caught = 0;
  int caught = 0, planted = 0;  // over the graded sizes
  std::vector<double> caught_sizes;
  std::string caught_by;  // what failed at the smallest size caught (failed_checks)
  // The same without the mean test (the oracle before issue 13): only element-wise bounds and
  // the selection.
  double smallest_caught_elementwise = 0;
  std::vector<double> caught_sizes_elementwise;
};
// Runs every kind at every size under `claim` on `spec` and `inputs`.
std::vector<PowerRow> power_study(const MechanismSpec& spec, const AttentionInputs<double>& inputs,
                                  const Claim& claim);

// The row of `kind` in a study's rows; throws std::logic_error when there is none.
const PowerRow& row_of(const std::vector<PowerRow>& rows, const std::string& kind);

// Issue 13's count over its sixteen bugs: each on/off kind, and the graded kinds at 0.1%, 0.3%
// and 1%. Returns how many of the sixteen were caught.
int sixteen_caught(const std::vector<PowerRow>& rows, bool elementwise_only = false);

// The study's table, one line per kind, for the test's report.
std::string format_power(const std::string& title, const std::vector<PowerRow>& rows);

// What failed in a verdict and by how much: "lse logit scale 2.1x, o 1.3x, selection".
std::string failed_checks(const Verdict& verdict);

// The correct kernels of a claim judged by the oracle: the float run stored as the claim stores
// (bf16 to nearest and toward zero), and under bf16/bf16 with hierarchical summaries the
// bf16-everywhere kernel both ways (oracle_support.hpp).
struct CorrectCount {
  int passed = 0, total = 0;
  double worst_elementwise = 0, worst_shift = 0;  // largest headroom of any
  std::string worst_shift_kernel;                 // the kernel of worst_shift
  std::string failures;                          // "what: failed_checks" of each failure
};
CorrectCount correct_kernels(const MechanismSpec& spec, const AttentionInputs<double>& inputs,
                             const Claim& claim);

// One claim's line of the summary: mutants caught, correct kernels passed.
struct SummaryRow {
  Claim claim;
  std::vector<PowerRow> power;
  CorrectCount correct;
};
std::string format_summary(const std::string& title, const std::vector<SummaryRow>& rows);

}  // namespace hils::oracle::testing
