// Properties of reference/SEMANTICS.md §3–5 over the case table; each one breaks under a wrong
// implementation.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <tuple>
#include <vector>

#include "support.hpp"

using namespace hils;
using hils::testing::relative_error;

namespace {

constexpr double kExact = 1e-12;  // identities that hold up to double rounding

// The spec with K large enough to take every candidate chunk.
MechanismSpec covering(MechanismSpec spec, const cases::Case& c) {
  spec.K = std::max<int64_t>(1, c.T / c.S);
  return spec;
}

// Logits s(t,j) of slot t against the tokens of chunk c, computed directly.
std::vector<double> chunk_logits(const Matrix<double>& q, const Matrix<double>& k,
                                 const Geometry& g, int64_t t, int64_t c, double scale) {
  std::vector<double> s;
  for (int64_t j = c * g.S(); j < (c + 1) * g.S(); ++j)
    if (g.attendable(j)) s.push_back(scale * q.row(t).dot(k.row(j)));
  return s;
}

double log_sum_exp(const std::vector<double>& x) {
  const double m = *std::max_element(x.begin(), x.end());
  double sum = 0;
  for (double v : x) sum += std::exp(v - m);
  return m + std::log(sum);
}

}  // namespace

TEST_CASE("flat and exact-hierarchical fusion with K >= |V(t)| equal full attention", "[properties]") {
  for (const auto& c : cases::kCaseTable) {
    INFO("case " << c.name);
    const auto inputs = cases::make_inputs<double>(c);
    auto full = run_mechanism(cases::with_case_geometry(preset("full"), c), inputs);
    MechanismSpec exact_hier = preset("naive_bsa");
    exact_hier.fusion = Fusion::hierarchical;
    for (MechanismSpec spec : {preset("naive_bsa"), preset("nsa"), exact_hier}) {
      INFO("spec " << describe(spec));
      auto out = run_mechanism(covering(cases::with_case_geometry(spec, c), c), inputs);
      for (int64_t h = 0; h < c.Hq; ++h) {
        CHECK(relative_error(out.heads[h].o, full.heads[h].o) < kExact);
        CHECK(relative_error(out.heads[h].lse, full.heads[h].lse) < kExact);
      }
    }
  }
}

TEST_CASE("a selecting mechanism with K < |V(t)| differs from full attention", "[properties]") {
  // Guards the test above against a fusion that ignores the selection altogether.
  const auto& c = cases::kCaseTable[10];  // flat_attention: T = 239, S = 16, K = 4
  const auto inputs = cases::make_inputs<double>(c);
  auto full = run_mechanism(cases::with_case_geometry(preset("full"), c), inputs);
  auto bsa = run_mechanism(cases::with_case_geometry(preset("naive_bsa"), c), inputs);
  CHECK(relative_error(bsa.heads[0].o, full.heads[0].o) > 1e-6);
}

TEST_CASE("Taylor gap L - s_hat equals KL(p_mu || p_q) >= 0 and vanishes at mu = q", "[properties]") {
  for (const auto& c : cases::kCaseTable) {
    const Geometry g(c.T, c.S, c.W, c.landmarks);
    if (g.n_chunks() == 0) continue;
    INFO("case " << c.name);
    auto inputs = cases::make_inputs<double>(c);
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.d));
    const auto& q = inputs.q[0];
    const auto& k = inputs.k[0];
    // Prior of chunk c: the query of a fixed slot, so that slot's gap vanishes for every chunk.
    const int64_t anchor = c.T - 1;
    Matrix<double> prior = inputs.q[0].row(0).replicate(g.n_chunks(), 1);
    for (int64_t ch = 0; ch < g.n_chunks(); ch += 2) prior.row(ch) = q.row(anchor);
    auto summaries = summarize(k, prior, KeyRule::taylor, BiasRule::entropy, g, scale);
    auto s_hat = surrogate_scores(q, summaries, g, scale, {});
    auto L = exact_chunk_log_mass(q, k, g, scale, {});
    for (int64_t t = 0; t < c.T; ++t)
      for (int64_t ch = 0; ch < g.candidate_count(t); ++ch) {
        auto s_q = chunk_logits(prior, k, g, ch, ch, scale);  // row ch of prior is mu_c
        auto s_t = chunk_logits(q, k, g, t, ch, scale);
        const double lse_mu = log_sum_exp(s_q), lse_q = log_sum_exp(s_t);
        double kl = 0;
        for (size_t j = 0; j < s_q.size(); ++j) {
          const double log_pm = s_q[j] - lse_mu, log_pq = s_t[j] - lse_q;
          kl += std::exp(log_pm) * (log_pm - log_pq);
        }
        const double gap = L(t, ch) - s_hat(t, ch);
        CHECK(gap == Approx(kl).margin(1e-11));
        CHECK(gap >= -1e-12);
        if (t == anchor && ch % 2 == 0) CHECK(std::abs(gap) < 1e-11);
      }
  }
}

TEST_CASE("the mean rule's score is the mean logit (Eq. 6)", "[properties]") {
  for (const auto& c : cases::kCaseTable) {
    const Geometry g(c.T, c.S, c.W, c.landmarks);
    INFO("case " << c.name);
    auto inputs = cases::make_inputs<double>(c);
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.d));
    auto summaries = summarize(inputs.k[0], Matrix<double>(), KeyRule::mean, BiasRule::none, g, scale);
    auto s_hat = surrogate_scores(inputs.q[0], summaries, g, scale, {});
    for (int64_t t = 0; t < c.T; ++t)
      for (int64_t ch = 0; ch < g.candidate_count(t); ++ch) {
        auto s = chunk_logits(inputs.q[0], inputs.k[0], g, t, ch, scale);
        const double mean = std::accumulate(s.begin(), s.end(), 0.0) / static_cast<double>(s.size());
        CHECK(s_hat(t, ch) == Approx(mean).margin(1e-12));
      }
  }
}

TEST_CASE("the two regimes of Eq. 5 hold numerically", "[properties]") {
  const auto& c = cases::kCaseTable[10];  // S = 16, d = 32
  const Geometry g(c.T, c.S, c.W, c.landmarks);
  auto inputs = cases::make_inputs<double>(c);
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.d));
  const int64_t t = c.T - 1;
  for (double gain : {1e-3, 30.0}) {
    Matrix<double> q = inputs.q[0] * (gain / c.query_gain);
    auto L = exact_chunk_log_mass(q, inputs.k[0], g, scale, {t});
    for (int64_t ch = 0; ch < g.candidate_count(t); ++ch) {
      auto s = chunk_logits(q, inputs.k[0], g, t, ch, scale);
      const double n = static_cast<double>(s.size());
      const double mean = std::accumulate(s.begin(), s.end(), 0.0) / n;
      std::vector<double> sorted = s;
      std::sort(sorted.rbegin(), sorted.rend());
      if (gain < 1) {
        // Nearly uniform: L = mean + log n + sum(delta^2) / (2n) + O(|delta|^3).
        double var = 0, cube = 0;
        for (double v : s) {
          var += (v - mean) * (v - mean);
          cube = std::max(cube, std::abs(v - mean));
        }
        CHECK(std::abs(L(0, ch) - (mean + std::log(n))) < 1e-4);
        CHECK(std::abs(L(0, ch) - (mean + std::log(n) + var / (2 * n))) < cube * cube * cube + 1e-14);
      } else {
        // One logit dominates: 0 <= L - max <= log(1 + (n-1) exp(-(max - second))).
        const double excess = L(0, ch) - sorted[0];
        CHECK(excess >= 0);
        CHECK(excess <= std::log1p((n - 1) * std::exp(-(sorted[0] - sorted[1]))) + 1e-12);
        if (sorted[0] - sorted[1] > 8) CHECK(excess < (n - 1) * std::exp(-8.0));
      }
    }
  }
}

TEST_CASE("landmark keys and values never get weight", "[properties]") {
  for (const auto& c : cases::kCaseTable) {
    if (!c.landmarks) continue;
    INFO("case " << c.name);
    const Geometry g(c.T, c.S, c.W, true);
    const auto inputs = cases::make_inputs<double>(c);
    auto poisoned = inputs;
    for (int64_t j = 0; j < c.T; ++j) {
      if (!g.is_landmark(j)) continue;
      for (auto& v : poisoned.v) v.row(j).setConstant(1e6);
      for (auto& k : poisoned.k) k.row(j) *= 50.0;
    }
    for (const auto& base : hils::testing::all_specs()) {
      auto spec = hils::testing::spec_for_case(base, c);
      if (!spec) continue;
      INFO("spec " << spec->name);
      auto clean = run_mechanism(*spec, inputs);
      // Values at landmarks never matter; keys at landmarks matter only to landmark_key scoring.
      auto only_v = inputs;
      only_v.v = poisoned.v;
      auto out = run_mechanism(*spec, spec->key_rule == KeyRule::landmark_key && spec->selects()
                                          ? only_v
                                          : poisoned);
      for (int64_t h = 0; h < c.Hq; ++h) {
        CHECK(out.heads[h].o == clean.heads[h].o);
        CHECK(out.heads[h].lse == clean.heads[h].lse);
      }
    }
  }
}

TEST_CASE("G = 1 selects each head's own top-K and GQA shares one selection per group", "[properties]") {
  for (const auto& c : cases::kCaseTable) {
    if (c.K == 0) continue;
    INFO("case " << c.name);
    const auto inputs = cases::make_inputs<double>(c);
    const int64_t G = c.Hq / c.Hkv;
    auto spec = hils::testing::spec_for_case(preset("hils"), c);
    if (!spec) spec = hils::testing::spec_for_case(preset("nsa"), c);
    RunOptions keep;
    keep.keep_surrogate_scores = true;
    keep.keep_window = true;
    auto out = run_mechanism(*spec, inputs, keep);
    const Geometry g(c.T, c.S, c.W, c.landmarks);
    for (int64_t grp = 0; grp < c.Hkv; ++grp)
      for (int64_t t = 0; t < c.T; ++t) {
        // Group score by hand: max over heads of s_hat - log Z_hat.
        const int64_t n = g.candidate_count(t);
        std::vector<double> r(static_cast<size_t>(n), -INFINITY);
        for (int64_t h = grp * G; h < (grp + 1) * G; ++h) {
          std::vector<double> terms{out.heads[h].lse_window(t)};
          for (int64_t ch = 0; ch < n; ++ch) terms.push_back(out.heads[h].surrogate_scores(t, ch));
          const double log_z = log_sum_exp(terms);
          for (int64_t ch = 0; ch < n; ++ch)
            r[ch] = std::max(r[ch], out.heads[h].surrogate_scores(t, ch) - log_z);
        }
        std::vector<int32_t> order(static_cast<size_t>(n));
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return r[a] > r[b]; });
        order.resize(static_cast<size_t>(std::min<int64_t>(n, c.K)));
        std::sort(order.begin(), order.end());
        for (int64_t s = 0; s < c.K; ++s)
          CHECK(out.selection[grp](t, s) == (s < static_cast<int64_t>(order.size()) ? order[s] : -1));
      }
    // G = 1: every query head alone in its group selects by its own s_hat ordering.
    auto per_head = inputs;
    per_head.k.clear();
    per_head.v.clear();
    for (int64_t h = 0; h < c.Hq; ++h) {
      per_head.k.push_back(inputs.k[h / G]);
      per_head.v.push_back(inputs.v[h / G]);
    }
    auto solo = run_mechanism(*spec, per_head, keep);
    for (int64_t h = 0; h < c.Hq; ++h)
      for (int64_t t = 0; t < c.T; ++t) {
        const int64_t n = g.candidate_count(t);
        std::vector<int32_t> order(static_cast<size_t>(n));
        std::iota(order.begin(), order.end(), 0);
        const auto& s = solo.heads[h].surrogate_scores;
        std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return s(t, a) > s(t, b); });
        order.resize(static_cast<size_t>(std::min<int64_t>(n, c.K)));
        std::sort(order.begin(), order.end());
        for (size_t i = 0; i < order.size(); ++i) CHECK(solo.selection[h](t, i) == order[i]);
      }
  }
}

TEST_CASE("ties go to the lower chunk index and short rows are padded with -1", "[properties]") {
  const auto& c = cases::kCaseTable[7];  // k_covers_all: T = 150, S = 8, W = 16
  auto inputs = cases::make_inputs<double>(c);
  // Identical keys in every chunk, and identical retrieval queries at the landmark slots (the
  // HiLS prior): every chunk gets the same score under every rule.
  for (auto& k : inputs.k)
    for (int64_t j = 0; j < c.T; ++j) k.row(j) = k.row(j % c.S);
  for (auto& q : inputs.q_retrieval)
    for (int64_t j = c.S - 1; j < c.T; j += c.S) q.row(j) = q.row(c.S - 1);
  for (const char* name : {"naive_bsa", "nsa", "hils", "lmk"}) {
    INFO("preset " << name);
    MechanismSpec spec = cases::with_case_geometry(preset(name), c);
    spec.K = 3;
    auto out = run_mechanism(spec, inputs);
    const Geometry g(c.T, c.S, c.W, c.landmarks);
    for (int64_t t = 0; t < c.T; ++t) {
      const int64_t n = g.candidate_count(t);
      for (int64_t s = 0; s < 3; ++s) CHECK(out.selection[0](t, s) == (s < n ? s : -1));
    }
  }
}

TEST_CASE("K = 0 and an empty candidate set fall back to the window", "[properties]") {
  const auto& c = cases::kCaseTable[6];  // k_zero
  const auto inputs = cases::make_inputs<double>(c);
  auto swa = run_mechanism(cases::with_case_geometry(preset("swa"), c), inputs);
  for (const char* name : {"naive_bsa", "hils"}) {
    auto out = run_mechanism(cases::with_case_geometry(preset(name), c), inputs);
    CHECK(out.selection[0].cols() == 0);
    for (int64_t h = 0; h < c.Hq; ++h) {
      CHECK(relative_error(out.heads[h].o, swa.heads[h].o) < kExact);
      CHECK(relative_error(out.heads[h].lse, swa.heads[h].lse) < kExact);
    }
  }
}

TEST_CASE("fusion holds the selected chunks' outputs only, however far K exceeds them",
          "[properties]") {
  // K = 2^22 selection slots of which two hold chunks, dv = 2^16: the fusion held a K x dv
  // matrix (2 TiB here; 20 GB per thread at the K the memory check admitted for a study at
  // T = 1024) and took minutes at K = 1e6. The slots beyond the chunks change only the padding.
  const cases::Case c{"fusion_huge_k", 16, 8, 8, 1, 1, 1, 4, int64_t{1} << 16, false, 1.0};
  const auto in = cases::make_inputs<double>(c);
  const Geometry geometry(c.T, c.S, c.W, c.landmarks);
  const int64_t K = int64_t{1} << 22;
  std::vector<int32_t> padded(static_cast<size_t>(K), -1), compact = {0, 1};
  padded[5] = 0, padded[K - 1] = 1;  // padding anywhere (FusionRow)
  const std::vector<double> scores = {0.7, -0.4};
  const RowVector<double> o_window = in.v[0].row(3);
  for (const Fusion fusion : {Fusion::flat, Fusion::hierarchical}) {
    MechanismSpec spec = preset("naive_bsa");
    spec.fusion = fusion;
    auto fused = [&](const std::vector<int32_t>& selected) {
      const auto k_slots = static_cast<int64_t>(selected.size());
      const FusionRow<double> row{in.q[0].row(c.T - 1).transpose(), selected.data(), k_slots,
                                  scores.data(), 0.3, o_window};
      RowVector<double> o(c.dv), weights(k_slots + 2);
      double lse = 0;
      fuse<double>(spec, row, in.k[0], in.v[0], geometry, 0.5, o, lse, weights);
      return std::make_tuple(o, lse, weights);
    };
    const auto [o_big, lse_big, w_big] = fused(padded);
    const auto [o_small, lse_small, w_small] = fused(compact);
    INFO("fusion " << to_string(fusion));
    CHECK(relative_error(o_big, o_small) <= kExact);
    CHECK(std::abs(lse_big - lse_small) <= kExact * std::abs(lse_small));
    CHECK(std::abs(w_big(5) - w_small(0)) <= kExact);
    CHECK(std::abs(w_big(K - 1) - w_small(1)) <= kExact);
    CHECK(std::abs(w_big(K) - w_small(2)) <= kExact);  // the window
    CHECK(w_big.head(K - 1).sum() == w_big(5));        // every padding slot weighs 0
  }
}

TEST_CASE("fuse refuses buffers and arrays that do not fit the row, before writing any",
          "[properties][errors]") {
  // A weights buffer shorter than K + 2 (or o shorter than dv) was written past its end, and
  // hierarchical fusion with null scores read through the null pointer (a segfault).
  const cases::Case c{"fuse_errors", 32, 8, 8, 1, 1, 1, 8, 8, false, 1.0};
  const auto in = cases::make_inputs<double>(c);
  const Geometry geometry(c.T, c.S, c.W, c.landmarks);
  const std::vector<int32_t> selected = {0, 1};
  const std::vector<double> scores = {0.7, -0.4, 0.1, 0.2};
  const RowVector<double> o_window = in.v[0].row(30);
  MechanismSpec spec = preset("hils");
  const auto call = [&](int64_t o_size, int64_t w_size, const double* s,
                        const Matrix<double>& k) {
    const FusionRow<double> row{in.q[0].row(30).transpose(), selected.data(), 2, s, 0.3,
                                o_window};
    RowVector<double> o(o_size), weights(w_size);
    double lse = 0;
    fuse<double>(spec, row, k, in.v[0], geometry, 0.5, o, lse, weights);
  };
  CHECK_NOTHROW(call(c.dv, 4, scores.data(), in.k[0]));
  CHECK_THROWS_WITH(call(c.dv, 3, scores.data(), in.k[0]),
                    "weights: expected K + 2 = 4 entries, got 3");
  CHECK_THROWS_WITH(call(c.dv - 1, 4, scores.data(), in.k[0]),
                    "o: expected dv = 8 entries (v's columns), got 7");
  CHECK_THROWS_WITH(call(c.dv, 4, nullptr, in.k[0]),
                    "row.scores: expected the surrogate scores of every chunk for hierarchical "
                    "fusion, got null");
  CHECK_THROWS_WITH(call(c.dv, 4, scores.data(), in.k[0].topRows(16)),
                    "k, v: expected T = 32 rows each (the geometry's slots), got [16 x 8] and "
                    "[32 x 8]");
  // No score is read by flat fusion (FusionRow), nor for a row without a selected chunk (the
  // oracle's rows of a case with no complete chunk).
  const std::vector<int32_t> padding = {-1, -1};
  const FusionRow<double> none{in.q[0].row(3).transpose(), padding.data(), 2, nullptr, 0.3,
                               o_window};
  RowVector<double> o(c.dv), weights(4);
  double lse = 0;
  CHECK_NOTHROW(fuse<double>(spec, none, in.k[0], in.v[0], geometry, 0.5, o, lse, weights));
  spec.fusion = Fusion::flat;
  CHECK_NOTHROW(call(c.dv, 4, nullptr, in.k[0]));
}

TEST_CASE("resolve_prior refuses a head or geometry its inputs do not have", "[properties][errors]") {
  // It read q~ rows by the geometry's landmark slots (a geometry longer than the inputs: past
  // the end, a segfault) and q~ or the prior of any head index, without a check.
  const cases::Case c{"prior_errors", 32, 8, 8, 1, 2, 1, 8, 8, true, 1.0};
  auto in = cases::make_inputs<double>(c);
  MechanismSpec spec = preset("hils");
  const Geometry geometry(c.T, c.S, c.W, c.landmarks);
  CHECK(resolve_prior(in, 1, spec, geometry).rows() == geometry.n_chunks());
  CHECK_THROWS_WITH(resolve_prior(in, 0, spec, Geometry(4096, c.S, c.W, c.landmarks)),
                    "geometry.T: expected the inputs' 32 slots, got 4096");
  CHECK_THROWS_WITH(resolve_prior(in, 2, spec, geometry),
                    "h: expected a query head in [0, 2), got 2");
  CHECK_THROWS_WITH(resolve_prior(in, -1, spec, geometry),
                    "h: expected a query head in [0, 2), got -1");
  spec.prior_rule = PriorRule::given;
  in.prior.clear();
  CHECK_THROWS_WITH(resolve_prior(in, 1, spec, geometry),
                    "prior: expected one matrix per query head (prior_rule given reads it), got 0");
}

TEST_CASE("summarize refuses keys of another length than its geometry", "[properties][errors]") {
  // A geometry longer than k: its chunks' key rows were read past k's end (SIGSEGV) for every
  // key rule.
  const cases::Case c{"summarize_errors", 32, 8, 8, 1, 1, 1, 8, 8, true, 1.0};
  const auto in = cases::make_inputs<double>(c);
  const Geometry longer(4096, c.S, c.W, c.landmarks);
  for (const auto& entry : kKeyRuleNames) {
    const KeyRule rule = entry.value;
    if (rule == KeyRule::exact) continue;  // no summary: refused as such
    INFO(to_string(rule));
    CHECK_THROWS_WITH(summarize<double>(in.k[0], Matrix<double>::Zero(longer.n_chunks(), c.d),
                                        rule, BiasRule::entropy, longer, 0.5),
                      "k: expected T = 4096 rows (the geometry's slots), got 32");
  }
}

namespace {

// One row's fusion (reference/SEMANTICS.md §5) computed directly from its selection, the kept
// window and the kept scores: each selected chunk's softmax over its tokens, then Eq. 3 or 10.
struct RowFusion {
  RowVector<double> o;
  double lse;
  RowVector<double> weights;
};
RowFusion fuse_directly(const MechanismSpec& spec, const AttentionInputs<double>& in,
                        const MechanismOutputs<double>& out, int64_t h, int64_t r) {
  const Geometry geometry = geometry_of(spec, in.T());
  const double scale = logit_scale(spec, in.d());
  const int64_t g = h / (in.Hq() / in.Hkv()), t = out.queries[static_cast<size_t>(r)], K = spec.K;
  const auto& head = out.heads[static_cast<size_t>(h)];
  const auto selected = out.selection[static_cast<size_t>(g)].row(r);
  std::vector<double> logits(static_cast<size_t>(K + 2), -std::numeric_limits<double>::infinity());
  std::vector<RowVector<double>> chunk_o(static_cast<size_t>(K));
  for (int64_t s = 0; s < K; ++s) {
    const int64_t c = selected(s);
    if (c < 0) continue;
    const auto l = chunk_logits(in.q[h], in.k[g], geometry, t, c, scale);
    const double mass = log_sum_exp(l);
    RowVector<double> o = RowVector<double>::Zero(in.dv());
    size_t token = 0;
    for (int64_t j = c * geometry.S(); j < (c + 1) * geometry.S(); ++j)
      if (geometry.attendable(j)) o += std::exp(l[token++] - mass) * in.v[g].row(j);
    logits[static_cast<size_t>(s)] =
        spec.fusion == Fusion::flat ? mass : head.surrogate_scores(r, c);
    chunk_o[static_cast<size_t>(s)] = o;
  }
  logits[static_cast<size_t>(K)] = head.lse_window(r);
  if (spec.softmax1 && spec.fusion == Fusion::hierarchical) logits[static_cast<size_t>(K + 1)] = 0;
  RowFusion f{RowVector<double>::Zero(in.dv()), log_sum_exp(logits), RowVector<double>(K + 2)};
  for (int64_t s = 0; s < K + 2; ++s)
    f.weights(s) = std::exp(logits[static_cast<size_t>(s)] - f.lse);
  for (int64_t s = 0; s < K; ++s)
    if (selected(s) >= 0) f.o += f.weights(s) * chunk_o[static_cast<size_t>(s)];
  f.o += f.weights(K) * head.o_window.row(r);
  return f;
}

}  // namespace

// run_mechanism attends a query block's selections chunk by chunk (each selected chunk's keys
// and values read once per block and head, detail::group_selections), then fuses row by row: a
// row must get back its own chunks when the rows of its block select different chunks, in a
// ragged last block, with -1 padding and K above the chunk count, with and without landmarks,
// for every head of a GQA group (one selection, different queries) and on sampled queries.
TEST_CASE("every row fuses its own chunks, whatever the other rows of its block select",
          "[properties]") {
  for (const char* name : {"ragged_tail", "ragged_tail_no_landmarks", "gqa_group4",
                           "k_covers_all", "k_covers_all_no_landmarks"})
    for (const int64_t stride : {1, 3}) {
      const auto& c = cases::case_named(name);
      const auto inputs = cases::make_inputs<double>(c);
      RunOptions options;
      options.keep_window = options.keep_surrogate_scores = true;
      for (int64_t t = 0; t < c.T; t += stride) options.queries.push_back(t);
      for (const auto& base : hils::testing::all_specs()) {
        const auto spec = hils::testing::spec_for_case(base, c);
        if (!spec || !spec->selects()) continue;
        INFO("case " << name << ", every " << stride << " queries, spec " << spec->name);
        const auto out = run_mechanism(*spec, inputs, options);
        const auto n = static_cast<int64_t>(out.queries.size());
        // The case exercises it: two rows of one block select different chunks.
        int64_t differing = 0;
        for (int64_t r = 1; r < std::min<int64_t>(n, 64); ++r)
          differing += out.selection[0].row(r) != out.selection[0].row(r - 1);
        CHECK(differing > 0);
        for (int64_t h = 0; h < c.Hq; ++h) {
          Matrix<double> o(n, c.dv), weights(n, spec->K + 2);
          Vector<double> lse(n);
          for (int64_t r = 0; r < n; ++r) {
            const RowFusion f = fuse_directly(*spec, inputs, out, h, r);
            o.row(r) = f.o;
            lse(r) = f.lse;
            weights.row(r) = f.weights;
          }
          INFO("head " << h);
          CHECK(relative_error(out.heads[h].o, o) < kExact);
          CHECK(relative_error(out.heads[h].lse, lse) < kExact);
          CHECK(relative_error(out.heads[h].fusion_weights, weights) < kExact);
        }
      }
    }
}

TEST_CASE("softmax1 adds a zero logit to the hierarchical softmax", "[properties]") {
  const auto& c = cases::kCaseTable[5];
  const auto inputs = cases::make_inputs<double>(c);
  MechanismSpec spec = cases::with_case_geometry(preset("hils"), c);
  auto plain = run_mechanism(spec, inputs);
  spec.softmax1 = true;
  auto sink = run_mechanism(spec, inputs);
  for (int64_t h = 0; h < c.Hq; ++h)
    for (int64_t t = 0; t < c.T; ++t) {
      // lse grows by log(1 + exp(-lse)); every weight shrinks by the same factor.
      const double lse = plain.heads[h].lse(t);
      CHECK(sink.heads[h].lse(t) == Approx(lse + std::log1p(std::exp(-lse))).epsilon(1e-13));
      CHECK(sink.heads[h].fusion_weights(t, c.K + 1) == Approx(std::exp(-sink.heads[h].lse(t))).epsilon(1e-13));
      const double shrink = std::exp(lse - sink.heads[h].lse(t));
      CHECK(relative_error(sink.heads[h].o.row(t), plain.heads[h].o.row(t) * shrink) < kExact);
    }
}
