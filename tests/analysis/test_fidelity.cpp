// The fidelity study on case-table inputs: reference/SEMANTICS.md §3's Taylor gap = KL identity,
// exact scores score perfectly, the analysis' own flat fusion agrees with the reference's, chunk
// statistics bracket the true log-mass (Eq. 5), summaries match their units, and a resumed run
// redoes nothing.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <string_view>

#include "case_inputs.hpp"
#include "study_support.hpp"
#include "hils/analysis/chunk_stats.hpp"
#include "hils/analysis/fidelity.hpp"
#include "hils/analysis/metrics.hpp"

using namespace hils;
using namespace hils::analysis;
using hils::analysis::testing::geometry_of_case;
using hils::cases::case_named;

namespace {

FidelityOptions options_for(const cases::Case& c, std::vector<std::string> names) {
  FidelityOptions o;
  o.geometry = geometry_of_case(c);
  o.prior = {c.landmarks ? PriorRule::landmark_query : PriorRule::given,
             c.landmarks ? PriorSource::inputs : PriorSource::chunk_mean_query};
  for (const auto& n : names) o.mechanisms.push_back(study_mechanism(n, o.prior.rule));
  o.queries_per_unit = 16;
  return o;
}

StudySource source_for(const cases::Case& c, int64_t layers) {
  return {c.name, layers, {c.T}, [&c](int64_t layer, int64_t) {
            return cases::make_inputs<double>(c, static_cast<uint64_t>(layer));
          }};
}

}  // namespace

TEST_CASE("Taylor gap equals KL(p_mu || p_q) and is never negative (reference/SEMANTICS.md §3)",
          "[fidelity]") {
  for (const char* name : {"gqa_group4", "peaked_attention", "ragged_tail_no_landmarks"}) {
    const auto& c = case_named(name);
    auto in = cases::make_inputs<double>(c);
    const Geometry geometry(c.T, c.S, c.W, c.landmarks);
    fill_prior(in, geometry, PriorSource::chunk_mean_query);
    const auto queries = sample_queries(geometry, c.K, 32);
    REQUIRE(!queries.empty());
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.d));
    const auto check = taylor_kl_check(in.q[0], in.k[0], in.prior[0], geometry, scale, queries);
    INFO(name << ": pairs " << check.pairs << " max |gap-KL| " << check.max_abs_deviation);
    CHECK(check.pairs > 10);
    CHECK(check.max_abs_deviation < 1e-10);
    CHECK(check.min_gap > -1e-12);
    CHECK(check.max_gap > 1e-3);  // a real gap exists: the check is not vacuous
  }
}

TEST_CASE("chunk logit statistics bracket the exact log-mass (Eq. 5 regimes)", "[fidelity]") {
  const auto& c = case_named("longer_blocks");
  const auto in = cases::make_inputs<double>(c);
  const Geometry geometry(c.T, c.S, c.W, c.landmarks);
  const auto queries = sample_queries(geometry, c.K, 24);
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.d));
  const auto stats = chunk_logit_stats(in.q[1], in.k[0], geometry, scale, queries);
  const auto L = exact_chunk_log_mass<double>(in.q[1], in.k[0], geometry, scale, queries);
  const double log_n = std::log(static_cast<double>(geometry.tokens_per_chunk()));
  int64_t pairs = 0;
  for (size_t i = 0; i < queries.size(); ++i)
    for (int64_t cc = 0; cc < geometry.candidate_count(queries[i]); ++cc, ++pairs) {
      CHECK(stats.max_logit(i, cc) <= L(i, cc) + 1e-12);
      CHECK(L(i, cc) <= stats.max_logit(i, cc) + log_n + 1e-12);
      CHECK(stats.mean_logit(i, cc) + log_n <= L(i, cc) + 1e-12);  // Jensen
      // H(p_q) = L - E_p[s]: entropy ties the two regimes together.
      CHECK(stats.entropy(i, cc) >= -1e-12);
      CHECK(stats.entropy(i, cc) <= log_n + 1e-12);
    }
  CHECK(pairs > 100);
  CHECK(std::isinf(stats.max_logit(0, geometry.n_chunks() - 1)));  // outside V(t) of an early query
}

TEST_CASE("flat fusion over naive BSA's selection reproduces the reference", "[fidelity]") {
  const auto& c = case_named("gqa_group4");
  const auto in = cases::make_inputs<double>(c);
  auto spec = cases::with_case_geometry(preset("naive_bsa"), c);
  const Geometry geometry(c.T, c.S, c.W, c.landmarks);
  RunOptions run;
  run.queries = sample_queries(geometry, c.K, 40);
  const auto out = run_mechanism<double>(spec, in, run);
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.d));
  const int64_t G = c.Hq / c.Hkv;
  for (int64_t h = 0; h < c.Hq; ++h) {
    const auto o = flat_fusion_output(in.q[h], in.k[h / G], in.v[h / G], geometry, scale,
                                      run.queries, out.selection[h / G]);
    CHECK(relative_error(o, out.heads[h].o) < 1e-12);
  }
  // A different selection gives a different output: the comparison can fail.
  IndexMatrix none = IndexMatrix::Constant(out.selection[0].rows(), c.K, -1);
  const auto o_window = flat_fusion_output(in.q[0], in.k[0], in.v[0], geometry, scale,
                                           run.queries, none);
  CHECK(relative_error(o_window, out.heads[0].o) > 1e-3);
}

TEST_CASE("fidelity unit: exact scores are perfect, surrogates are not", "[fidelity]") {
  const auto& c = case_named("gqa_group4");
  const auto in = cases::make_inputs<double>(c);
  auto options = options_for(c, {"naive_bsa", "mean", "taylor_entropy", "max_logit"});
  MemorySink sink;
  const auto kl = run_fidelity_unit(in, 0, 1, options, sink);
  CHECK(kl.max_abs_deviation < 1e-10);
  CHECK(sink.is_complete("T131/layer0/group1"));
  const std::string head = "T131/layer0/group1/head4/";
  REQUIRE(sink.read(head + "naive_bsa/spearman"));
  const auto exact_rho = *sink.read(head + "naive_bsa/spearman");
  const auto exact_recall = *sink.read(head + "naive_bsa/topk_recall");
  const auto exact_gap = *sink.read(head + "naive_bsa/gap_mean");
  for (int64_t i = 0; i < exact_rho.rows(); ++i) {
    CHECK(exact_recall(i, 0) == 1.0);
    CHECK(std::abs(exact_gap(i, 0)) < 1e-12);
    if (!std::isnan(exact_rho(i, 0))) CHECK(exact_rho(i, 0) == Approx(1.0));
  }
  const auto mean_gap = *sink.read(head + "mean/gap_mean");
  CHECK(mean_gap.mean() > 0.5);  // mean pooling sits ~log|T_c| below L
  const auto mean_recall = *sink.read(head + "mean/topk_recall");
  CHECK(mean_recall.mean() < 1.0);
  const auto covered = *sink.read(head + "taylor_entropy/covered_mass");
  CHECK(covered.maxCoeff() <= 1.0 + 1e-12);
  CHECK(covered.minCoeff() > 0.0);
  REQUIRE(sink.read(head + "max_logit/surrogate"));
  CHECK(!sink.read("T131/layer0/group1/head0/mean/spearman"));  // head 0 is group 0's
}

// kFidelityMetrics (analysis/src/fidelity.cpp): each row reaches every head of every mechanism
// with one value per sampled query and its meaning, and the study's summaries. A row's own
// mathematics is checked by its own test (as the exact scores' above).
TEST_CASE("fidelity metric table: every metric is written per query with its meaning and summarised",
          "[fidelity]") {
  const auto& c = case_named("ragged_tail_no_landmarks");
  auto options = options_for(c, {"mean", "naive_bsa"});
  options.keep_scores = false;
  MemorySink sink;
  run_fidelity_study(source_for(c, 1), options, sink);
  REQUIRE(!fidelity_metrics().empty());
  const auto queries = *sink.read("T77/layer0/group0/queries");
  for (const auto& metric : fidelity_metrics()) {
    for (const auto& mechanism : {"mean", "naive_bsa"}) {
      INFO("metric " << metric << ", mechanism " << mechanism);
      for (int64_t h = 0; h < c.Hq; ++h) {
        const auto path = "T77/layer0/group" + std::to_string(h / (c.Hq / c.Hkv)) + "/head" +
                          std::to_string(h) + "/" + mechanism + "/" + metric;
        const auto values = sink.read(path);
        REQUIRE(values);
        CHECK(values->rows() == queries.rows());
        CHECK(!sink.meanings.at(path).empty());
      }
      const auto summary = sink.read("summary/" + std::string(mechanism) + "/" + metric);
      REQUIRE(summary);
      CHECK(summary->cols() == 8);
      CHECK(sink.read("summary/" + std::string(mechanism) + "/" + metric + "_per_head"));
    }
  }
}

TEST_CASE("fidelity unit: a context with no retrieval candidate is refused naming T",
          "[fidelity][errors]") {
  const auto& c = case_named("gqa_group4");
  const auto in = cases::make_inputs<double>(c);
  auto options = options_for(c, {"naive_bsa"});
  options.geometry.W = c.T;  // the window covers every slot: no query has a candidate chunk
  MemorySink sink;
  CHECK_THROWS_WITH(run_fidelity_unit(in, 0, 0, options, sink),
                    Catch::Contains("context length T=131") && Catch::Contains("T > W + S"));
}

TEST_CASE("fidelity study: summaries match the units and a resumed run redoes nothing",
          "[fidelity]") {
  const auto& c = case_named("ragged_tail_no_landmarks");
  auto options = options_for(c, {"mean", "taylor_entropy"});
  options.keep_scores = false;
  const auto source = source_for(c, 2);
  MemorySink sink;
  const auto report = run_fidelity_study(source, options, sink);
  CHECK(report.units_run == 2 * c.Hkv);
  CHECK(report.kl_ok);
  CHECK(!sink.read("T77/layer0/group0/head0/mean/surrogate"));  // keep_scores off
  const auto per_head = *sink.read("summary/mean/topk_recall_per_head");
  REQUIRE(per_head.cols() == 2 * c.Hq);
  const auto unit = *sink.read("T77/layer1/group1/head3/mean/topk_recall");
  CHECK(per_head(0, 1 * c.Hq + 3) == Approx(unit.mean()));
  const auto summary = *sink.read("summary/mean/topk_recall");
  CHECK(summary(0, 0) == 2 * c.Hq);
  CHECK(summary(0, 1) == Approx(per_head.mean()));
  CHECK(summary(0, 5) <= summary(0, 1));
  CHECK(summary(0, 6) >= summary(0, 1));

  const int64_t writes = sink.writes;
  const auto again = run_fidelity_study(source, options, sink);
  CHECK(again.units_run == 0);
  CHECK(again.units_skipped == 2 * c.Hkv);
  CHECK(sink.writes == writes);
}

TEST_CASE("tail queries are the last eligible slots, found from the end", "[fidelity]") {
  // T = 200 with landmarks (S = 8, W = 16): every attendable slot with a candidate, in order.
  const Geometry small(200, 8, 16, true);
  std::vector<int64_t> eligible;
  for (int64_t t = 0; t < small.T(); ++t)
    if (small.attendable(t) && small.candidate_count(t) > 0) eligible.push_back(t);
  REQUIRE(eligible.size() > 3);
  CHECK(analysis::tail_queries(small, 3) ==
        std::vector<int64_t>(eligible.end() - 3, eligible.end()));
  CHECK(analysis::tail_queries(small, 100000) == eligible);
  // T = 1e11: was a list of every slot (a hang, then out of memory) for a 4-query answer.
  const Geometry huge(100'000'000'000, 64, 512, true);
  const auto last = analysis::tail_queries(huge, 4);
  REQUIRE(last.size() == 4);
  CHECK(last.back() == huge.T() - 2);  // the final slot is a landmark
  CHECK(std::is_sorted(last.begin(), last.end()));
}
