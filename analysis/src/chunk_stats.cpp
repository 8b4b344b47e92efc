#include "hils/analysis/chunk_stats.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "hils/analysis/metrics.hpp"
#include "hils/threads.hpp"

namespace hils::analysis {

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Attendable slots of chunk c, ascending.
std::vector<int64_t> chunk_tokens(const Geometry& geometry, int64_t c) {
  std::vector<int64_t> slots;
  for (int64_t j = c * geometry.S(); j < (c + 1) * geometry.S(); ++j)
    if (geometry.attendable(j)) slots.push_back(j);
  return slots;
}

// [n] logits sigma x . k_j over the listed slots.
std::vector<double> logits_of(const Eigen::Ref<const Vector<double>>& x, const Matrix<double>& k,
                              const std::vector<int64_t>& slots, double scale) {
  std::vector<double> out(slots.size());
  for (size_t i = 0; i < slots.size(); ++i) out[i] = scale * k.row(slots[i]).dot(x);
  return out;
}

void require_queries(const std::vector<int64_t>& queries, int64_t T) {
  for (size_t i = 0; i < queries.size(); ++i) {
    require(queries[i] >= 0 && queries[i] < T, "queries[" + std::to_string(i) + "]",
            "a slot in [0, " + std::to_string(T) + ")", std::to_string(queries[i]));
    require(i == 0 || queries[i] > queries[i - 1], "queries", "strictly ascending",
            "a repeat or descent at index " + std::to_string(i));
  }
}

// Candidate real-token slots: those with more than `min_exclusive` candidates.
std::vector<int64_t> eligible_slots(const Geometry& geometry, int64_t min_exclusive) {
  std::vector<int64_t> slots;
  for (int64_t t = 0; t < geometry.T(); ++t)
    if (geometry.attendable(t) && geometry.candidate_count(t) > min_exclusive) slots.push_back(t);
  return slots;
}

}  // namespace

ChunkLogitStats chunk_logit_stats(const Matrix<double>& q, const Matrix<double>& k,
                                  const Geometry& geometry, double scale,
                                  const std::vector<int64_t>& queries) {
  require_queries(queries, geometry.T());
  const int64_t nc = geometry.n_chunks(), Tq = static_cast<int64_t>(queries.size());
  ChunkLogitStats stats{Matrix<double>::Constant(Tq, nc, kNegInf),
                        Matrix<double>::Constant(Tq, nc, kNegInf),
                        Matrix<double>::Constant(Tq, nc, kNaN)};
  std::vector<std::vector<int64_t>> tokens(nc);
  for (int64_t c = 0; c < nc; ++c) tokens[c] = chunk_tokens(geometry, c);
#pragma omp parallel for schedule(dynamic) num_threads(thread_team_size(Tq))
  for (int64_t i = 0; i < Tq; ++i) {
    const Vector<double> qt = q.row(queries[i]).transpose();
    for (int64_t c = 0; c < geometry.candidate_count(queries[i]); ++c) {
      const auto s = logits_of(qt, k, tokens[c], scale);
      double sum = 0.0;
      for (double x : s) sum += x;
      stats.max_logit(i, c) = *std::max_element(s.begin(), s.end());
      stats.mean_logit(i, c) = sum / static_cast<double>(s.size());
      stats.entropy(i, c) = softmax_entropy(s);
    }
  }
  return stats;
}

std::vector<int64_t> sample_queries(const Geometry& geometry, int64_t K, int64_t n) {
  require(n >= 1, "queries per unit", ">= 1", std::to_string(n));
  auto slots = eligible_slots(geometry, K);
  if (slots.empty()) slots = eligible_slots(geometry, 0);
  if (static_cast<int64_t>(slots.size()) <= n) return slots;
  // Evenly spaced from the end so that the last (longest-context) query is always in.
  std::vector<int64_t> picked;
  const double step = static_cast<double>(slots.size() - 1) / static_cast<double>(n - 1);
  for (int64_t i = 0; i < n; ++i) {
    const auto pos = static_cast<int64_t>(std::llround(static_cast<double>(i) * step));
    picked.push_back(slots[pos]);
  }
  picked.erase(std::unique(picked.begin(), picked.end()), picked.end());
  return picked;
}

std::vector<int64_t> tail_queries(const Geometry& geometry, int64_t n) {
  require(n >= 1, "tail queries", ">= 1", std::to_string(n));
  // From the end, so that the cost is O(n), not O(T): a CLI check calls this on lengths no
  // one will run (--lengths 1e11 hung here building a list of every slot).
  std::vector<int64_t> slots;
  for (int64_t t = geometry.T() - 1; t >= 0 && static_cast<int64_t>(slots.size()) < n; --t)
    if (geometry.attendable(t) && geometry.candidate_count(t) > 0) slots.push_back(t);
  std::reverse(slots.begin(), slots.end());
  return slots;
}

std::string to_string(PriorSource source) {
  switch (source) {
    case PriorSource::inputs: return "inputs";
    case PriorSource::chunk_mean_query: return "chunk_mean_query";
    case PriorSource::chunk_last_query: return "chunk_last_query";
  }
  return "?";
}

PriorSource parse_prior_source(const std::string& text, const std::string& field) {
  for (auto s : {PriorSource::inputs, PriorSource::chunk_mean_query, PriorSource::chunk_last_query})
    if (to_string(s) == text) return s;
  throw InvalidArgument(field + ": one of inputs, chunk_mean_query, chunk_last_query, got '" +
                        text + "'");
}

void fill_prior(AttentionInputs<double>& inputs, const Geometry& geometry, PriorSource source) {
  if (source == PriorSource::inputs) return;
  inputs.prior.clear();
  const int64_t nc = geometry.n_chunks();
  for (int64_t h = 0; h < inputs.Hq(); ++h) {
    const auto& qr = inputs.retrieval_query(h);
    Matrix<double> prior = Matrix<double>::Zero(nc, inputs.d());
    for (int64_t c = 0; c < nc; ++c) {
      const auto slots = chunk_tokens(geometry, c);
      if (source == PriorSource::chunk_last_query) {
        prior.row(c) = qr.row(slots.back());
      } else {
        for (int64_t j : slots) prior.row(c) += qr.row(j);
        prior.row(c) /= static_cast<double>(slots.size());
      }
    }
    inputs.prior.push_back(std::move(prior));
  }
}

AttentionInputs<double> group_inputs(const AttentionInputs<double>& inputs, int64_t g) {
  require(g >= 0 && g < inputs.Hkv(), "group", "in [0, " + std::to_string(inputs.Hkv()) + ")",
          std::to_string(g));
  const int64_t G = inputs.Hq() / inputs.Hkv();
  AttentionInputs<double> out;
  out.k = {inputs.k[g]};
  out.v = {inputs.v[g]};
  for (int64_t h = g * G; h < (g + 1) * G; ++h) {
    out.q.push_back(inputs.q[h]);
    if (!inputs.q_retrieval.empty()) out.q_retrieval.push_back(inputs.q_retrieval[h]);
    if (!inputs.prior.empty()) out.prior.push_back(inputs.prior[h]);
  }
  return out;
}

Matrix<double> flat_fusion_output(const Matrix<double>& q, const Matrix<double>& k,
                                  const Matrix<double>& v, const Geometry& geometry, double scale,
                                  const std::vector<int64_t>& queries,
                                  const IndexMatrix& selection) {
  require_queries(queries, geometry.T());
  require(selection.rows() == static_cast<int64_t>(queries.size()), "selection rows",
          std::to_string(queries.size()), std::to_string(selection.rows()));
  Matrix<double> o(static_cast<int64_t>(queries.size()), v.cols());
#pragma omp parallel for schedule(dynamic) \
    num_threads(thread_team_size(static_cast<int64_t>(queries.size())))
  for (int64_t i = 0; i < static_cast<int64_t>(queries.size()); ++i) {
    const int64_t t = queries[i];
    std::vector<int64_t> slots;
    for (int64_t kk = 0; kk < selection.cols(); ++kk)
      if (selection(i, kk) >= 0)
        for (int64_t j : chunk_tokens(geometry, selection(i, kk))) slots.push_back(j);
    for (int64_t j = geometry.window_left(t); j <= t; ++j)
      if (geometry.attendable(j)) slots.push_back(j);
    const auto lp = log_softmax(logits_of(q.row(t).transpose(), k, slots, scale));
    Vector<double> acc = Vector<double>::Zero(v.cols());
    for (size_t n = 0; n < slots.size(); ++n) acc += std::exp(lp[n]) * v.row(slots[n]).transpose();
    o.row(i) = acc.transpose();
  }
  return o;
}

KlCheck taylor_kl_check(const Matrix<double>& q, const Matrix<double>& k,
                        const Matrix<double>& prior, const Geometry& geometry, double scale,
                        const std::vector<int64_t>& queries) {
  const auto summaries =
      summarize<double>(k, prior, KeyRule::taylor, BiasRule::entropy, geometry, scale);
  const auto s_hat = surrogate_scores<double>(q, summaries, geometry, scale, queries);
  const auto L = exact_chunk_log_mass<double>(q, k, geometry, scale, queries);
  KlCheck check;
  check.min_gap = std::numeric_limits<double>::infinity();
  check.max_gap = kNegInf;
  for (size_t i = 0; i < queries.size(); ++i) {
    const Vector<double> qt = q.row(queries[i]).transpose();
    for (int64_t c = 0; c < geometry.candidate_count(queries[i]); ++c) {
      const auto slots = chunk_tokens(geometry, c);
      const double kl = kl_divergence(logits_of(prior.row(c).transpose(), k, slots, scale),
                                      logits_of(qt, k, slots, scale));
      const double gap = L(i, c) - s_hat(i, c);
      check.max_abs_deviation = std::max(check.max_abs_deviation, std::abs(gap - kl));
      check.min_gap = std::min(check.min_gap, gap);
      check.max_gap = std::max(check.max_gap, gap);
      ++check.pairs;
    }
  }
  return check;
}

}  // namespace hils::analysis
