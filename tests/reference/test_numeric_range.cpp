// Inputs at the edges of the number range (issue 8 item 4) and the prior rule of the positional
// encoding (issue 8 item 10): every run gives the finite true output or a clear refusal.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <string>

#include "support.hpp"

using namespace hils;

namespace {

// The message of the InvalidArgument `f` throws, or "no error".
template <class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "no error";
}

const cases::Case& range_case() { return cases::case_named("ragged_tail"); }

MechanismSpec range_spec() {
  return cases::with_case_geometry(preset("hils"), range_case());
}

}  // namespace

TEST_CASE("a scale that is not a finite positive number is refused naming scale", "[errors]") {
  for (double bad : {std::numeric_limits<double>::infinity(), -1.0,
                     std::numeric_limits<double>::quiet_NaN()}) {
    MechanismSpec spec = preset("hils");
    spec.scale = bad;
    CHECK_THAT(message_of([&] { spec.validate(); }), Catch::StartsWith("scale: expected"));
  }
  MechanismSpec default_scale = preset("hils");
  default_scale.scale = 0.0;  // 0 means 1/sqrt(d)
  CHECK_NOTHROW(default_scale.validate());
}

TEST_CASE("NaN and Inf inputs are refused naming the tensor and the element", "[errors]") {
  const auto spec = range_spec();
  auto inputs = cases::make_inputs<double>(range_case());
  inputs.q[1](5, 2) = std::numeric_limits<double>::quiet_NaN();
  CHECK_THAT(message_of([&] { run_mechanism(spec, inputs); }),
             Catch::Contains("q[1](5, 2)") && Catch::Contains("NaN"));
  inputs = cases::make_inputs<double>(range_case());
  inputs.v[0](7, 3) = -std::numeric_limits<double>::infinity();
  CHECK_THAT(message_of([&] { run_mechanism(spec, inputs); }),
             Catch::Contains("v[0](7, 3)") && Catch::Contains("-Inf"));
}

TEST_CASE("logits beyond the double range are refused because lse is not representable",
          "[errors]") {
  // q and k scaled by 1e200: scale * q . k reaches ~1e400, whose exp and log-sum-exp no double
  // holds (before the check, every output was NaN).
  const auto spec = range_spec();
  auto inputs = cases::make_inputs<double>(range_case());
  for (auto& q : inputs.q) q *= 1e200;
  for (auto& k : inputs.k) k *= 1e200;
  CHECK_THAT(message_of([&] { run_mechanism(spec, inputs); }),
             Catch::StartsWith("q, k: expected") && Catch::Contains("lse"));
  // The same vectors in long double: its range holds these logits, so they are computed.
  auto wide = cases::make_inputs<long double>(range_case());
  for (auto& q : wide.q) q *= 1e200L;
  for (auto& k : wide.k) k *= 1e200L;
  const auto out = run_mechanism(spec, wide);
  for (const auto& head : out.heads) {
    CHECK(head.o.allFinite());
    CHECK(head.lse.allFinite());
  }
}

TEST_CASE("values near the top of the double range give the finite true output", "[range]") {
  // v' = 2^1022 v with v in [1, 2): any sum of two rows of v' overflows a double when formed
  // naively. o is a convex combination of rows of v', so o' = 2^1022 o exactly (powers of two).
  for (const char* name : {"hils", "full", "naive_bsa"}) {
    const MechanismSpec spec = cases::with_case_geometry(preset(name), range_case());
    INFO(spec.name);
    auto inputs = cases::make_inputs<double>(range_case());
    for (auto& v : inputs.v) v = 1.0 + v.array().abs() / (1.0 + v.array().abs());
    RunOptions options;
    options.keep_window = true;
    const auto small = run_mechanism(spec, inputs, options);
    for (auto& v : inputs.v) v *= std::ldexp(1.0, 1022);
    const auto big = run_mechanism(spec, inputs, options);
    for (size_t h = 0; h < big.heads.size(); ++h) {
      CHECK(big.heads[h].o.allFinite());
      CHECK(big.heads[h].o == small.heads[h].o * std::ldexp(1.0, 1022));
      CHECK(big.heads[h].o_window == small.heads[h].o_window * std::ldexp(1.0, 1022));
      CHECK(big.heads[h].lse == small.heads[h].lse);
      CHECK(big.heads[h].fusion_weights == small.heads[h].fusion_weights);
    }
  }
}

TEST_CASE("values at the largest double give finite outputs within the values' range",
          "[range]") {
  // Every v = +-DBL_MAX: o is a convex combination, so |o| <= DBL_MAX; the rounding of the
  // weights (their sum may be 1 + ulp) must not push o past the range.
  constexpr double kTop = std::numeric_limits<double>::max();
  for (const char* name : {"hils", "full", "naive_bsa", "swa"}) {
    const MechanismSpec spec = cases::with_case_geometry(preset(name), range_case());
    INFO(spec.name);
    auto inputs = cases::make_inputs<double>(range_case());
    for (auto& v : inputs.v)
      v = (v.array() < 0).select(-kTop, Matrix<double>::Constant(v.rows(), v.cols(), kTop));
    const auto out = run_mechanism(spec, inputs);
    for (const auto& head : out.heads) {
      CHECK(head.o.allFinite());
      CHECK(head.o.cwiseAbs().maxCoeff() <= kTop);
    }
  }
}

TEST_CASE("the prior rule, not the row count, decides how a prior is positioned", "[positional]") {
  // One chunk: a given prior has one row, like an un-positioned shared one. RoPE must leave the
  // given prior as given (it was rotated as if shared) and rotate the shared one at the landmark.
  const Geometry one_chunk(6, 4, 4, true);
  REQUIRE(one_chunk.n_chunks() == 1);
  const PositionalEncoding rope{PositionalKind::rope, RopePairing::half, 100.0};
  AttentionInputs<double> raw;
  raw.q = {Matrix<double>::Constant(6, 4, 0.5)};
  raw.k = raw.q;
  raw.v = raw.q;
  Matrix<double> mu(1, 4);
  mu << 1.0, -2.0, 0.5, 3.0;
  raw.prior = {mu};
  const auto given = apply_positional_encoding(raw, one_chunk, rope, PriorRule::given);
  CHECK(given.prior[0] == mu);
  const auto shared = apply_positional_encoding(raw, one_chunk, rope, PriorRule::shared);
  Matrix<double> rotated = mu;
  apply_rotary(rotated, {one_chunk.position_id(one_chunk.landmark_slot(0))}, rope);
  REQUIRE(shared.prior[0].rows() == 1);
  CHECK(shared.prior[0] == rotated);
  CHECK(shared.prior[0] != mu);
  // A shared prior becomes one row per chunk; a shared prior of several rows is not a vector.
  const Geometry two_chunks(8, 4, 4, true);
  raw.q = {Matrix<double>::Constant(8, 4, 0.5)};
  raw.k = raw.q;
  raw.v = raw.q;
  CHECK(apply_positional_encoding(raw, two_chunks, rope, PriorRule::shared).prior[0].rows() == 2);
  raw.prior = {mu.replicate(2, 1)};
  const auto shared_rows = [&] {
    apply_positional_encoding(raw, two_chunks, rope, PriorRule::shared);
  };
  CHECK_THAT(message_of(shared_rows), Catch::StartsWith("prior[0]: expected 1 row"));
  const auto given_rows = apply_positional_encoding(raw, two_chunks, rope, PriorRule::given);
  CHECK(given_rows.prior[0] == raw.prior[0]);
  // Without a rule, a prior is refused rather than guessed.
  CHECK_THAT(message_of([&] { apply_positional_encoding(raw, two_chunks, rope); }),
             Catch::StartsWith("prior: expected none"));
}
