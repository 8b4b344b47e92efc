// The oracle for backward kernels: correct float and bf16 gradients pass; planted faults fail
// with a message that says what is wrong (a chunk of dk zeroed, the softmax1 term missing, a
// gradient scaled by a wrong sigma); the kernel's own selection is held fixed; bad upstream
// gradients are the caller's error.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

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

TEST_CASE("correct fp16 gradients pass for every preset and fail declared fp32",
          "[oracle][gradients]") {
  const auto fp16 = InputPrecision::fp16;
  for (const char* name : {"gqa_group4", "ragged_tail_no_landmarks"}) {
    const auto& c = case_named(name);
    const auto inputs = round_inputs_to(cases::make_inputs<double>(c), fp16);
    for (const auto& spec : hils::oracle::testing::specs_for(c)) {
      const KernelOutputs kernel = correct_kernel(spec, inputs, c, fp16);
      const Verdict verdict = verify(spec, inputs, kernel, {fp16});
      INFO(name << " " << spec.name << "\n" << verdict.report());
      CHECK(verdict.passed);
      for (const char* g : {"dq", "dk", "dv"}) {
        const auto* r = report_of(verdict, g);
        REQUIRE(r);
        CHECK(r->headroom <= 1.0);
      }
      // Stored in fp16 (2^-11), they are far outside fp32's floor.
      const Verdict as_fp32 = verify(spec, inputs, kernel, {InputPrecision::fp32});
      CHECK_FALSE(report_of(as_fp32, "dq")->passed);
    }
  }
}

namespace {

// A FlashAttention-style fp16 backward of causal full attention (the `full` preset), in float
// on the fp16 inputs: P = exp(s - lse) and dS = P (dP - D) are rounded to fp16 before the
// products dV = P^T dO, dQ = sigma dS K, dK = sigma dS^T Q, D = rowsum(dO o) reads the fp16 o,
// and the gradients are stored in fp16. `flush` flushes fp16's subnormals (below 2^-14) to zero,
// the fault of a kernel whose conversions flush them.
KernelOutputs fp16_flash_backward(const AttentionInputs<double>& inputs,
                                  const std::vector<Matrix<double>>& d_o, bool flush) {
  auto half = [flush](float x) {
    const double r = round_to_fp16(x);
    return static_cast<float>(flush && std::fabs(r) < 0x1p-14 ? 0.0 : r);
  };
  const int64_t T = inputs.T(), G = inputs.Hq() / inputs.Hkv();
  const float sigma = 1.0f / std::sqrt(static_cast<float>(inputs.d()));
  KernelOutputs out;
  out.gradients.d_o = d_o;
  for (int64_t g = 0; g < inputs.Hkv(); ++g) {
    out.gradients.dk.push_back(Matrix<double>::Zero(T, inputs.d()));
    out.gradients.dv.push_back(Matrix<double>::Zero(T, inputs.dv()));
  }
  for (int64_t h = 0; h < inputs.Hq(); ++h) {
    const Matrix<float> q = inputs.q[h].cast<float>(), k = inputs.k[h / G].cast<float>(),
                        v = inputs.v[h / G].cast<float>(), dO = d_o[h].cast<float>();
    Matrix<float> P = Matrix<float>::Zero(T, T);
    for (int64_t t = 0; t < T; ++t) {
      const Vector<float> s = sigma * (k.topRows(t + 1) * q.row(t).transpose());
      const float m = s.maxCoeff();
      const float lse = m + std::log((s.array() - m).exp().sum());
      P.row(t).head(t + 1) = (s.array() - lse).exp().transpose();
    }
    const Matrix<float> o = (P * v).unaryExpr(half);
    const Vector<float> D = (dO.array() * o.array()).rowwise().sum();
    const Matrix<float> dS =
        (P.array() * ((dO * v.transpose()).colwise() - D).array()).matrix().unaryExpr(half);
    const Matrix<float> P16 = P.unaryExpr(half);
    out.o.push_back(o.cast<double>());
    out.gradients.dq.push_back((sigma * (dS * k)).cast<double>());
    out.gradients.dk[h / G] += (sigma * (dS.transpose() * q)).cast<double>();
    out.gradients.dv[h / G] += (P16.transpose() * dO).cast<double>();
  }
  for (auto* heads : {&out.gradients.dq, &out.gradients.dk, &out.gradients.dv})
    for (auto& m : *heads) m = m.unaryExpr([&half](double x) { return static_cast<double>(half(x)); });
  return out;
}

}  // namespace

TEST_CASE("an fp16 backward with small upstream gradients needs the floor's subnormal term and "
          "one that flushes subnormals fails", "[oracle][gradients]") {
  // Peaked attention (queries x 6) puts most probabilities below fp16's normal range, and an
  // upstream gradient of ~2^-16 (no loss scaling) most of dS too: their absolute rounding
  // (2^-25 each) is then larger than 4 units of 2^-11 of the gradients themselves.
  const auto fp16 = InputPrecision::fp16;
  const auto& c = case_named("peaked_attention");
  const auto inputs = round_inputs_to(cases::make_inputs<double>(c), fp16);
  const MechanismSpec full = preset("full");
  std::mt19937_64 rng(cases::seed_of("fp16 flash backward"));
  std::normal_distribution<double> gauss(0.0, 0x1p-16);
  std::vector<Matrix<double>> d_o;
  for (int64_t h = 0; h < inputs.Hq(); ++h)
    d_o.push_back(Matrix<double>::NullaryExpr(inputs.T(), inputs.dv(),
                                              [&] { return round_to_fp16(gauss(rng)); }));
  const Verdict verdict = verify(full, inputs, fp16_flash_backward(inputs, d_o, false), {fp16});
  INFO(verdict.report());
  CHECK(verdict.passed);
  // Without the subnormal term some gradient would fail: its error exceeds 2 x the float
  // baseline's + 4 units of 2^-11 of its largest entry.
  bool needs_term = false;
  for (const char* g : {"dq", "dk", "dv"}) {
    const auto* r = report_of(verdict, g);
    REQUIRE(r);
    const double relative_only = r->tolerance - (r->floor - 4.0 * 0x1p-11 * r->magnitude);
    needs_term = needs_term || r->max_abs > relative_only;
  }
  CHECK(needs_term);
  // The same kernel flushing fp16 subnormals to zero errs by up to 2^-14 per probability.
  const Verdict flushed = verify(full, inputs, fp16_flash_backward(inputs, d_o, true), {fp16});
  INFO(flushed.report());
  CHECK_FALSE(flushed.passed);
}
