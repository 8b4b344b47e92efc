// The chunk-mass fidelity study (reference/SEMANTICS.md §9, paper §2.2): for sampled queries and
// every candidate chunk, the true chunk log-mass L and each mechanism's surrogate s_hat; per layer,
// head and length the gap, Spearman rank correlation, top-K recall against naive BSA, mass recall,
// covered attention mass and output error against full attention; the intra-chunk entropy of the
// query's distribution (the two regimes of Eq. 5); and the Taylor gap = KL check of
// reference/SEMANTICS.md §3.
//
// Results (paths under the sink), unit U = T<T>/layer<l>/group<g>:
//   U/queries                         [Tq] query slots
//   U/candidates                      [Tq] |V(t)|
//   U/head<h>/exact                   [Tq x n_chunks] L(t,c), -inf outside V(t)  (keep_scores)
//   U/head<h>/entropy                 [Tq x n_chunks] H(p_q) over T_c, NaN outside  (keep_scores)
//   U/head<h>/lse_window              [Tq]
//   U/head<h>/kl_check                [4] pairs, max |gap - KL|, min gap, max gap
//   U/head<h>/<mech>/surrogate        [Tq x n_chunks] s_hat  (keep_scores)
//   U/head<h>/<mech>/<metric>         [Tq] one value per query, metric in fidelity_metrics()
// and, once every unit is done, summaries over the (layer, head) means of each metric:
//   summary/lengths                   [n_len]
//   summary/<mech>/<metric>           [n_len x 8] (summary_columns(): n, mean, sd, min, max,
//                                      ci_low, ci_high, confidence)
//   summary/<mech>/<metric>_per_head  [n_len x n_layers*Hq] per-(layer, head) means
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hils/analysis/study.hpp"
#include "hils/analysis/units.hpp"

namespace hils::analysis {

struct FidelityOptions {
  StudyGeometry geometry;
  PriorChoice prior;
  std::vector<StudyMechanism> mechanisms;
  int64_t queries_per_unit = 64;
  bool keep_scores = true;     // write the [Tq x n_chunks] matrices (for scatter plots)
  double kl_tolerance = 1e-8;  // max |gap - KL| accepted by the reference/SEMANTICS.md §3 check
  double confidence = 0.95;
  std::string prefix;          // prepended to every path (e.g. "rope/" in extrapolation)
  UnitRunner* runner = nullptr;  // how the units run; nullptr: one after another here
};

// Per-query metric names, in the order written.
const std::vector<std::string>& fidelity_metrics();

struct FidelityReport {
  int64_t units_run = 0, units_skipped = 0;
  KlCheck worst_kl;         // over every head of every unit run now
  bool kl_ok = true;        // worst_kl.max_abs_deviation <= kl_tolerance and min gap >= -tol
};

// One unit: KV group g of one layer's positioned inputs. Writes under `unit` and marks it
// complete. Returns the unit's Taylor/KL check (worst over its heads).
KlCheck run_fidelity_unit(const AttentionInputs<double>& inputs, int64_t layer, int64_t g,
                          const FidelityOptions& options, ResultSink& sink);
// The same without marking the unit complete (its runner does that).
KlCheck write_fidelity_unit(const AttentionInputs<double>& inputs, int64_t layer, int64_t g,
                            const FidelityOptions& options, ResultSink& sink);

// Every (length, layer, group) of the source, skipping units already complete, then the
// summaries (skipped when "summary" is already complete).
FidelityReport run_fidelity_study(const StudySource& source, const FidelityOptions& options,
                                  ResultSink& sink, const Progress& progress = {});

// Summaries over (layer, head) means of per-query metric vectors found at
// `<prefix>T<T>/layer<l>/group<g>/head<h>/<mech>/<metric>`; writes
// `<prefix>summary/<mech>/<metric>` and `..._per_head`. Shared by fidelity and extrapolation.
void write_metric_summaries(ResultSink& sink, const std::string& prefix,
                            const std::vector<int64_t>& lengths, int64_t n_layers, int64_t Hq,
                            int64_t Hkv, const std::vector<std::string>& mechanisms,
                            const std::vector<std::string>& metrics, double confidence);

}  // namespace hils::analysis
