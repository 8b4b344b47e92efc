// The mutation study in issue 13's own setting (label `slow`, minutes): the hils preset,
// T = 2048, S = 64, W = 256, K = 8, Hq = 8, Hkv = 2, d = 64, synthetic topics data, each
// claimed precision; prints the table of the smallest size caught per kind.
#include <catch2/catch.hpp>

#include <iostream>

#include "mutation_study.hpp"
#include "sources/synthetic.hpp"

using namespace hils;
using namespace hils::oracle;
using namespace hils::oracle::testing;

TEST_CASE("mutation study in issue 13's setting (topics, T = 2048)", "[oracle][power][slow]") {
  sources::SyntheticParams params;
  params.generator = "topics";
  params.T = 2048;
  params.S = 64;
  params.Hq = 8;
  params.Hkv = 2;
  params.seed = cases::seed_of("oracle power, issue 13 setting");
  const AttentionInputs<double> inputs = sources::generate(params).inputs;
  MechanismSpec spec = preset("hils");
  spec.S = 64;
  spec.W = 256;
  spec.K = 8;
  std::vector<SummaryRow> summary;
  for (const auto& claim : study_claims()) {
    const auto rows = power_study(spec, inputs, claim);
    const int sixteen = sixteen_caught(rows);
    std::cout << format_power("mutation study, issue 13 setting, claimed " + claim.label() + ": " +
                                  std::to_string(sixteen) + "/16 caught (" +
                                  std::to_string(sixteen_caught(rows, true)) +
                                  "/16 element-wise only)", rows);
    summary.push_back({claim, rows, correct_kernels(spec, inputs, claim)});
    const SummaryRow& line = summary.back();
    INFO(claim.label() << ": " << line.correct.failures);
    // Every correct kernel passes, truncating ones included.
    CHECK(line.correct.passed == line.correct.total);
    // Measured (data/verify_format.md): 16, 14 and 13 of 16. Missed under bf16 inputs: value
    // noise of 0.1% and 0.3% of max|v| (below bf16's own resolution); under bf16 scores also a
    // 0.1% logit scale (inside 6 SE of both statistics with the lse stored in bf16).
    CHECK(sixteen >= (claim.precision == InputPrecision::fp32           ? 16
                      : claim.score_precision == InputPrecision::fp32 ? 14
                                                                       : 13));
    for (const char* kind : {"extra softmax1 logit", "missing softmax1 logit"})
      CHECK(row_of(rows, kind).caught == 1);
    const double logit_scale_caught = row_of(rows, "logit scale").smallest_caught;
    CHECK(logit_scale_caught > 0);
    CHECK(logit_scale_caught <= (claim.score_precision == InputPrecision::bf16 ? 0.3 : 0.03));
  }
  std::cout << format_summary("oracle power, issue 13 setting (mutants caught, correct kernels passed)",
                              summary);
}
