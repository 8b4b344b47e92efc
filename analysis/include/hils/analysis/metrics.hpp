// The metrics of reference/SEMANTICS.md §9 on plain vectors: rank correlation, recall of a top-K
// selection, mass recall and covered mass (all in log space), output error, chunk overlap of a
// query block, and summaries with Student-t confidence intervals.
//
// Conventions: a metric that is undefined on its input (zero variance, empty reference set)
// returns NaN; summaries skip NaN values and report how many they used.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "hils/types.hpp"

namespace hils::analysis {

// ---- Correlation -----------------------------------------------------------------------

// [n] -> [n]: ranks 1..n in ascending order of x, ties get the average of their ranks.
std::vector<double> average_ranks(std::span<const double> x);
// [n],[n] -> Pearson correlation; NaN when n < 2 or either side has zero variance.
double pearson(std::span<const double> x, std::span<const double> y);
// [n],[n] -> Spearman correlation: Pearson of average ranks (ties averaged).
double spearman(std::span<const double> x, std::span<const double> y);

// ---- Selections and masses ---------------------------------------------------------------

// [n] -> the min(K, n) indices with the largest scores, ascending; ties go to the lower index
// (reference/SEMANTICS.md §4). -inf entries are never selected.
std::vector<int64_t> top_k(std::span<const double> scores, int64_t K);
// |selected ∩ reference| / |reference|; NaN when reference is empty.
double topk_recall(std::span<const int64_t> selected, std::span<const int64_t> reference);
// LSE of log_mass over the listed indices (-inf for none).
double log_mass_of(std::span<const double> log_mass, std::span<const int64_t> chunks);
// Σ_{c∈selected} Z_c / Σ_{c∈reference} Z_c with Z = exp(log_mass); NaN when reference is empty.
double mass_recall(std::span<const double> log_mass, std::span<const int64_t> selected,
                   std::span<const int64_t> reference);
// (Σ_{c∈selected} Z_c + Z_swa) / (Σ_{c∈V} Z_c + Z_swa); log_mass holds the candidates V only.
double covered_mass(std::span<const double> log_mass, std::span<const int64_t> selected,
                    double lse_window);
// ‖o − o_ref‖ / ‖o_ref‖ (Frobenius over the rows given); NaN when o_ref is zero.
double relative_error(const Matrix<double>& o, const Matrix<double>& o_ref);
// Row-wise ‖o_i − o_ref_i‖ / ‖o_ref_i‖: [Tq x dv],[Tq x dv] -> [Tq].
std::vector<double> row_relative_errors(const Matrix<double>& o, const Matrix<double>& o_ref);

// ---- Distributions inside a chunk --------------------------------------------------------

// [n] logits -> log softmax, stable.
std::vector<double> log_softmax(std::span<const double> logits);
// [n] logits -> entropy of softmax(logits) in nats.
double softmax_entropy(std::span<const double> logits);
// KL(softmax(logits_p) || softmax(logits_q)) in nats; both of length n.
double kl_divergence(std::span<const double> logits_p, std::span<const double> logits_q);

// ---- Chunk overlap (paper §7.2) ----------------------------------------------------------

// One row per query of the block, chunk ids, -1 entries ignored.
using SelectionBlock = std::vector<std::vector<int32_t>>;
// Selections of rows [first, first + M) of a [Tq x K] selection matrix, -1 padding dropped.
SelectionBlock block_of(const IndexMatrix& selection, int64_t first, int64_t M);
// Distinct chunk ids of a block, ascending.
std::vector<int32_t> union_of(const SelectionBlock& block);
// (Σ|I_m| − |∪ I_m|) / (Σ|I_m| − max|I_m|). A block of one query is 1 by convention (the
// paper's single-query baseline); NaN when the denominator is 0 for M > 1.
double normalized_overlap(const SelectionBlock& block);
// |U_b ∩ U_prev| / |U_b|; NaN when U_b is empty.
double inter_block_reuse(std::span<const int32_t> union_now, std::span<const int32_t> union_prev);

// ---- Summaries ---------------------------------------------------------------------------

struct Summary {
  int64_t n = 0;        // finite values used
  double mean = 0.0;    // NaN when n = 0
  double sd = 0.0;      // sample standard deviation (n - 1); NaN when n < 2
  double min = 0.0, max = 0.0;
  double ci_low = 0.0, ci_high = 0.0;  // Student-t interval of the mean; NaN when n < 2
  double confidence = 0.95;
};
// Summary of the finite values of x with a two-sided Student-t interval at `confidence`.
Summary summarize_values(std::span<const double> x, double confidence = 0.95);
// The 8 fields as a row [n, mean, sd, min, max, ci_low, ci_high, confidence], for results files.
std::vector<double> summary_row(const Summary& s);
// Column names of summary_row, comma separated.
const char* summary_columns();

}  // namespace hils::analysis
