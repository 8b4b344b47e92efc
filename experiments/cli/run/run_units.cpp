// hils run's units: the reference run on one layer for one mechanism, its outputs written as
// the results layout (data/results_format.md) says.
#include "cli/run/run_units.hpp"

#include <fmt/format.h>

#include "config/spec_codec.hpp"
#include "io/hdf5_util.hpp"

namespace hils::cli::run_command {

namespace {

// A unit's outputs -> datasets under `unit` (the layout in the --help footer).
void write_unit(analysis::ResultSink& sink, const std::string& unit,
                const MechanismOutputs<double>& out, const RunOptions& options) {
  auto as_vector = [](const Vector<double>& v) {
    return std::vector<double>(v.data(), v.data() + v.size());
  };
  sink.write(unit + "/queries", out.queries, "query slot of every output row");
  for (size_t h = 0; h < out.heads.size(); ++h) {
    const auto& head = out.heads[h];
    std::string prefix = fmt::format("{}/head{}/", unit, h);
    sink.write(prefix + "o", head.o, "attention output [Tq x dv]");
    sink.write(prefix + "lse", as_vector(head.lse), "log normalizer of the final softmax [Tq]");
    sink.write(prefix + "fusion_weights", head.fusion_weights,
               "[Tq x (K+2)] weight of each selected chunk (selection order, 0 for "
               "padding), then the window, then the softmax1 zero logit");
    if (options.keep_surrogate_scores && head.surrogate_scores.size() > 0)
      sink.write(prefix + "surrogate_scores", head.surrogate_scores,
                 "s_hat(t,c) [Tq x n_chunks], -inf outside V(t)");
    if (options.keep_exact_scores && head.exact_scores.size() > 0)
      sink.write(prefix + "exact_scores", head.exact_scores,
                 "exact chunk log-mass L(t,c) [Tq x n_chunks], -inf outside V(t)");
    if (options.keep_window && head.o_window.size() > 0) {
      sink.write(prefix + "o_window", head.o_window, "window output o_swa [Tq x dv]");
      sink.write(prefix + "lse_window", as_vector(head.lse_window), "window lse_swa [Tq]");
    }
  }
  for (size_t g = 0; g < out.selection.size(); ++g)
    sink.write(fmt::format("{}/kv_head{}/selection", unit, g), out.selection[g],
               "[Tq x K] selected chunks of the KV group, ascending, -1 padded");
}

}  // namespace

// plan, meta, input, options, layers -> the units, in list order.
std::vector<analysis::StudyUnit> list_units(const RunPlan& plan, const io::ActivationMeta& meta,
                                            const std::string& input, const RunOptions& options,
                                            LayerReader& layers) {
  std::vector<analysis::StudyUnit> units;
  for (int64_t l : plan.layers)
    for (const auto& spec : plan.mechanisms) {
      const std::string path = fmt::format("{}/layer{}", spec.name, l);
      const MechanismSpec* mechanism = &spec;  // plan, meta, options, layers outlive the units
      units.push_back({path, 1.0, [&plan, &meta, &input, &options, &layers, mechanism, l,
                                   path](analysis::ResultSink& sink) {
                         const MechanismSpec& spec = *mechanism;
                         auto inputs = inputs_for(spec, plan, meta, *layers.get(l), input);
                         // A safe point before the long part (its outputs are written at once).
                         analysis::throw_if_stop_requested();
                         auto out = run_mechanism(spec, inputs, options);
                         sink.set_attribute(spec.name, "spec", io::json_text(config::spec_to_json(spec)));
                         sink.set_attribute(spec.name, "description", describe(spec));
                         write_unit(sink, path, out, options);
                       },
                       fmt::format("layer{}", l)});
    }
  return units;
}


}  // namespace hils::cli::run_command
