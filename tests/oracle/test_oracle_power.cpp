// The oracle's power (issue 13): a mutation study of planted bugs of graded size under the
// three claimed precisions, with the smallest size caught per kind printed, and the power the
// oracle claims in data/verify_format.md asserted; correct kernels pass alongside.
#include <catch2/catch.hpp>

#include <iostream>

#include "mutation_study.hpp"

using namespace hils;
using namespace hils::oracle;
using namespace hils::oracle::testing;

TEST_CASE("mutation study: explore", "[.explore]") {
  const auto& c = case_named("longer_blocks");
  const auto inputs = cases::make_inputs<double>(c);
  const MechanismSpec spec = cases::with_case_geometry(preset("hils"), c);
  for (const auto& claim : study_claims()) {
    const auto rows = power_study(spec, inputs, claim);
    std::cout << format_power("longer_blocks hils " + claim.label() + ": " +
                                  std::to_string(sixteen_caught(rows)) + "/16",
                              rows);
  }
}

namespace {
double rb(double x) { return round_to_bf16(x); }
// lse of every head from given scores: LSE(lse_window, s_hat of the selected chunks).
std::vector<Vector<double>> lse_from(const std::vector<Matrix<double>>& scores,
                                     const std::vector<Vector<double>>& lse_window,
                                     const std::vector<IndexMatrix>& sel, int64_t G, bool round_store) {
  std::vector<Vector<double>> out;
  for (size_t h = 0; h < scores.size(); ++h) {
    Vector<double> l(lse_window[h].size());
    for (Eigen::Index t = 0; t < l.size(); ++t) {
      double m = lse_window[h](t), sum = 0;
      const auto& s = sel[h / G];
      for (Eigen::Index i = 0; i < s.cols(); ++i) if (s(t, i) >= 0) m = std::max(m, scores[h](t, s(t, i)));
      sum = std::exp(lse_window[h](t) - m);
      for (Eigen::Index i = 0; i < s.cols(); ++i) if (s(t, i) >= 0) sum += std::exp(scores[h](t, s(t, i)) - m);
      l(t) = m + std::log(sum);
      if (round_store) l(t) = rb(l(t));
    }
    out.push_back(l);
  }
  return out;
}
// s_hat per head with summaries rounded to bf16 (key, bias; p too when round_p), scores rounded when round_s.
std::vector<Matrix<double>> bf16_scores(const MechanismSpec& spec, const AttentionInputs<float>& in, bool round_p, bool round_s) {
  const Geometry geometry = geometry_of(spec, in.T());
  const float scale = static_cast<float>(logit_scale(spec, in.d()));
  const int64_t G = in.Hq() / in.Hkv(), tokens = geometry.tokens_per_chunk();
  std::vector<int64_t> all(static_cast<size_t>(in.T()));
  for (int64_t t = 0; t < in.T(); ++t) all[static_cast<size_t>(t)] = t;
  std::vector<Matrix<double>> out;
  auto rm = [](const auto& m) { return m.unaryExpr([](float x) { return static_cast<float>(rb(x)); }).eval(); };
  for (int64_t h = 0; h < in.Hq(); ++h) {
    const Matrix<float>& k = in.k[h / G];
    const Matrix<float> prior = spec.needs_prior() ? resolve_prior(in, h, spec, geometry) : Matrix<float>();
    ChunkSummaries<float> s = summarize(k, prior, spec.key_rule, spec.bias_rule, geometry, scale);
    for (int64_t c = 0; round_p && c < geometry.n_chunks() && spec.key_rule == KeyRule::taylor; ++c) {
      const auto keys = k.middleRows(c * spec.S, tokens);
      Vector<float> logits = scale * (keys * prior.row(c).transpose());
      Vector<float> p = (logits.array() - logits.maxCoeff()).exp().matrix();
      p = rm(Vector<float>(p / p.sum()));
      s.key.row(c) = p.transpose() * keys;
    }
    s.key = rm(s.key);
    s.bias = rm(s.bias);
    Matrix<float> sc = surrogate_scores(in.retrieval_query(h), s, geometry, scale, all);
    if (round_s) sc = sc.unaryExpr([](float x) { return std::isinf(x) ? x : static_cast<float>(rb(x)); });
    out.push_back(sc.cast<double>());
  }
  return out;
}
void stats(const char* name, const std::vector<Vector<double>>& k, const std::vector<Vector<double>>& t) {
  double sum = 0, sq = 0, mx = 0; int64_t n = 0;
  for (size_t h = 0; h < k.size(); ++h) for (Eigen::Index i = 0; i < k[h].size(); ++i) {
    const double e = k[h](i) - t[h](i); sum += e; sq += e * e; mx = std::max(mx, std::fabs(e)); ++n; }
  std::printf("  %-28s mean %10.3g  rms %10.3g  max %10.3g\n", name, sum / n, std::sqrt(sq / n), mx);
}
}  // namespace

TEST_CASE("lse statistics: explore", "[.explore]") {
  for (const char* cname : {"longer_blocks", "peaked_attention", "gqa_group4"}) {
  const auto& c = case_named(cname);
  const auto inputs = cases::make_inputs<double>(c);
  const MechanismSpec spec = cases::with_case_geometry(preset("hils"), c);
  const auto bf16 = InputPrecision::bf16;
  const AttentionInputs<double> in_d = round_inputs_to_bf16(inputs);
  const AttentionInputs<float> in = kernel_inputs(inputs, bf16);
  RunOptions keep; keep.keep_surrogate_scores = keep.keep_window = true;
  const auto truth = run_mechanism(spec, in_d, keep);
  const int64_t G = c.Hq / c.Hkv;
  std::vector<Vector<double>> lw, lt; std::vector<Matrix<double>> st;
  for (auto& h : truth.heads) { lw.push_back(h.lse_window); lt.push_back(h.lse); st.push_back(h.surrogate_scores); }
  std::printf("%s (lse rows %lld)\n", cname, (long long)(c.Hq * c.T));
  auto fk = float_kernel(spec, inputs, bf16, bf16);
  auto tl = lse_from(st, lw, fk.selection, G, false);
  stats("correct, lse rounded", fk.lse, tl);
  auto base = lse_from(bf16_scores(spec, in, false, true), lw, fk.selection, G, true);
  stats("baseline k',b',s,lse rounded", base, tl);
  auto base2 = lse_from(bf16_scores(spec, in, true, false), lw, fk.selection, G, false);
  stats("p,k',b' rounded, s fp32", base2, tl);
  auto base3 = lse_from(bf16_scores(spec, in, true, true), lw, fk.selection, G, true);
  stats("p,k',b',s,lse rounded", base3, tl);
  for (double eps : {0.001, 0.003, 0.01}) {
    MechanismSpec bug = spec; bug.scale = (1 + eps) / std::sqrt(double(c.d));
    auto bk = float_kernel(bug, inputs, bf16, bf16);
    stats(("logit scale " + std::to_string(eps)).c_str(), bk.lse, tl);
  }
  MechanismSpec bug = spec; bug.softmax1 = true;
  stats("extra softmax1", float_kernel(bug, inputs, bf16, bf16).lse, tl);
  }
}

TEST_CASE("one report: explore", "[.explore]") {
  const auto& c = case_named("longer_blocks");
  const auto inputs = cases::make_inputs<double>(c);
  const MechanismSpec spec = cases::with_case_geometry(preset("hils"), c);
  const Claim claim{InputPrecision::bf16, InputPrecision::bf16};
  VerifyOptions options{claim.precision};
  options.score_precision = claim.score_precision;
  for (double size : {0.0, 0.3, 1.0}) {
    const auto planted = planted_kernel(bug_kinds()[0], size, spec, inputs, claim);
    std::cout << "logit scale " << size << "%\n" << verify(planted.declared, inputs, planted.outputs, options).report();
  }
}
