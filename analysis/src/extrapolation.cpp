#include "hils/analysis/extrapolation.hpp"

#include <algorithm>
#include <cmath>
#include <optional>

#include "hils/analysis/needle.hpp"

namespace hils::analysis {

namespace {

std::string needle_unit(const NamedEncoding& e, int64_t T) {
  return "needle/" + e.name + "/T" + std::to_string(T);
}

// The slot of a needle at depth x in [0, 1] over the candidates of the last query: the middle
// attendable slot of chunk round(x (|V|-1)).
int64_t needle_slot(const Geometry& geometry, int64_t last_query, double depth, int64_t* chunk) {
  const int64_t nv = geometry.candidate_count(last_query);
  *chunk = std::clamp<int64_t>(std::llround(depth * static_cast<double>(nv - 1)), 0, nv - 1);
  return *chunk * geometry.S() + (geometry.tokens_per_chunk() - 1) / 2;
}

}  // namespace

NeedleContext::NeedleContext(const AttentionInputs<double>& raw, const Geometry& geometry,
                             const PositionalEncoding& pe, PriorRule prior_rule,
                             PriorSource prior_source, int64_t aim_slot, double scale,
                             double logit)
    : geometry_(geometry), pe_(pe) {
  // Each KV group's needle key aimed at the group's mean raw query of slot aim_slot.
  const int64_t G = raw.Hq() / raw.Hkv();
  needles_.assign(static_cast<size_t>(raw.Hkv()), Matrix<double>(1, raw.d()));
  for (int64_t g = 0; g < raw.Hkv(); ++g) {
    Vector<double> mean_q = Vector<double>::Zero(raw.d());
    for (int64_t h = g * G; h < (g + 1) * G; ++h) mean_q += raw.q[h].row(aim_slot).transpose();
    mean_q /= static_cast<double>(G);
    plant_needle(needles_, g, 0, mean_q.transpose(), scale, logit,
                 "needle query (the last slot's)");
  }
  displaced_ = needles_;
  // Rows are rotated one by one (positional.hpp), so the context positioned without the needle
  // differs from the needled one only in the needle rows, which at() replaces.
  positioned_ = apply_positional_encoding<double>(raw, geometry, pe, prior_rule);
  fill_prior(positioned_, geometry, prior_source);
}

const AttentionInputs<double>& NeedleContext::at(int64_t slot) {
  require(slot >= 0 && slot < geometry_.T(), "needle slot", "in [0, " +
          std::to_string(geometry_.T()) + ")", std::to_string(slot));
  auto& k = positioned_.k;
  if (slot_ >= 0)  // the keys the previous slot's needles covered, back
    for (size_t g = 0; g < k.size(); ++g) k[g].row(slot_) = displaced_[g];
  std::vector<Matrix<double>> rotated = needles_;
  std::vector<Matrix<double>*> rows;
  for (auto& r : rotated) rows.push_back(&r);
  apply_rotary(rows, {geometry_.position_id(slot)}, pe_);
  for (size_t g = 0; g < k.size(); ++g) {
    displaced_[g] = k[g].row(slot);
    k[g].row(slot) = rotated[g];
  }
  slot_ = slot;
  return positioned_;
}

void run_needle_unit(const AttentionInputs<double>& raw, const NamedEncoding& encoding,
                     const ExtrapolationOptions& options, ResultSink& sink) {
  write_needle_unit(raw, encoding, options, sink);
  sink.mark_complete(needle_unit(encoding, raw.T()));
}

void write_needle_unit(const AttentionInputs<double>& raw, const NamedEncoding& encoding,
                       const ExtrapolationOptions& options, ResultSink& sink) {
  const auto& fo = options.fidelity;
  const int64_t T = raw.T();
  const Geometry geometry(T, fo.geometry.S, fo.geometry.W, fo.geometry.landmarks);
  const auto last = tail_queries(geometry, 1);
  require(!last.empty(), "needle context T=" + std::to_string(T),
          "long enough for retrieval candidates (T > W + S)", "no candidate chunk");
  const double scale = logit_scale(with_geometry(preset("full"), fo.geometry), raw.d());
  const auto unit = needle_unit(encoding, T);
  std::optional<NeedleContext> context;
  std::vector<int64_t> chunks;
  std::vector<std::vector<double>> success(fo.mechanisms.size());
  for (double depth : options.depths) {
    int64_t chunk = 0;
    const int64_t slot = needle_slot(geometry, last[0], depth, &chunk);
    chunks.push_back(chunk);
    // Positioned on the first depth (no depths, no positioning and none of its errors, as ever).
    if (!context)
      context.emplace(raw, geometry, encoding.pe, fo.prior.rule, fo.prior.source, last[0], scale,
                      options.needle_logit);
    const auto& in = context->at(slot);
    RunOptions run;
    run.queries = last;
    for (size_t m = 0; m < fo.mechanisms.size(); ++m) {
      throw_if_stop_requested();  // a safe point: nothing of the unit is complete yet
      const auto& mech = fo.mechanisms[m];
      std::vector<IndexMatrix> selection;
      if (mech.max_logit) {
        // Max-logit selection per group through the reference's select stage.
        const int64_t G = in.Hq() / in.Hkv();
        for (int64_t g = 0; g < in.Hkv(); ++g) {
          std::vector<Matrix<double>> scores;
          std::vector<Vector<double>> lse;
          for (int64_t h = g * G; h < (g + 1) * G; ++h) {
            scores.push_back(chunk_logit_stats(in.q[h], in.k[g], geometry, scale, last).max_logit);
            lse.push_back(window_attention<double>(in.q[h], in.k[g], in.v[g], geometry, scale,
                                                   last).lse);
          }
          selection.push_back(select_chunks<double>(scores, lse, fo.geometry.group_rule,
                                                    fo.geometry.K, geometry, last));
        }
      } else {
        selection = run_mechanism<double>(with_geometry(mech.spec, fo.geometry), in, run).selection;
      }
      double hits = 0.0;
      for (const auto& sel : selection)
        hits += (sel.row(0).array() == static_cast<int32_t>(chunk)).any() ? 1.0 : 0.0;
      success[m].push_back(hits / static_cast<double>(selection.size()));
    }
  }
  sink.write(unit + "/needle_chunk", chunks, "chunk holding the needle, per depth");
  for (size_t m = 0; m < fo.mechanisms.size(); ++m)
    sink.write(unit + "/" + fo.mechanisms[m].name + "/success", success[m],
               "fraction of KV groups whose I(t_last) holds the needle's chunk, per depth");
}

ExtrapolationReport run_extrapolation_study(const StudySource& raw_source,
                                            const ExtrapolationOptions& options,
                                            ResultSink& sink, const Progress& progress) {
  ExtrapolationReport report;
  report.worst_kl.min_gap = std::numeric_limits<double>::infinity();
  const auto& geo = options.fidelity.geometry;
  const int64_t per_encoding =
      (options.run_metrics ? 1 : 0) + (options.run_needle ? 1 : 0);
  const int64_t total = static_cast<int64_t>(options.encodings.size()) * per_encoding;
  int64_t done = 0;
  UnitRunner& runner = options.fidelity.runner ? *options.fidelity.runner : serial_runner();
  for (const auto& encoding : options.encodings) {
    if (options.run_metrics) {
      // The fidelity study on positioned copies of the raw vectors.
      StudySource positioned = raw_source;
      const PriorRule prior_rule = options.fidelity.prior.rule;
      positioned.load = [&raw_source, &encoding, &geo, prior_rule](int64_t layer, int64_t T) {
        const Geometry geometry(T, geo.S, geo.W, geo.landmarks);
        return apply_positional_encoding<double>(raw_source.load(layer, T), geometry,
                                                 encoding.pe, prior_rule);
      };
      FidelityOptions fo = options.fidelity;
      fo.prefix = encoding.name + "/";
      const auto r = run_fidelity_study(positioned, fo, sink);
      report.units_run += r.units_run;
      report.units_skipped += r.units_skipped;
      report.kl_ok = report.kl_ok && r.kl_ok;
      report.worst_kl.max_abs_deviation =
          std::max(report.worst_kl.max_abs_deviation, r.worst_kl.max_abs_deviation);
      report.worst_kl.min_gap = std::min(report.worst_kl.min_gap, r.worst_kl.min_gap);
      if (progress) progress(++done, total);
    }
    if (options.run_needle) {
      std::vector<StudyUnit> units;
      for (int64_t T : raw_source.lengths)
        units.push_back({needle_unit(encoding, T), static_cast<double>(T) * static_cast<double>(T),
                         [&raw_source, &encoding, &options, T](ResultSink& unit_sink) {
                           write_needle_unit(raw_source.load(options.needle_layer, T), encoding,
                                             options, unit_sink);
                         },
                         ""});  // loads its own input
      const auto needles = runner.run(units, sink, {});
      report.units_run += static_cast<int64_t>(needles.ran.size());
      report.units_skipped += needles.skipped;
      if (progress) progress(++done, total);
    }
  }
  if (!runner.holds_results()) return report;
  if (options.run_needle && !sink.is_complete("needle/summary")) {
    sink.write("needle/depths", options.depths, "needle depth x in [0, 1] of V(t_last)");
    sink.write("needle/lengths", raw_source.lengths, "context lengths T (slots)");
    for (const auto& encoding : options.encodings)
      for (const auto& mech : options.fidelity.mechanisms) {
        Matrix<double> grid(static_cast<int64_t>(raw_source.lengths.size()),
                            static_cast<int64_t>(options.depths.size()));
        for (size_t i = 0; i < raw_source.lengths.size(); ++i) {
          const auto row = sink.read(needle_unit(encoding, raw_source.lengths[i]) + "/" +
                                     mech.name + "/success");
          for (int64_t j = 0; j < grid.cols(); ++j)
            grid(i, j) = row && j < row->rows() ? (*row)(j, 0) : NAN;
        }
        sink.write("needle/" + encoding.name + "/" + mech.name + "/grid", grid,
                   "needle success rate, [length x depth]");
      }
    sink.mark_complete("needle/summary");
  }
  return report;
}

}  // namespace hils::analysis
