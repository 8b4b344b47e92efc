// The hard cases (hils/analysis/hard_cases.hpp) hold what each promises, measured with the
// reference: ties exact in the surrogate scores and cutting through the top-K, logits beyond
// +-100, chunk 0 chosen by every row that can choose it, every value exact in the precision.
// tests/python/test_hard_cases.py holds the faults they catch and the Python surface.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <tuple>

#include "hils/analysis/hard_cases.hpp"
#include "hils/hils.hpp"

using namespace hils;
using namespace hils::oracle;

namespace {

MechanismSpec small_spec(const char* name) {
  MechanismSpec spec = preset(name);
  spec.S = 8;
  spec.W = 16;
  spec.K = 3;
  return spec;
}

const HeadShape kShape{4, 2, 16, 8};

std::map<std::string, HardCase> by_name(const HardCases& built) {
  std::map<std::string, HardCase> cases;
  for (const auto& c : built.cases) cases.emplace(c.name, c);
  return cases;
}

// The largest and smallest causal logit sigma q_t . k_j over every head, t and j <= t.
std::pair<double, double> logit_range(const MechanismSpec& spec, const AttentionInputs<double>& in) {
  const double sigma = logit_scale(spec, in.d());
  const int64_t G = in.Hq() / in.Hkv();
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (int64_t h = 0; h < in.Hq(); ++h) {
    const Matrix<double> s = sigma * in.q[h] * in.k[h / G].transpose();
    for (int64_t t = 0; t < s.rows(); ++t)
      for (int64_t j = 0; j <= t; ++j) {
        lo = std::min(lo, s(t, j));
        hi = std::max(hi, s(t, j));
      }
  }
  return {lo, hi};
}

}  // namespace

TEST_CASE("hard cases: tied chunks tie exactly in every head's surrogate score and cut the top-K",
          "[oracle][hard_cases]") {
  for (const char* name : {"hils", "nsa", "lmk"}) {
    const MechanismSpec spec = small_spec(name);
    const auto cases = by_name(hard_cases(spec, kShape, {InputPrecision::bf16}));
    const HardCase& tied = cases.at("tied_chunks");
    RunOptions options;
    options.keep_surrogate_scores = true;
    const auto out = run_mechanism(spec, tied.inputs, options);
    const Geometry geometry = geometry_of(spec, tied.inputs.T());
    int64_t rows_cut = 0;
    for (int64_t t = 0; t < tied.inputs.T(); ++t) {
      const int64_t n = geometry.candidate_count(t);
      for (const auto& head : out.heads)
        for (int64_t c = 2; c < n; ++c)
          REQUIRE(head.surrogate_scores(t, c) == head.surrogate_scores(t, c % 2));
      if (n <= spec.K) continue;
      // The chosen chunks of one tie group (same parity) are fewer than the group: cut inside it.
      for (const auto& selection : out.selection) {
        int64_t chosen[2] = {0, 0};
        for (int64_t i = 0; i < spec.K; ++i) ++chosen[selection(t, i) % 2];
        const int64_t group[2] = {(n + 1) / 2, n / 2};
        rows_cut += (chosen[0] > 0 && chosen[0] < group[0]) || (chosen[1] > 0 && chosen[1] < group[1]);
      }
    }
    INFO(name);
    CHECK(rows_cut > 0);
  }
}

TEST_CASE("hard cases: near ties move one key entry of each copy by one unit of the precision",
          "[oracle][hard_cases]") {
  for (InputPrecision precision : {InputPrecision::bf16, InputPrecision::fp32}) {
    const MechanismSpec spec = small_spec("nsa");
    const auto cases = by_name(hard_cases(spec, kShape, {precision}));
    const auto& tied = cases.at("tied_chunks").inputs;
    const auto& near = cases.at("near_tied_chunks").inputs;
    const int64_t copies = tied.T() / spec.S - 2;
    for (size_t g = 0; g < tied.k.size(); ++g) {
      const Matrix<double> moved = near.k[g] - tied.k[g];
      CHECK((moved.array() != 0).count() == copies);
      CHECK((moved.array().abs() <= 2 * unit_roundoff(precision) * tied.k[g].array().abs()).all());
    }
    CHECK(near.q == tied.q);
  }
}

TEST_CASE("hard cases: large and negative logits reach +-100, flat ones stay near 0",
          "[oracle][hard_cases]") {
  const MechanismSpec spec = small_spec("hils");
  const auto cases = by_name(hard_cases(spec, kShape, {InputPrecision::bf16}));
  CHECK(logit_range(spec, cases.at("large_logits").inputs).second > 100);
  CHECK(logit_range(spec, cases.at("negative_logits").inputs).second < -100);
  const auto flat = logit_range(spec, cases.at("flat_logits").inputs);
  CHECK(flat.first > -0.2);
  CHECK(flat.second < 0.2);
  const auto& zero = cases.at("zero_queries").inputs;
  for (const auto& q : zero.q) CHECK(q.row(2).isZero(0));
}

TEST_CASE("hard cases: every row that can choose chunk 0 chooses it in dominant_chunk",
          "[oracle][hard_cases]") {
  for (const char* name : {"hils", "nsa"}) {
    const MechanismSpec spec = small_spec(name);
    const auto cases = by_name(hard_cases(spec, kShape, {InputPrecision::fp32}));
    const auto& in = cases.at("dominant_chunk").inputs;
    const auto out = run_mechanism(spec, in);
    const Geometry geometry = geometry_of(spec, in.T());
    for (int64_t t = 0; t < in.T(); ++t) {
      if (geometry.candidate_count(t) == 0) continue;
      for (const auto& selection : out.selection) REQUIRE(selection(t, 0) == 0);
    }
  }
}

TEST_CASE("hard cases: values exact in the precision, lengths as named, the same bits twice",
          "[oracle][hard_cases]") {
  const MechanismSpec spec = small_spec("hils");
  for (InputPrecision precision : {InputPrecision::bf16, InputPrecision::fp32}) {
    const HardCases built = hard_cases(spec, kShape, {precision});
    CHECK(built.cases.size() == hard_case_names().size());
    for (const auto& c : built.cases) {
      INFO(c.name);
      for (const auto* heads : {&c.inputs.q, &c.inputs.k, &c.inputs.v})
        for (const auto& m : *heads)
          for (int64_t i = 0; i < m.size(); ++i) {
            const double x = m.data()[i];
            REQUIRE(x == (precision == InputPrecision::bf16 ? round_to_bf16(x)
                                                            : static_cast<double>(static_cast<float>(x))));
          }
    }
  }
  const auto cases = by_name(hard_cases(spec, kShape));
  CHECK(cases.at("single_slot").inputs.T() == 1);
  CHECK(cases.at("shorter_than_chunk").inputs.T() == spec.S - 1);
  CHECK(geometry_of(spec, cases.at("candidate_counts").inputs.T()).candidate_count(
            cases.at("candidate_counts").inputs.T() - 1) == spec.K + 1);
  CHECK(cases.at("ragged_tail").inputs.T() % spec.S != 0);
  const auto again = by_name(hard_cases(spec, kShape));
  CHECK(again.at("gaussian").inputs.k[1] == cases.at("gaussian").inputs.k[1]);
}

TEST_CASE("hard cases: a prior the spec reads is built, one row or one per chunk",
          "[oracle][hard_cases]") {
  MechanismSpec spec = small_spec("hils");
  spec.landmarks = false;
  spec.prior_rule = PriorRule::shared;
  const auto shared = by_name(hard_cases(spec, kShape));
  CHECK(shared.at("gaussian").inputs.prior.size() == 4);
  CHECK(shared.at("gaussian").inputs.prior[0].rows() == 1);
  spec.prior_rule = PriorRule::given;
  const auto given = by_name(hard_cases(spec, kShape));
  const auto& tied = given.at("tied_chunks").inputs;
  CHECK(tied.prior[0].rows() == tied.T() / spec.S);
  CHECK(tied.prior[3].row(4) == tied.prior[3].row(0));  // the copies' priors are copied too
}

TEST_CASE("hard cases: a bad shape, precision or option is refused naming it", "[oracle][hard_cases][errors]") {
  const MechanismSpec spec = small_spec("nsa");
  CHECK_THROWS_WITH(hard_cases(spec, {3, 2, 16, 16}), "Hq: expected a multiple of Hkv = 2, got 3");
  CHECK_THROWS_WITH(hard_cases(spec, {2, 2, 0, 16}), "d: expected an integer >= 1, got 0");
  CHECK_THROWS_WITH(hard_cases(spec, kShape, {InputPrecision::int4}),
                    "precision: expected an input precision (fp32, bf16, fp16), got int4");
  CHECK_THROWS_WITH(hard_cases(spec, kShape, {InputPrecision::fp32, 0}),
                    "length_multiple: expected an integer >= 1, got 0");
  CHECK_THROWS_WITH(hard_cases(spec, kShape, {InputPrecision::fp32, 1, -1}),
                    "max_T: expected 0 (no limit) or a length >= 1, got -1");
  MechanismSpec bad = spec;
  bad.W = 0;
  CHECK_THROWS_AS(hard_cases(bad, kShape), InvalidArgument);
  CHECK_THROWS_WITH(hard_cases(spec, kShape, {InputPrecision::fp32, int64_t{1} << 60}),
                    "length_multiple: expected at most 2^50, got 1152921504606846976");
}

TEST_CASE("hard cases: geometry values near int64's range are refused by the memory check, never "
          "wrapped", "[oracle][hard_cases][errors]") {
  for (auto [S, W, K] : {std::tuple<int64_t, int64_t, int64_t>{int64_t{1} << 62, 16, 3},
                         {8, int64_t{1} << 62, 3}, {8, 16, int64_t{1} << 61}}) {
    MechanismSpec spec = small_spec("nsa");
    spec.S = S, spec.W = W, spec.K = K;
    INFO(S << " " << W << " " << K);
    CHECK_THROWS_WITH(hard_cases(spec, kShape, {InputPrecision::fp32, 2}),
                      Catch::StartsWith("hard cases: their inputs need "));
  }
  MechanismSpec wide = small_spec("nsa");
  wide.S = int64_t{1} << 62;
  const HardCases capped = hard_cases(wide, kShape, {InputPrecision::fp32, 1, 1000});
  REQUIRE(capped.cases.size() == 1);  // single_slot
  CHECK(capped.skipped.front().reason == "needs T beyond 2^50 > max_T = 1000");
}
