// The chunk-overlap study (paper §7.2, Fig. 7; reference/SEMANTICS.md §9): how much the selections
// of adjacent real-token queries overlap, which is what lets a packed kernel load one union of
// chunks for a block of M queries.
//
// Results, unit U = T<T>/layer<l>/group<g> (selection is per KV group):
//   U/queries [Tq], U/selection [Tq x K]   the last Tq adjacent real-token queries
//   U/overlap [n_M]                        mean normalized overlap over the blocks of size M
//   U/final_union, U/final_candidates, U/loaded_fraction [1]   the final block of M = final_block
//   U/reuse [n_blocks - 1]                 inter-block reuse of consecutive final_block blocks
// and summaries across (layer, group) units per length:
//   summary/lengths, summary/block_sizes
//   summary/overlap_M<M>, summary/final_union, summary/final_candidates,
//   summary/loaded_fraction, summary/reuse          [n_len x 8] (summary_columns())
//   summary/<same>_per_unit                         [n_len x n_layers*Hkv], col = layer*Hkv + g
#pragma once

#include <cstdint>
#include <vector>

#include "hils/analysis/study.hpp"
#include "hils/analysis/units.hpp"

namespace hils::analysis {

struct OverlapOptions {
  StudyGeometry geometry;
  PriorChoice prior;
  StudyMechanism mechanism;  // whose selections are studied (the paper: HiLS)
  std::vector<int64_t> block_sizes{1, 2, 4, 8, 16, 32, 64};
  int64_t final_block = 16;
  int64_t tail_queries = 256;  // adjacent real-token queries at the end of each context
  double confidence = 0.95;
  UnitRunner* runner = nullptr;  // how the units run; nullptr: one after another here
};

// Overlap metrics of one [Tq x K] selection (rows = adjacent queries, ascending).
struct OverlapUnit {
  std::vector<double> overlap;  // per block size: mean over blocks aligned to the last query
  double final_union = 0.0;     // |∪ I_m| of the final `final_block` queries
  std::vector<double> reuse;    // |U_b ∩ U_{b-1}| / |U_b| over consecutive final-size blocks
};
OverlapUnit overlap_of_selection(const IndexMatrix& selection,
                                 const std::vector<int64_t>& block_sizes, int64_t final_block);

struct OverlapReport {
  int64_t units_run = 0, units_skipped = 0;
};
OverlapReport run_overlap_study(const StudySource& source, const OverlapOptions& options,
                                ResultSink& sink, const Progress& progress = {});

}  // namespace hils::analysis
