#include "hils/analysis/metrics.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include <boost/math/distributions/students_t.hpp>

namespace hils::analysis {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// [n] -> LSE of the values, -inf for an empty or all -inf input.
double lse(std::span<const double> x) {
  double m = kNegInf;
  for (double v : x) m = std::max(m, v);
  if (!std::isfinite(m)) return m;
  double sum = 0.0;
  for (double v : x) sum += std::exp(v - m);
  return m + std::log(sum);
}

// log(e^a + e^b) without overflow; -inf + -inf stays -inf.
double logaddexp(double a, double b) {
  if (a == kNegInf) return b;
  if (b == kNegInf) return a;
  double m = std::max(a, b);
  return m + std::log1p(std::exp(-std::abs(a - b)));
}

}  // namespace

std::vector<double> average_ranks(std::span<const double> x) {
  const size_t n = x.size();
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return x[a] < x[b]; });
  std::vector<double> ranks(n);
  // A run of equal values [i, j) shares the mean of ranks i+1..j.
  for (size_t i = 0; i < n;) {
    size_t j = i + 1;
    while (j < n && x[order[j]] == x[order[i]]) ++j;
    const double rank = 0.5 * static_cast<double>(i + 1 + j);
    for (size_t m = i; m < j; ++m) ranks[order[m]] = rank;
    i = j;
  }
  return ranks;
}

double pearson(std::span<const double> x, std::span<const double> y) {
  require(x.size() == y.size(), "pearson: y", "as many values as x (" +
          std::to_string(x.size()) + ")", std::to_string(y.size()));
  const size_t n = x.size();
  if (n < 2) return kNaN;
  const double mx = std::accumulate(x.begin(), x.end(), 0.0) / n;
  const double my = std::accumulate(y.begin(), y.end(), 0.0) / n;
  double sxy = 0.0, sxx = 0.0, syy = 0.0;
  for (size_t i = 0; i < n; ++i) {
    sxy += (x[i] - mx) * (y[i] - my);
    sxx += (x[i] - mx) * (x[i] - mx);
    syy += (y[i] - my) * (y[i] - my);
  }
  if (sxx <= 0.0 || syy <= 0.0) return kNaN;
  return std::clamp(sxy / std::sqrt(sxx * syy), -1.0, 1.0);
}

double spearman(std::span<const double> x, std::span<const double> y) {
  const auto rx = average_ranks(x);
  const auto ry = average_ranks(y);
  return pearson(rx, ry);
}

std::vector<int64_t> top_k(std::span<const double> scores, int64_t K) {
  std::vector<int64_t> idx;
  for (size_t c = 0; c < scores.size(); ++c)
    if (scores[c] != kNegInf) idx.push_back(static_cast<int64_t>(c));
  const auto keep = static_cast<size_t>(std::clamp<int64_t>(K, 0, idx.size()));
  // Larger score first, lower index first among equals: the reference's tie rule.
  std::partial_sort(idx.begin(), idx.begin() + keep, idx.end(), [&](int64_t a, int64_t b) {
    return scores[a] > scores[b] || (scores[a] == scores[b] && a < b);
  });
  idx.resize(keep);
  std::sort(idx.begin(), idx.end());
  return idx;
}

double topk_recall(std::span<const int64_t> selected, std::span<const int64_t> reference) {
  if (reference.empty()) return kNaN;
  int64_t hits = 0;
  for (int64_t c : reference)
    hits += std::find(selected.begin(), selected.end(), c) != selected.end();
  return static_cast<double>(hits) / static_cast<double>(reference.size());
}

double log_mass_of(std::span<const double> log_mass, std::span<const int64_t> chunks) {
  std::vector<double> picked;
  for (int64_t c : chunks) {
    require(c >= 0 && c < static_cast<int64_t>(log_mass.size()), "chunk index",
            "in [0, " + std::to_string(log_mass.size()) + ")", std::to_string(c));
    picked.push_back(log_mass[c]);
  }
  return lse(picked);
}

double mass_recall(std::span<const double> log_mass, std::span<const int64_t> selected,
                   std::span<const int64_t> reference) {
  if (reference.empty()) return kNaN;
  return std::exp(log_mass_of(log_mass, selected) - log_mass_of(log_mass, reference));
}

double covered_mass(std::span<const double> log_mass, std::span<const int64_t> selected,
                    double lse_window) {
  const double covered = logaddexp(log_mass_of(log_mass, selected), lse_window);
  const double total = logaddexp(lse(log_mass), lse_window);
  return std::exp(covered - total);
}

double relative_error(const Matrix<double>& o, const Matrix<double>& o_ref) {
  require(o.rows() == o_ref.rows() && o.cols() == o_ref.cols(), "relative_error: o",
          "the shape of o_ref", std::to_string(o.rows()) + "x" + std::to_string(o.cols()));
  const double ref = o_ref.norm();
  return ref > 0.0 ? (o - o_ref).norm() / ref : kNaN;
}

std::vector<double> row_relative_errors(const Matrix<double>& o, const Matrix<double>& o_ref) {
  require(o.rows() == o_ref.rows() && o.cols() == o_ref.cols(), "row_relative_errors: o",
          "the shape of o_ref", std::to_string(o.rows()) + "x" + std::to_string(o.cols()));
  std::vector<double> err(o.rows());
  for (int64_t i = 0; i < o.rows(); ++i) {
    const double ref = o_ref.row(i).norm();
    err[i] = ref > 0.0 ? (o.row(i) - o_ref.row(i)).norm() / ref : kNaN;
  }
  return err;
}

std::vector<double> log_softmax(std::span<const double> logits) {
  const double z = lse(logits);
  std::vector<double> out(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) out[i] = logits[i] - z;
  return out;
}

double softmax_entropy(std::span<const double> logits) {
  double h = 0.0;
  for (double lp : log_softmax(logits))
    if (lp != kNegInf) h -= std::exp(lp) * lp;
  return h;
}

double kl_divergence(std::span<const double> logits_p, std::span<const double> logits_q) {
  require(logits_p.size() == logits_q.size(), "kl_divergence: logits_q",
          "as many values as logits_p (" + std::to_string(logits_p.size()) + ")",
          std::to_string(logits_q.size()));
  const auto lp = log_softmax(logits_p);
  const auto lq = log_softmax(logits_q);
  double kl = 0.0;
  for (size_t i = 0; i < lp.size(); ++i)
    if (lp[i] != kNegInf) kl += std::exp(lp[i]) * (lp[i] - lq[i]);
  return std::max(kl, 0.0);
}

SelectionBlock block_of(const IndexMatrix& selection, int64_t first, int64_t M) {
  require(first >= 0 && M >= 1 && first + M <= selection.rows(), "block_of: rows",
          "[first, first+M) inside [0, " + std::to_string(selection.rows()) + ")",
          std::string("[") + std::to_string(first) + ", " + std::to_string(first + M) + ")");
  SelectionBlock block(M);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < selection.cols(); ++k)
      if (selection(first + m, k) >= 0) block[m].push_back(selection(first + m, k));
  return block;
}

std::vector<int32_t> union_of(const SelectionBlock& block) {
  std::vector<int32_t> all;
  for (const auto& row : block) all.insert(all.end(), row.begin(), row.end());
  std::sort(all.begin(), all.end());
  all.erase(std::unique(all.begin(), all.end()), all.end());
  return all;
}

double normalized_overlap(const SelectionBlock& block) {
  if (block.size() == 1) return 1.0;
  size_t total = 0, largest = 0;
  for (const auto& row : block) {
    total += row.size();
    largest = std::max(largest, row.size());
  }
  const double denominator = static_cast<double>(total - largest);
  if (denominator <= 0.0) return kNaN;
  return (static_cast<double>(total) - static_cast<double>(union_of(block).size())) /
         denominator;
}

double inter_block_reuse(std::span<const int32_t> union_now,
                         std::span<const int32_t> union_prev) {
  if (union_now.empty()) return kNaN;
  int64_t shared = 0;
  for (int32_t c : union_now)
    shared += std::find(union_prev.begin(), union_prev.end(), c) != union_prev.end();
  return static_cast<double>(shared) / static_cast<double>(union_now.size());
}

Summary summarize_values(std::span<const double> x, double confidence) {
  require(confidence > 0.0 && confidence < 1.0, "confidence", "in (0, 1)",
          std::to_string(confidence));
  Summary s;
  s.confidence = confidence;
  std::vector<double> v;
  for (double value : x)
    if (std::isfinite(value)) v.push_back(value);
  s.n = static_cast<int64_t>(v.size());
  s.mean = s.sd = s.min = s.max = s.ci_low = s.ci_high = kNaN;
  if (v.empty()) return s;
  s.mean = std::accumulate(v.begin(), v.end(), 0.0) / v.size();
  s.min = *std::min_element(v.begin(), v.end());
  s.max = *std::max_element(v.begin(), v.end());
  if (v.size() < 2) return s;
  double ss = 0.0;
  for (double value : v) ss += (value - s.mean) * (value - s.mean);
  s.sd = std::sqrt(ss / (v.size() - 1));
  boost::math::students_t dist(static_cast<double>(v.size() - 1));
  const double t = boost::math::quantile(boost::math::complement(dist, (1.0 - confidence) / 2));
  const double half = t * s.sd / std::sqrt(static_cast<double>(v.size()));
  s.ci_low = s.mean - half;
  s.ci_high = s.mean + half;
  return s;
}

std::vector<double> summary_row(const Summary& s) {
  return {static_cast<double>(s.n), s.mean, s.sd, s.min, s.max, s.ci_low, s.ci_high,
          s.confidence};
}

const char* summary_columns() { return "n,mean,sd,min,max,ci_low,ci_high,confidence"; }

}  // namespace hils::analysis
