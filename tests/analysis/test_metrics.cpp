// Metrics of reference/SEMANTICS.md §9 against hand-computed values; each check fails on the
// obvious wrong implementation (ranks without tie averaging, recall over the wrong set, raw instead
// of log-space masses, overlap with the wrong denominator, a normal instead of a t interval).
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "case_table.hpp"
#include "hils/analysis/metrics.hpp"

using namespace hils::analysis;
using Catch::Detail::Approx;

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
}

TEST_CASE("average_ranks averages ties", "[metrics]") {
  std::vector<double> x{10, 20, 20, 5};
  CHECK(average_ranks(x) == std::vector<double>{2, 3.5, 3.5, 1});
  std::vector<double> all_equal{7, 7, 7};
  CHECK(average_ranks(all_equal) == std::vector<double>{2, 2, 2});
}

TEST_CASE("spearman uses average ranks for ties", "[metrics]") {
  std::vector<double> x{1, 2, 3, 4, 5}, y{5, 6, 7, 8, 7};
  // Ranks of y are 1,2,3.5,5,3.5: r = 8 / sqrt(10 * 9.5).
  CHECK(spearman(x, y) == Approx(8.0 / std::sqrt(95.0)).epsilon(1e-12));
  std::vector<double> cubic{1, 8, 27, 64, 125}, reversed{5, 4, 3, 2, 1};
  CHECK(spearman(x, cubic) == Approx(1.0));
  CHECK(spearman(x, reversed) == Approx(-1.0));
  CHECK(pearson(x, cubic) < 0.99);  // Pearson is not rank-based
}

TEST_CASE("spearman equals the classic formula without ties", "[metrics]") {
  std::mt19937_64 rng(hils::cases::seed_of("spearman_no_ties"));
  std::normal_distribution<double> gauss;
  const int n = 37;
  std::vector<double> x(n), y(n);
  for (int i = 0; i < n; ++i) {
    x[i] = gauss(rng);
    y[i] = x[i] + gauss(rng);
  }
  auto rx = average_ranks(x), ry = average_ranks(y);
  double d2 = 0;
  for (int i = 0; i < n; ++i) d2 += (rx[i] - ry[i]) * (rx[i] - ry[i]);
  CHECK(spearman(x, y) == Approx(1.0 - 6.0 * d2 / (n * (double(n) * n - 1))).epsilon(1e-12));
}

TEST_CASE("correlation of constant input is NaN, not a number", "[metrics]") {
  std::vector<double> x{1, 2, 3}, c{4, 4, 4};
  CHECK(std::isnan(pearson(x, c)));
  CHECK(std::isnan(spearman(x, c)));
  std::vector<double> one{1};
  CHECK(std::isnan(pearson(one, one)));
  std::vector<double> shorter{1, 2};
  CHECK_THROWS_AS(pearson(x, shorter), hils::InvalidArgument);
}

TEST_CASE("top_k keeps the largest, ties to the lower index, skips -inf", "[metrics]") {
  std::vector<double> s{1, 3, 3, -kInf, 2};
  CHECK(top_k(s, 2) == std::vector<int64_t>{1, 2});
  CHECK(top_k(s, 3) == std::vector<int64_t>{1, 2, 4});
  CHECK(top_k(s, 10) == std::vector<int64_t>{0, 1, 2, 4});
  CHECK(top_k(s, 0).empty());
  std::vector<double> tied{5, 5, 5};
  CHECK(top_k(tied, 2) == std::vector<int64_t>{0, 1});
}

TEST_CASE("recall, mass recall and covered mass", "[metrics]") {
  std::vector<int64_t> sel{0, 1, 2}, ref{1, 2, 3};
  CHECK(topk_recall(sel, ref) == Approx(2.0 / 3.0));
  CHECK(std::isnan(topk_recall(sel, {})));
  // Z = 1, 2, 3, 4 stored as log masses.
  std::vector<double> L{0.0, std::log(2.0), std::log(3.0), std::log(4.0)};
  std::vector<int64_t> picked{1, 3}, best{2, 3};
  CHECK(mass_recall(L, picked, best) == Approx(6.0 / 7.0).epsilon(1e-12));
  CHECK(covered_mass(L, picked, std::log(10.0)) == Approx(16.0 / 20.0).epsilon(1e-12));
  CHECK(covered_mass(L, {}, std::log(10.0)) == Approx(10.0 / 20.0).epsilon(1e-12));
  // Log space: masses far beyond double's exp range still give the exact ratio.
  std::vector<double> huge{800.0, 800.0 + std::log(3.0)};
  std::vector<int64_t> first{0}, second{1};
  CHECK(mass_recall(huge, first, second) == Approx(1.0 / 3.0).epsilon(1e-12));
  CHECK_THROWS_AS(log_mass_of(L, std::vector<int64_t>{4}), hils::InvalidArgument);
}

TEST_CASE("relative output error", "[metrics]") {
  hils::Matrix<double> o(2, 2), ref(2, 2);
  o << 1, 0, 0, 1;
  ref << 1, 0, 0, 2;
  CHECK(relative_error(o, ref) == Approx(1.0 / std::sqrt(5.0)));
  auto rows = row_relative_errors(o, ref);
  CHECK(rows[0] == 0.0);
  CHECK(rows[1] == Approx(0.5));
}

TEST_CASE("entropy and KL divergence of softmax distributions", "[metrics]") {
  std::vector<double> uniform{3, 3, 3, 3};
  CHECK(softmax_entropy(uniform) == Approx(std::log(4.0)));
  std::vector<double> p{std::log(0.5), std::log(0.5)}, q{std::log(0.25), std::log(0.75)};
  CHECK(kl_divergence(p, q) == Approx(0.5 * std::log(2.0) + 0.5 * std::log(0.5 / 0.75)));
  CHECK(kl_divergence(p, p) == Approx(0.0).margin(1e-15));
  // KL is asymmetric: the wrong argument order gives a different number.
  CHECK(kl_divergence(q, p) != Approx(kl_divergence(p, q)));
}

TEST_CASE("normalized overlap of a query block (paper §7.2)", "[metrics]") {
  SelectionBlock two{{0, 1, 2, 3}, {0, 1, 2, 4}};
  CHECK(normalized_overlap(two) == Approx(3.0 / 4.0));  // (MK - |U|) / ((M-1)K)
  SelectionBlock same{{5, 6}, {5, 6}, {5, 6}};
  CHECK(normalized_overlap(same) == Approx(1.0));
  SelectionBlock disjoint{{0, 1}, {2, 3}, {4, 5}};
  CHECK(normalized_overlap(disjoint) == Approx(0.0));
  SelectionBlock single{{1, 2, 3}};
  CHECK(normalized_overlap(single) == 1.0);
  // Unequal sizes use Σ|I| − max|I|: (5 - 3) / (5 - 3) = 1 when the small set is inside.
  SelectionBlock nested{{1, 2, 3}, {2, 3}};
  CHECK(normalized_overlap(nested) == Approx(1.0));
  SelectionBlock empty_rows{{}, {}};
  CHECK(std::isnan(normalized_overlap(empty_rows)));
}

TEST_CASE("blocks from a padded selection matrix, unions and reuse", "[metrics]") {
  hils::IndexMatrix sel(3, 3);
  sel << 0, 2, -1, 2, 3, 4, 1, 2, 3;
  auto block = block_of(sel, 0, 2);
  CHECK(block[0] == std::vector<int32_t>{0, 2});
  CHECK(union_of(block) == std::vector<int32_t>{0, 2, 3, 4});
  CHECK_THROWS_AS(block_of(sel, 2, 2), hils::InvalidArgument);
  std::vector<int32_t> now{1, 2, 3, 4}, prev{0, 1, 2};
  CHECK(inter_block_reuse(now, prev) == Approx(0.5));
  CHECK(std::isnan(inter_block_reuse({}, prev)));
}

TEST_CASE("summaries use a Student-t interval and skip NaN", "[metrics]") {
  std::vector<double> v{1, 2, std::nan(""), 3, 4, 5};
  auto s = summarize_values(v, 0.95);
  CHECK(s.n == 5);
  CHECK(s.mean == Approx(3.0));
  CHECK(s.sd == Approx(std::sqrt(2.5)));
  CHECK(s.min == 1.0);
  CHECK(s.max == 5.0);
  // t_{0.975, 4} = 2.7764451; a normal quantile (1.96) would give 1.386 instead of 1.963.
  const double half = 2.7764451052 * std::sqrt(2.5) / std::sqrt(5.0);
  CHECK(s.ci_low == Approx(3.0 - half).epsilon(1e-8));
  CHECK(s.ci_high == Approx(3.0 + half).epsilon(1e-8));
  std::vector<double> one{2.0};
  auto s1 = summarize_values(one);
  CHECK(s1.mean == 2.0);
  CHECK(std::isnan(s1.ci_low));
  CHECK_THROWS_AS(summarize_values(v, 1.5), hils::InvalidArgument);
}
