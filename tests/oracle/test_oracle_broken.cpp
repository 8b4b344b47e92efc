// Broken kernels are caught, each with a message that says what is wrong: a NaN, an all-zero
// output, a shifted window, a missing softmax1 logit, a wrong chunk, malformed selections,
// wrong shapes, a finite score outside V(t), and guard bytes.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>
#include <type_traits>
#include <vector>

#include "oracle_support.hpp"

using namespace hils;
using namespace hils::oracle;
using hils::oracle::testing::case_named;
using hils::oracle::testing::float_kernel;
using hils::oracle::testing::all_queries;
using hils::oracle::testing::ChunkSwap;
using hils::oracle::testing::swap_strongest_for_weakest;

namespace {

// Case names the broken-output tests run on: GQA, peaked and long blocks, landmarks on and off.
const char* const kBrokenCases[] = {"gqa_group4", "peaked_attention", "longer_blocks",
                                    "ragged_tail_no_landmarks"};

MechanismSpec hils_spec(const cases::Case& c) {
  MechanismSpec spec = cases::with_case_geometry(preset("hils"), c);
  if (!c.landmarks) spec.prior_rule = PriorRule::shared;
  return spec;
}

// One output of a kernel made wrong: its finite entry of largest size moved by 1% (at least
// 0.01), or (a selection) its first chunk replaced by one past the last chunk.
template <class Heads>
void move_one_entry(Heads& heads, int64_t n_chunks) {
  auto& first = heads.front();
  if constexpr (std::is_same_v<Heads, std::vector<IndexMatrix>>) {
    first(first.rows() - 1, 0) = static_cast<int32_t>(n_chunks);
  } else {
    Eigen::Index row = 0, col = 0;
    first.unaryExpr([](double x) { return std::isfinite(x) ? std::abs(x) : -1.0; })
        .maxCoeff(&row, &col);
    first(row, col) += 0.01 * std::max(1.0, std::abs(first(row, col)));
  }
}

// Whether the verdict judged output `name` and failed it.
bool failed(const Verdict& verdict, const std::string& name) {
  if (name == "selection") return verdict.selection.compared && !verdict.selection.passed;
  return std::any_of(verdict.tensors.begin(), verdict.tensors.end(),
                     [&](const TensorReport& t) { return t.name == name && !t.passed; });
}

}  // namespace

// kOutputTensors (oracle.hpp) is what hils verify and hils.verify read: an output in it that
// the oracle does not compare (oracle.cpp's compare_*) would be read and silently passed.
TEST_CASE("output table: every output the oracle reads is judged and fails when wrong",
          "[oracle][broken]") {
  const auto& c = case_named("gqa_group4");
  const auto inputs = cases::make_inputs<double>(c);
  const auto spec = hils_spec(c);
  const KernelOutputs kernel = float_kernel(spec, inputs);
  REQUIRE(verify(spec, inputs, kernel).passed);
  const int64_t n_chunks = geometry_of(spec, c.T).n_chunks();
  for_each_output(kernel, [&](const auto& row, const auto& field) {
    INFO("output " << row.name);
    REQUIRE(!field.empty());  // the float kernel gives every output
    KernelOutputs wrong = kernel;
    move_one_entry(wrong.*(row.field), n_chunks);
    const Verdict verdict = verify(spec, inputs, wrong);
    INFO(verdict.report());
    CHECK(failed(verdict, row.name));
    CHECK_FALSE(verdict.passed);
  });
}

TEST_CASE("a NaN in o is caught and located", "[oracle][broken]") {
  for (const char* name : kBrokenCases) {
    const auto& c = case_named(name);
    const auto inputs = cases::make_inputs<double>(c);
    const auto spec = hils_spec(c);
    KernelOutputs kernel = float_kernel(spec, inputs);
    kernel.o[1](5, 2) = std::numeric_limits<double>::quiet_NaN();
    const Verdict verdict = verify(spec, inputs, kernel);
    INFO(verdict.report());
    CHECK_FALSE(verdict.passed);
    CHECK_THAT(verdict.report(), Catch::Contains("o contains NaN at h=1 t=5 col=2"));
  }
}

TEST_CASE("an all-zero output fails", "[oracle][broken]") {
  const auto& c = case_named("gqa_group4");
  const auto inputs = cases::make_inputs<double>(c);
  const auto spec = hils_spec(c);
  KernelOutputs kernel = float_kernel(spec, inputs);
  for (auto& o : kernel.o) o.setZero();
  const Verdict verdict = verify(spec, inputs, kernel);
  CHECK_FALSE(verdict.passed);
  CHECK_THAT(verdict.report(), Catch::Contains("o is all zeros"));
}

TEST_CASE("a shifted window is caught and recognised", "[oracle][broken]") {
  for (const char* name : kBrokenCases) {
    const auto& c = case_named(name);
    const auto inputs = cases::make_inputs<double>(c);
    const auto spec = hils_spec(c);
    KernelOutputs kernel = float_kernel(spec, inputs);
    // The kernel's window edge is one chunk too far left: tau computed with W + S.
    const Geometry shifted(c.T, c.S, c.W + c.S, c.landmarks);
    const float scale = static_cast<float>(logit_scale(spec, c.d));
    const std::vector<int64_t> all = all_queries(c.T);
    for (int64_t h = 0; h < c.Hq; ++h) {
      const int64_t g = h / (c.Hq / c.Hkv);
      const auto w = window_attention<float>(inputs.q[h].cast<float>(), inputs.k[g].cast<float>(),
                                             inputs.v[g].cast<float>(), shifted, scale, all);
      kernel.o_window[h] = w.o.cast<double>();
      kernel.lse_window[h] = w.lse.cast<double>();
    }
    const Verdict verdict = verify(spec, inputs, kernel);
    INFO(verdict.report());
    CHECK_FALSE(verdict.passed);
    std::ostringstream expected;
    expected << "matches a sliding window of W=" << c.W + c.S << " instead of W=" << c.W;
    CHECK_THAT(verdict.report(), Catch::Contains("o_window") && Catch::Contains(expected.str()));
  }
}

TEST_CASE("a missing softmax1 logit is caught and recognised", "[oracle][broken]") {
  for (const char* name : kBrokenCases) {
    const auto& c = case_named(name);
    const auto inputs = cases::make_inputs<double>(c);
    MechanismSpec spec = hils_spec(c);
    spec.softmax1 = true;
    MechanismSpec forgetful = spec;
    forgetful.softmax1 = false;
    const Verdict verdict = verify(spec, inputs, float_kernel(forgetful, inputs));
    INFO(verdict.report());
    CHECK_FALSE(verdict.passed);
    CHECK_THAT(verdict.report(), Catch::Contains("lse: max abs error") &&
                                     Catch::Contains("the kernel is missing the softmax1 logit"));
  }
}

TEST_CASE("one wrong chunk in a selection is caught with its margin", "[oracle][broken]") {
  for (const char* name : kBrokenCases) {
    const auto& c = case_named(name);
    const auto inputs = cases::make_inputs<double>(c);
    const auto spec = hils_spec(c);
    KernelOutputs kernel = float_kernel(spec, inputs);
    // The last query: its best chunk replaced by its worst non-selected candidate.
    REQUIRE(geometry_of(spec, c.T).candidate_count(c.T - 1) > c.K);
    const ChunkSwap swap = swap_strongest_for_weakest(spec, inputs, kernel.selection[0]);
    const int64_t t = swap.t, best = swap.best, worst = swap.worst;
    const Verdict verdict = verify(spec, inputs, kernel);
    INFO(verdict.report());
    CHECK_FALSE(verdict.passed);
    std::ostringstream expected;
    expected << "selection row t=" << t << ", group 0: chunk " << worst << " chosen instead of "
             << best << ", reference margin";
    CHECK_THAT(verdict.report(), Catch::Contains(expected.str()) && Catch::Contains("> bound"));
    CHECK(verdict.selection.rows_differing == 1);
  }
}

TEST_CASE("malformed selections are caught", "[oracle][broken]") {
  const auto& c = case_named("longer_blocks");
  const auto inputs = cases::make_inputs<double>(c);
  const auto spec = hils_spec(c);
  const int64_t t = c.T - 1;
  SECTION("a chunk outside V(t)") {
    KernelOutputs kernel = float_kernel(spec, inputs);
    kernel.selection[1](t, c.K - 1) = static_cast<int32_t>(geometry_of(spec, c.T).n_chunks() - 1);
    const Verdict verdict = verify(spec, inputs, kernel);
    CHECK_FALSE(verdict.passed);
    CHECK_THAT(verdict.report(), Catch::Contains("is not a candidate"));
    CHECK_THAT(verdict.report(), !Catch::Contains("unsigned"));
  }
  SECTION("a -1 padding stored in uint8 (255) is named as one") {
    KernelOutputs kernel = float_kernel(spec, inputs);
    kernel.selection[1](t, c.K - 1) = 255;
    const Verdict verdict = verify(spec, inputs, kernel);
    CHECK_FALSE(verdict.passed);
    CHECK_THAT(verdict.report(),
               Catch::Contains("chunk 255 is not a candidate (V(t) = [0, ") &&
                   Catch::Contains("(255 is uint8's largest value: a -1 padding stored in an "
                                   "unsigned type? store the selection in a signed integer type)"));
  }
  SECTION("a repeated chunk") {
    KernelOutputs kernel = float_kernel(spec, inputs);
    kernel.selection[0](t, 1) = kernel.selection[0](t, 0);
    const Verdict verdict = verify(spec, inputs, kernel);
    CHECK_FALSE(verdict.passed);
    CHECK_THAT(verdict.report(), Catch::Contains("distinct and ascending"));
    CHECK_THAT(verdict.report(), !Catch::Contains("in another order"));  // not a set: no hint
  }
  SECTION("the right chunks in another order (torch.topk's) are named as such") {
    KernelOutputs kernel = float_kernel(spec, inputs);
    std::swap(kernel.selection[0](t, 0), kernel.selection[0](t, c.K - 1));
    const Verdict verdict = verify(spec, inputs, kernel);
    CHECK_FALSE(verdict.passed);
    CHECK_THAT(verdict.report(),
               Catch::Contains("chunks must be distinct and ascending") &&
                   Catch::Contains("(the row is a set of " + std::to_string(c.K) +
                                   " distinct candidates in another order: sort each row, -1 "
                                   "last, or from Python pass selection_order=\"any\")"));
  }
  SECTION("a missing chunk") {
    KernelOutputs kernel = float_kernel(spec, inputs);
    kernel.selection[0](t, c.K - 1) = -1;
    const Verdict verdict = verify(spec, inputs, kernel);
    CHECK_FALSE(verdict.passed);
    CHECK_THAT(verdict.report(), Catch::Contains("chunks selected, expected min(K="));
  }
  SECTION("a wrong shape") {
    KernelOutputs kernel = float_kernel(spec, inputs);
    kernel.selection.pop_back();
    CHECK_FALSE(verify(spec, inputs, kernel).passed);
  }
}

TEST_CASE("wrong shapes and -inf patterns are reported, not thrown", "[oracle][broken]") {
  const auto& c = case_named("gqa_group4");
  const auto inputs = cases::make_inputs<double>(c);
  const auto spec = hils_spec(c);
  SECTION("a head missing") {
    KernelOutputs kernel = float_kernel(spec, inputs);
    kernel.o.pop_back();
    const Verdict verdict = verify(spec, inputs, kernel);
    CHECK_FALSE(verdict.passed);
    CHECK_THAT(verdict.report(), Catch::Contains("o: expected 8 heads, got 7"));
  }
  SECTION("a finite score outside V(t)") {
    KernelOutputs kernel = float_kernel(spec, inputs);
    kernel.surrogate_scores[0](0, 0) = 1.5;  // query 0 has no candidates
    const Verdict verdict = verify(spec, inputs, kernel);
    CHECK_FALSE(verdict.passed);
    CHECK_THAT(verdict.report(), Catch::Contains("should be -inf (chunk outside V(t))"));
  }
  SECTION("the authors' ceil(T/S) column layout is accepted when the extra column is -inf") {
    KernelOutputs kernel = float_kernel(spec, inputs);
    for (auto& s : kernel.surrogate_scores) {
      Matrix<double> wider(s.rows(), s.cols() + 1);
      wider << s, Matrix<double>::Constant(s.rows(), 1, -std::numeric_limits<double>::infinity());
      s = wider;
    }
    CHECK(verify(spec, inputs, kernel).passed);
    kernel.surrogate_scores[0](c.T - 1, kernel.surrogate_scores[0].cols() - 1) = 0.0;
    CHECK_FALSE(verify(spec, inputs, kernel).passed);
  }
  SECTION("empty kernel outputs") {
    CHECK_FALSE(verify(spec, inputs, KernelOutputs{}).passed);
  }
}

TEST_CASE("guard bytes: the first overwritten byte is found", "[oracle]") {
  unsigned char guard[64];
  std::memset(guard, 0xA5, sizeof guard);
  CHECK_FALSE(first_guard_violation(guard, sizeof guard, 0xA5).has_value());
  guard[17] = 0;
  REQUIRE(first_guard_violation(guard, sizeof guard, 0xA5).has_value());
  CHECK(*first_guard_violation(guard, sizeof guard, 0xA5) == 17);
}

// A Verifier (the reference runs once) judges each kernel exactly as verify() does, and one
// kernel's verdict leaves nothing behind for the next: good, broken, good again, on the same
// Verifier, give verify()'s three reports byte for byte, with fp32 and bf16 options.
TEST_CASE("a Verifier gives verify's verdicts, kernel after kernel", "[oracle][broken]") {
  const auto& c = case_named("gqa_group4");
  const auto inputs = cases::make_inputs<double>(c);
  const auto spec = hils_spec(c);
  for (InputPrecision precision : {InputPrecision::fp32, InputPrecision::bf16}) {
    VerifyOptions options;
    options.precision = precision;
    const KernelOutputs good = float_kernel(spec, inputs, precision);
    KernelOutputs broken = good;
    broken.o[1](5, 2) = std::numeric_limits<double>::quiet_NaN();
    broken.lse[0](3) += 1.0;
    const Verifier verifier(spec, inputs, options);
    for (const KernelOutputs* kernel : std::vector<const KernelOutputs*>{&good, &broken, &good}) {
      const Verdict once = verify(spec, inputs, *kernel, options);
      const Verdict reused = verifier.verify(*kernel);
      INFO(reused.report());
      CHECK(reused.passed == (kernel == &good));
      CHECK(reused.passed == once.passed);
      CHECK(reused.report() == once.report());
    }
  }
}
