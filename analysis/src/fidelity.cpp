#include "hils/analysis/fidelity.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>

#include "hils/analysis/metrics.hpp"

namespace hils::analysis {

namespace {

// What full attention and the token logits say about one query head.
struct HeadTruth {
  Matrix<double> L;           // [Tq x nc] exact chunk log-mass
  Vector<double> lse_window;  // [Tq]
  Matrix<double> o_full;      // [Tq x dv]
  ChunkLogitStats stats;
};

// One query head h of the group inputs -> its truth over the sampled queries.
HeadTruth head_truth(const AttentionInputs<double>& in, int64_t h, const Geometry& geometry,
                     double scale, const std::vector<int64_t>& queries) {
  const auto& q = in.q[h];
  HeadTruth truth;
  truth.L = exact_chunk_log_mass<double>(q, in.k[0], geometry, scale, queries);
  truth.lse_window = window_attention<double>(q, in.k[0], in.v[0], geometry, scale, queries).lse;
  truth.o_full = full_attention<double>(q, in.k[0], in.v[0], geometry, scale, queries).o;
  truth.stats = chunk_logit_stats(q, in.k[0], geometry, scale, queries);
  return truth;
}

// A mechanism's surrogate scores and outputs for each head of the group.
struct MechanismResult {
  std::vector<Matrix<double>> surrogate;  // G x [Tq x nc]
  std::vector<Matrix<double>> o;          // G x [Tq x dv]
};

MechanismResult max_logit_result(const AttentionInputs<double>& in,
                                 const std::vector<HeadTruth>& truths,
                                 const FidelityOptions& options, const Geometry& geometry,
                                 double scale, const std::vector<int64_t>& queries) {
  MechanismResult r;
  std::vector<Vector<double>> lse_windows;
  for (const auto& t : truths) {
    r.surrogate.push_back(t.stats.max_logit);
    lse_windows.push_back(t.lse_window);
  }
  const auto selection = select_chunks<double>(r.surrogate, lse_windows,
                                               options.geometry.group_rule, options.geometry.K,
                                               geometry, queries);
  for (int64_t h = 0; h < in.Hq(); ++h)
    r.o.push_back(flat_fusion_output(in.q[h], in.k[0], in.v[0], geometry, scale, queries,
                                     selection));
  return r;
}

// A spec runs as the real mechanism (group selection, its own fusion) on the group's heads.
MechanismResult spec_result(const StudyMechanism& m, const AttentionInputs<double>& in,
                            const std::vector<HeadTruth>& truths, const FidelityOptions& options,
                            const std::vector<int64_t>& queries) {
  RunOptions run;
  run.keep_surrogate_scores = true;
  run.queries = queries;
  const auto out = run_mechanism<double>(with_geometry(m.spec, options.geometry), in, run);
  MechanismResult r;
  for (int64_t h = 0; h < in.Hq(); ++h) {
    const auto& head = out.heads[h];
    // The exact rule's surrogate is L itself; use it if the reference leaves it empty.
    r.surrogate.push_back(head.surrogate_scores.size() ? head.surrogate_scores : truths[h].L);
    r.o.push_back(head.o);
  }
  return r;
}

// What the per-query metrics of one sampled query read (reference/SEMANTICS.md §9): the
// surrogate s_hat and the exact log-mass L over its candidates V(t), the top-K of each, its
// window's log-mass and the mechanism's relative output error.
struct QueryScores {
  std::vector<double> s, L;           // over V(t), chunk order
  std::vector<int64_t> picked, best;  // top_k(s, K), top_k(L, K): I_shat and I_L
  double lse_window = 0.0;
  double output_error = 0.0;
};

// One per-query metric of the fidelity study: the dataset `<mech>/<name>` of every head, its
// `meaning` attribute, and its value for one query. The results files' metric table
// (data/results_format.md), reference/SEMANTICS.md §9 and the figures (analysis/plots/
// plot_study.py METRICS) name every row; tests/analysis/test_fidelity.cpp and
// tests/python/test_plots.py fail while one of them lacks it (README "Adding a study metric").
struct FidelityMetric {
  const char* name;
  const char* meaning;
  double (*value)(const QueryScores& q);
};

double mean_gap(const QueryScores& q) {
  const auto nv = q.s.size();
  double gap = 0.0;
  for (size_t c = 0; c < nv; ++c) gap += q.L[c] - q.s[c];
  return nv > 0 ? gap / static_cast<double>(nv) : std::nan("");
}

// The metrics in the order written.
constexpr FidelityMetric kFidelityMetrics[] = {
    {"spearman", "Spearman rank correlation of s_hat and L over V(t), per query",
     [](const QueryScores& q) { return spearman(q.s, q.L); }},
    {"topk_recall", "top-K recall |I_shat ∩ I_L| / |I_L| (per-head top-K), per query",
     [](const QueryScores& q) { return topk_recall(q.picked, q.best); }},
    {"mass_recall", "mass recall sum_{I_shat} Z / sum_{I_L} Z (per-head top-K), per query",
     [](const QueryScores& q) { return mass_recall(q.L, q.picked, q.best); }},
    {"covered_mass",
     "covered attention mass (sum_{I_shat} Z + Z_swa) / (sum_V Z + Z_swa), per query",
     [](const QueryScores& q) { return covered_mass(q.L, q.picked, q.lse_window); }},
    {"output_error",
     "relative output error ||o - o_full|| / ||o_full|| of the mechanism (group selection)",
     [](const QueryScores& q) { return q.output_error; }},
    {"gap_mean", "mean gap L - s_hat over V(t) in nats, per query", mean_gap},
};

// A row left half-written (a name without its meaning or its value) stops the build here.
constexpr bool every_metric_whole() {
  for (const auto& m : kFidelityMetrics) {
    if (m.name == nullptr || m.meaning == nullptr || m.value == nullptr) return false;
    if (m.name[0] == '\0' || m.meaning[0] == '\0') return false;
  }
  return true;
}
static_assert(every_metric_whole(),
              "every row of kFidelityMetrics needs a name, a meaning and a value function");

// Query i of the sampled queries -> what its metrics read.
QueryScores query_scores(const Matrix<double>& s_hat, const HeadTruth& truth, size_t i,
                         int64_t nv, int64_t K, double output_error) {
  QueryScores q;
  q.s.resize(nv);
  q.L.resize(nv);
  for (int64_t c = 0; c < nv; ++c) {
    q.s[c] = s_hat(i, c);
    q.L[c] = truth.L(i, c);
  }
  q.picked = top_k(q.s, K);
  q.best = top_k(q.L, K);
  q.lse_window = truth.lse_window(i);
  q.output_error = output_error;
  return q;
}

// [Tq x nc] surrogate and truth -> one vector per fidelity metric, [Tq] each.
std::vector<std::vector<double>> per_query_metrics(const Matrix<double>& s_hat,
                                                   const HeadTruth& truth,
                                                   const Matrix<double>& o,
                                                   const Geometry& geometry, int64_t K,
                                                   const std::vector<int64_t>& queries) {
  std::vector<std::vector<double>> values(std::size(kFidelityMetrics),
                                          std::vector<double>(queries.size()));
  const auto errors = row_relative_errors(o, truth.o_full);
  for (size_t i = 0; i < queries.size(); ++i) {
    const auto q = query_scores(s_hat, truth, i, geometry.candidate_count(queries[i]), K,
                                errors[i]);
    for (size_t m = 0; m < std::size(kFidelityMetrics); ++m)
      values[m][i] = kFidelityMetrics[m].value(q);
  }
  return values;
}

std::string head_path(const std::string& unit, int64_t h) {
  return unit + "/head" + std::to_string(h);
}

double mean_of(const Matrix<double>& m) {
  return summarize_values(std::span<const double>(m.data(), m.size())).mean;
}

}  // namespace

const std::vector<std::string>& fidelity_metrics() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> list;
    for (const auto& m : kFidelityMetrics) list.emplace_back(m.name);
    return list;
  }();
  return names;
}

KlCheck run_fidelity_unit(const AttentionInputs<double>& inputs, int64_t layer, int64_t g,
                          const FidelityOptions& options, ResultSink& sink) {
  const auto kl = write_fidelity_unit(inputs, layer, g, options, sink);
  sink.mark_complete(options.prefix + unit_path(inputs.T(), layer, g));
  return kl;
}

KlCheck write_fidelity_unit(const AttentionInputs<double>& inputs, int64_t layer, int64_t g,
                            const FidelityOptions& options, ResultSink& sink) {
  const int64_t T = inputs.T();
  const std::string unit = options.prefix + unit_path(T, layer, g);
  const Geometry geometry(T, options.geometry.S, options.geometry.W, options.geometry.landmarks);
  auto in = group_inputs(inputs, g);
  fill_prior(in, geometry, options.prior.source);
  const auto taylor = with_geometry(study_mechanism("taylor_entropy", options.prior.rule).spec,
                                    options.geometry);
  const double scale = logit_scale(taylor, inputs.d());
  const auto queries = sample_queries(geometry, options.geometry.K, options.queries_per_unit);
  require(!queries.empty(), "context length T=" + std::to_string(T),
          "long enough for retrieval candidates (T > W + S)", "no query with a candidate");
  const int64_t G = in.Hq();

  std::vector<HeadTruth> truths;
  for (int64_t h = 0; h < G; ++h) {
    throw_if_stop_requested();  // safe points: nothing of the unit is complete yet
    truths.push_back(head_truth(in, h, geometry, scale, queries));
  }
  std::vector<int64_t> candidates;
  for (int64_t t : queries) candidates.push_back(geometry.candidate_count(t));
  sink.write(unit + "/queries", queries, "sampled query slots t");
  sink.write(unit + "/candidates", candidates, "|V(t)| candidate chunks of each query");

  KlCheck worst;
  worst.min_gap = std::numeric_limits<double>::infinity();
  worst.max_gap = -worst.min_gap;
  for (int64_t h = 0; h < G; ++h) {
    const auto path = head_path(unit, g * G + h);
    if (options.keep_scores) {
      sink.write(path + "/exact", truths[h].L, "L(t,c) exact chunk log-mass, -inf outside V(t)");
      sink.write(path + "/entropy", truths[h].stats.entropy,
                 "H(softmax_j s(t,j)) over T_c in nats, NaN outside V(t)");
    }
    std::vector<double> lse(truths[h].lse_window.data(),
                            truths[h].lse_window.data() + truths[h].lse_window.size());
    sink.write(path + "/lse_window", lse, "lse_swa(t), log window mass");
    const auto prior = resolve_prior<double>(in, h, taylor, geometry);
    const auto kl = taylor_kl_check(in.q[h], in.k[0], prior, geometry, scale, queries);
    sink.write(path + "/kl_check",
               std::vector<double>{static_cast<double>(kl.pairs), kl.max_abs_deviation,
                                   kl.min_gap, kl.max_gap},
               "taylor+entropy with q~=q: pairs, max |(L - s_hat) - KL(p_mu||p_q)|, min gap, "
               "max gap (nats)");
    worst.pairs += kl.pairs;
    worst.max_abs_deviation = std::max(worst.max_abs_deviation, kl.max_abs_deviation);
    worst.min_gap = std::min(worst.min_gap, kl.min_gap);
    worst.max_gap = std::max(worst.max_gap, kl.max_gap);
  }

  for (const auto& m : options.mechanisms) {
    throw_if_stop_requested();
    const auto r = m.max_logit ? max_logit_result(in, truths, options, geometry, scale, queries)
                               : spec_result(m, in, truths, options, queries);
    for (int64_t h = 0; h < G; ++h) {
      const auto path = head_path(unit, g * G + h) + "/" + m.name;
      if (options.keep_scores)
        sink.write(path + "/surrogate", r.surrogate[h], "s_hat(t,c), -inf outside V(t)");
      const auto values = per_query_metrics(r.surrogate[h], truths[h], r.o[h], geometry,
                                            options.geometry.K, queries);
      for (size_t i = 0; i < values.size(); ++i)
        sink.write(path + "/" + kFidelityMetrics[i].name, values[i], kFidelityMetrics[i].meaning);
    }
  }
  return worst;
}

FidelityReport run_fidelity_study(const StudySource& source, const FidelityOptions& options,
                                  ResultSink& sink, const Progress& progress) {
  require(!source.lengths.empty(), "lengths", "at least one context length", "none");
  // The first layer at the first length tells the head counts (every process loads it).
  LayerCache layers(source.load);
  int64_t Hq = 0, Hkv = 0;
  {
    const auto first = layers.get(0, source.lengths.front());
    Hq = first->Hq(), Hkv = first->Hkv();
  }
  std::vector<StudyUnit> units;
  for (int64_t T : source.lengths)
    for (int64_t layer = 0; layer < source.n_layers; ++layer)
      for (int64_t g = 0; g < Hkv; ++g)
        units.push_back({options.prefix + unit_path(T, layer, g),
                         static_cast<double>(T) * static_cast<double>(T),
                         [&layers, &options, T, layer, g](ResultSink& unit_sink) {
                           write_fidelity_unit(*layers.get(layer, T), layer, g, options, unit_sink);
                         },
                         layer_input(T, layer)});
  UnitRunner& runner = options.runner ? *options.runner : serial_runner();
  const auto done = runner.run(units, sink, progress);
  FidelityReport report;
  report.units_run = static_cast<int64_t>(done.ran.size());
  report.units_skipped = done.skipped;
  if (!runner.holds_results()) return report;
  // The Taylor/KL check over every head of the units run now, as each unit wrote it.
  report.worst_kl.min_gap = std::numeric_limits<double>::infinity();
  const int64_t G = Hq / Hkv;
  for (size_t i : done.ran)
    for (int64_t h = 0; h < G; ++h) {
      const auto g = static_cast<int64_t>(i) % Hkv;
      const auto kl = sink.read(head_path(units[i].path, g * G + h) + "/kl_check");
      require(kl.has_value(), units[i].path + " kl_check", "written by the unit", "absent");
      report.worst_kl.pairs += static_cast<int64_t>((*kl)(0, 0));
      report.worst_kl.max_abs_deviation = std::max(report.worst_kl.max_abs_deviation, (*kl)(1, 0));
      report.worst_kl.min_gap = std::min(report.worst_kl.min_gap, (*kl)(2, 0));
    }
  report.kl_ok = report.worst_kl.max_abs_deviation <= options.kl_tolerance &&
                 (report.units_run == 0 || report.worst_kl.min_gap >= -options.kl_tolerance);
  if (!sink.is_complete(options.prefix + "summary")) {
    std::vector<std::string> names;
    for (const auto& m : options.mechanisms) names.push_back(m.name);
    write_metric_summaries(sink, options.prefix, source.lengths, source.n_layers, Hq, Hkv, names,
                           fidelity_metrics(), options.confidence);
    sink.mark_complete(options.prefix + "summary");
  }
  return report;
}

void write_metric_summaries(ResultSink& sink, const std::string& prefix,
                            const std::vector<int64_t>& lengths, int64_t n_layers, int64_t Hq,
                            int64_t Hkv, const std::vector<std::string>& mechanisms,
                            const std::vector<std::string>& metrics, double confidence) {
  const int64_t G = Hq / Hkv, n_len = static_cast<int64_t>(lengths.size());
  sink.write(prefix + "summary/lengths", lengths, "context lengths T (slots), one row each");
  for (const auto& mech : mechanisms) {
    for (const auto& metric : metrics) {
      Matrix<double> rows(n_len, 8), per_head(n_len, n_layers * Hq);
      for (int64_t i = 0; i < n_len; ++i) {
        for (int64_t layer = 0; layer < n_layers; ++layer)
          for (int64_t h = 0; h < Hq; ++h) {
            const auto path = prefix + unit_path(lengths[i], layer, h / G) + "/head" +
                              std::to_string(h) + "/" + mech + "/" + metric;
            const auto values = sink.read(path);
            per_head(i, layer * Hq + h) = values ? mean_of(*values) : std::nan("");
          }
        const auto s = summarize_values(
            std::span<const double>(per_head.row(i).data(), per_head.cols()), confidence);
        const auto row = summary_row(s);
        for (int64_t j = 0; j < 8; ++j) rows(i, j) = row[j];
      }
      const auto base = prefix + "summary/" + mech + "/" + metric;
      sink.write(base, rows,
                 std::string("summary over (layer, head) means per length: ") + summary_columns());
      sink.write(base + "_per_head", per_head,
                 "mean over sampled queries per (layer, head), column = layer * Hq + head");
    }
  }
}

}  // namespace hils::analysis
