// The oracle for backward kernels: correct float and bf16 gradients pass; planted faults fail
// with a message that says what is wrong (a chunk of dk zeroed, the softmax1 term missing, a
// gradient scaled by a wrong sigma); the kernel's own selection is held fixed; bad upstream
// gradients are the caller's error.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>

#include "oracle_support.hpp"

using namespace hils;
using namespace hils::oracle;
using hils::oracle::testing::case_named;
using hils::oracle::testing::float_gradients;
using hils::oracle::testing::float_kernel;

namespace {

// Forward outputs and gradients of a correct kernel in `precision`.
KernelOutputs correct_kernel(const MechanismSpec& spec, const AttentionInputs<double>& inputs,
                             const cases::Case& c,
                             InputPrecision precision = InputPrecision::fp32) {
  KernelOutputs kernel = float_kernel(spec, inputs, precision);
  kernel.gradients = float_gradients(spec, inputs, kernel.selection, cases::seed_of(c.name) ^ 7,
                                     precision);
  return kernel;
}

const TensorReport* report_of(const Verdict& verdict, const std::string& name) {
  for (const auto& t : verdict.tensors)
    if (t.name == name) return &t;
  return nullptr;
}

}  // namespace

TEST_CASE("correct fp32 and bf16 gradients pass for every preset, each gradient compared",
          "[oracle][gradients]") {
  for (const char* name : {"gqa_group4", "ragged_tail_no_landmarks"}) {
    const auto& c = case_named(name);
    const auto inputs = cases::make_inputs<double>(c);
    for (const auto& spec : hils::oracle::testing::specs_for(c))
      for (auto precision : {InputPrecision::fp32, InputPrecision::bf16}) {
        const KernelOutputs kernel = correct_kernel(spec, inputs, c, precision);
        VerifyOptions options;
        options.precision = precision;
        const Verdict verdict = verify(spec, inputs, kernel, options);
        INFO(name << " " << spec.name << " " << to_string(precision) << "\n" << verdict.report());
        CHECK(verdict.passed);
        for (const char* g : {"dq", "dq_retrieval", "dk", "dv"}) {
          const auto* r = report_of(verdict, g);
          REQUIRE(r);
          CHECK(r->count > 0);
          CHECK(r->headroom <= 1.0);
        }
        // The shared prior (no landmarks) has a gradient of its own.
        if (!inputs.prior.empty() && spec.needs_prior() &&
            spec.prior_rule != PriorRule::landmark_query) {
          const auto* r = report_of(verdict, "dprior");
          REQUIRE(r);
          CHECK(r->max_abs > 0.0);  // the float kernel rounds: the comparison is not vacuous
        }
        CHECK_THAT(verdict.report(), Catch::Contains("dk"));
      }
  }
}

TEST_CASE("a chunk of dk zeroed is caught and located", "[oracle][gradients]") {
  for (const char* name : {"gqa_group4", "longer_blocks"}) {
    const auto& c = case_named(name);
    const auto inputs = cases::make_inputs<double>(c);
    for (const char* preset_name : {"naive_bsa", "hils"}) {
      const auto spec = cases::with_case_geometry(preset(preset_name), c);
      KernelOutputs kernel = correct_kernel(spec, inputs, c);
      const int64_t chunk = 2;
      kernel.gradients.dk[1].middleRows(chunk * c.S, c.S).setZero();
      const Verdict verdict = verify(spec, inputs, kernel);
      INFO(name << " " << preset_name << "\n" << verdict.report());
      CHECK_FALSE(verdict.passed);
      const auto* dk = report_of(verdict, "dk");
      REQUIRE(dk);
      CHECK_FALSE(dk->passed);
      CHECK_THAT(dk->diagnosis, Catch::Contains("h=1 rows " + std::to_string(chunk * c.S) + "-" +
                                                std::to_string(chunk * c.S + c.S - 1) +
                                                " (chunk 2)"));
      CHECK(report_of(verdict, "dv")->passed);
      CHECK(report_of(verdict, "dq")->passed);
    }
  }
}

TEST_CASE("gradients without the softmax1 term fail and are recognised", "[oracle][gradients]") {
  for (const char* name : {"gqa_group4", "peaked_attention"}) {
    const auto& c = case_named(name);
    const auto inputs = cases::make_inputs<double>(c);
    MechanismSpec spec = cases::with_case_geometry(preset("hils"), c);
    spec.softmax1 = true;
    MechanismSpec without = spec;
    without.softmax1 = false;
    // The forward is right; the backward forgot the zero logit.
    KernelOutputs kernel = float_kernel(spec, inputs);
    kernel.gradients = float_gradients(without, inputs, kernel.selection, cases::seed_of(c.name));
    const Verdict verdict = verify(spec, inputs, kernel);
    INFO(name << "\n" << verdict.report());
    CHECK_FALSE(verdict.passed);
    CHECK(report_of(verdict, "o")->passed);
    CHECK_THAT(verdict.report(), Catch::Contains("missing the softmax1 term"));
  }
}

TEST_CASE("a gradient scaled by a wrong sigma fails and the factor is named",
          "[oracle][gradients]") {
  const auto& c = case_named("gqa_group4");
  const auto inputs = cases::make_inputs<double>(c);
  for (const char* preset_name : {"full", "hils"}) {
    const auto spec = cases::with_case_geometry(preset(preset_name), c);
    KernelOutputs kernel = correct_kernel(spec, inputs, c);
    // sigma = 1/sqrt(d) taken with the head dim padded to 2d: dq = sigma' dS K, sigma'/sigma
    // = 1/sqrt(2).
    for (auto& dq : kernel.gradients.dq) dq *= 1 / std::sqrt(2.0);
    const Verdict verdict = verify(spec, inputs, kernel);
    INFO(preset_name << "\n" << verdict.report());
    CHECK_FALSE(verdict.passed);
    const auto* dq = report_of(verdict, "dq");
    REQUIRE(dq);
    CHECK_FALSE(dq->passed);
    CHECK_THAT(dq->diagnosis, Catch::Contains("is the reference times 0.7071"));
    CHECK_THAT(dq->diagnosis, Catch::Contains("sigma"));
  }
}

TEST_CASE("gradients are judged with the kernel's own selection held fixed",
          "[oracle][gradients]") {
  const auto& c = case_named("longer_blocks");
  const auto inputs = cases::make_inputs<double>(c);
  const auto spec = cases::with_case_geometry(preset("naive_bsa"), c);
  KernelOutputs kernel = float_kernel(spec, inputs);
  // A kernel whose selection differs from the reference's on the last query (a valid chunk,
  // not the best): its backward, consistent with its own selection, is right.
  const int64_t t = c.T - 1;
  const int64_t candidates = geometry_of(spec, c.T).candidate_count(t);
  IndexMatrix& sel = kernel.selection[0];
  int32_t unused = 0;
  while (std::find(sel.row(t).data(), sel.row(t).data() + spec.K, unused) !=
         sel.row(t).data() + spec.K)
    ++unused;
  REQUIRE(unused < candidates);
  sel(t, 0) = unused;
  std::sort(sel.row(t).data(), sel.row(t).data() + spec.K);
  kernel.gradients = float_gradients(spec, inputs, kernel.selection, 11);
  const Verdict verdict = verify(spec, inputs, kernel);
  INFO(verdict.report());
  for (const char* g : {"dq", "dk", "dv"}) CHECK(report_of(verdict, g)->passed);
  // The same gradients against the reference's selection would fail: the check can tell.
  KernelOutputs without_selection = kernel;
  without_selection.selection.clear();
  const Verdict other = verify(spec, inputs, without_selection);
  CHECK_FALSE(other.passed);
}

TEST_CASE("upstream gradients must be given with the right shape, and do alone is named as "
          "not compared", "[oracle][gradients]") {
  const auto& c = case_named("ragged_tail");
  const auto inputs = cases::make_inputs<double>(c);
  const auto spec = cases::with_case_geometry(preset("hils"), c);
  KernelOutputs kernel = correct_kernel(spec, inputs, c);
  KernelOutputs no_do = kernel;
  no_do.gradients.d_o.clear();
  CHECK_THROWS_WITH(verify(spec, inputs, no_do), Catch::Contains("inputs/do"));
  KernelOutputs short_do = kernel;
  short_do.gradients.d_o.pop_back();
  CHECK_THROWS_WITH(verify(spec, inputs, short_do), Catch::Contains("inputs/do"));
  KernelOutputs bad_dlse = kernel;
  bad_dlse.gradients.d_lse[0](3) = std::nan("");
  CHECK_THROWS_WITH(verify(spec, inputs, bad_dlse), Catch::Contains("inputs/dlse"));
  KernelOutputs only_do = kernel;
  only_do.gradients = {};
  only_do.gradients.d_o = kernel.gradients.d_o;
  const Verdict verdict = verify(spec, inputs, only_do);
  CHECK(verdict.passed);
  CHECK_THAT(verdict.report(), Catch::Contains("not compared: inputs/do"));
  VerifyOptions some_queries;
  some_queries.queries = {0, 5, 9};
  KernelOutputs partial;  // gradients only, but the kernel computed 3 queries
  partial.gradients = kernel.gradients;
  CHECK_THROWS_WITH(verify(spec, inputs, partial, some_queries), Catch::Contains("all T"));
}
