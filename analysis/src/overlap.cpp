#include "hils/analysis/overlap.hpp"

#include <cmath>
#include <span>

#include "hils/analysis/metrics.hpp"

namespace hils::analysis {

namespace {

double finite_mean(const std::vector<double>& v) {
  return summarize_values(v).mean;
}

// Writes one unit: the mechanism's selections for the tail queries and their overlap metrics.
void write_overlap_unit(const AttentionInputs<double>& inputs, int64_t layer, int64_t g,
                        const OverlapOptions& options, ResultSink& sink) {
  const int64_t T = inputs.T();
  const std::string unit = unit_path(T, layer, g);
  const Geometry geometry(T, options.geometry.S, options.geometry.W, options.geometry.landmarks);
  auto in = group_inputs(inputs, g);
  fill_prior(in, geometry, options.prior.source);
  RunOptions run;
  run.queries = tail_queries(geometry, options.tail_queries);
  require(!run.queries.empty(), "context length T=" + std::to_string(T),
          "long enough for retrieval candidates (T > W + S)", "no query with a candidate");
  const auto out = run_mechanism<double>(with_geometry(options.mechanism.spec, options.geometry),
                                         in, run);
  const auto& selection = out.selection.at(0);
  const auto metrics = overlap_of_selection(selection, options.block_sizes, options.final_block);
  const double candidates = static_cast<double>(geometry.candidate_count(run.queries.back()));
  sink.write(unit + "/queries", run.queries, "adjacent real-token query slots (the tail)");
  sink.write(unit + "/selection", selection, "selected chunks I(t) of the group, -1 padded");
  sink.write(unit + "/overlap", metrics.overlap,
             "mean normalized overlap (sum|I| - |U|)/(sum|I| - max|I|) per block size");
  sink.write(unit + "/final_union", std::vector<double>{metrics.final_union},
             "|union of I_m| over the final block of queries (chunks)");
  sink.write(unit + "/final_candidates", std::vector<double>{candidates},
             "|V(t)| of the last query (visible historical chunks)");
  sink.write(unit + "/loaded_fraction", std::vector<double>{metrics.final_union / candidates},
             "final union / |V(t_last)|");
  sink.write(unit + "/reuse", metrics.reuse,
             "inter-block reuse |U_b ∩ U_{b-1}| / |U_b|, consecutive final-size blocks");
}

// Per-unit scalar -> summary row per length and the per-unit table.
void write_unit_summary(ResultSink& sink, const std::string& name, const Matrix<double>& per_unit,
                        double confidence, const std::string& meaning) {
  Matrix<double> rows(per_unit.rows(), 8);
  for (int64_t i = 0; i < per_unit.rows(); ++i) {
    const auto row = summary_row(summarize_values(
        std::span<const double>(per_unit.row(i).data(), per_unit.cols()), confidence));
    for (int64_t j = 0; j < 8; ++j) rows(i, j) = row[j];
  }
  sink.write("summary/" + name, rows,
             meaning + "; summary over (layer, group) units per length: " + summary_columns());
  sink.write("summary/" + name + "_per_unit", per_unit,
             meaning + "; per unit, column = layer * Hkv + group");
}

void write_overlap_summaries(ResultSink& sink, const StudySource& source,
                             const OverlapOptions& options, int64_t Hkv) {
  const int64_t n_len = static_cast<int64_t>(source.lengths.size());
  const int64_t n_units = source.n_layers * Hkv;
  const int64_t n_m = static_cast<int64_t>(options.block_sizes.size());
  std::vector<Matrix<double>> overlap(n_m, Matrix<double>::Constant(n_len, n_units, NAN));
  Matrix<double> fu = Matrix<double>::Constant(n_len, n_units, NAN), fc = fu, lf = fu, re = fu;
  for (int64_t i = 0; i < n_len; ++i)
    for (int64_t layer = 0; layer < source.n_layers; ++layer)
      for (int64_t g = 0; g < Hkv; ++g) {
        const auto unit = unit_path(source.lengths[i], layer, g);
        const int64_t col = layer * Hkv + g;
        if (auto o = sink.read(unit + "/overlap"))
          for (int64_t m = 0; m < n_m && m < o->rows(); ++m) overlap[m](i, col) = (*o)(m, 0);
        if (auto v = sink.read(unit + "/final_union")) fu(i, col) = (*v)(0, 0);
        if (auto v = sink.read(unit + "/final_candidates")) fc(i, col) = (*v)(0, 0);
        if (auto v = sink.read(unit + "/loaded_fraction")) lf(i, col) = (*v)(0, 0);
        if (auto v = sink.read(unit + "/reuse"))
          re(i, col) = summarize_values(std::span<const double>(v->data(), v->size())).mean;
      }
  sink.write("summary/lengths", source.lengths, "context lengths T (slots), one row each");
  sink.write("summary/block_sizes", options.block_sizes, "block sizes M of the overlap rows");
  for (int64_t m = 0; m < n_m; ++m)
    write_unit_summary(sink, "overlap_M" + std::to_string(options.block_sizes[m]), overlap[m],
                       options.confidence, "normalized overlap at M=" +
                       std::to_string(options.block_sizes[m]));
  write_unit_summary(sink, "final_union", fu, options.confidence, "final-block union size");
  write_unit_summary(sink, "final_candidates", fc, options.confidence, "|V(t_last)|");
  write_unit_summary(sink, "loaded_fraction", lf, options.confidence, "final union / |V|");
  write_unit_summary(sink, "reuse", re, options.confidence, "mean inter-block reuse");
}

}  // namespace

OverlapUnit overlap_of_selection(const IndexMatrix& selection,
                                 const std::vector<int64_t>& block_sizes, int64_t final_block) {
  const int64_t Tq = selection.rows();
  require(final_block >= 1, "final_block", ">= 1", std::to_string(final_block));
  OverlapUnit unit;
  for (int64_t M : block_sizes) {
    require(M >= 1, "block_sizes", "every M >= 1", std::to_string(M));
    std::vector<double> values;
    for (int64_t end = Tq; end - M >= 0; end -= M)
      values.push_back(normalized_overlap(block_of(selection, end - M, M)));
    unit.overlap.push_back(values.empty() ? NAN : finite_mean(values));
  }
  const int64_t M = std::min(final_block, Tq);
  unit.final_union = static_cast<double>(union_of(block_of(selection, Tq - M, M)).size());
  // Blocks aligned to the last query, compared with the block just before them in time.
  std::vector<std::vector<int32_t>> unions;
  for (int64_t end = Tq; end - final_block >= 0; end -= final_block)
    unions.insert(unions.begin(), union_of(block_of(selection, end - final_block, final_block)));
  for (size_t b = 1; b < unions.size(); ++b)
    unit.reuse.push_back(inter_block_reuse(unions[b], unions[b - 1]));
  return unit;
}

OverlapReport run_overlap_study(const StudySource& source, const OverlapOptions& options,
                                ResultSink& sink, const Progress& progress) {
  require(!source.lengths.empty(), "lengths", "at least one context length", "none");
  // The first layer at the first length tells the head counts (every process loads it).
  LayerCache layers(source.load);
  const int64_t Hkv = layers.get(0, source.lengths.front())->Hkv();
  std::vector<StudyUnit> units;
  for (int64_t T : source.lengths)
    for (int64_t layer = 0; layer < source.n_layers; ++layer)
      for (int64_t g = 0; g < Hkv; ++g)
        units.push_back({unit_path(T, layer, g), static_cast<double>(T) * static_cast<double>(T),
                         [&layers, &options, T, layer, g](ResultSink& unit_sink) {
                           write_overlap_unit(*layers.get(layer, T), layer, g, options, unit_sink);
                         },
                         layer_input(T, layer)});
  UnitRunner& runner = options.runner ? *options.runner : serial_runner();
  const auto done = runner.run(units, sink, progress);
  OverlapReport report;
  report.units_run = static_cast<int64_t>(done.ran.size());
  report.units_skipped = done.skipped;
  if (runner.holds_results() && !sink.is_complete("summary")) {
    write_overlap_summaries(sink, source, options, Hkv);
    sink.mark_complete("summary");
  }
  return report;
}

}  // namespace hils::analysis
