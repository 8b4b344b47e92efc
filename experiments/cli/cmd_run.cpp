// hils run: mechanisms (presets or specs, from flags and a TOML file) over an activation file's
// layers -> a results file with o, lse, fusion weights per head and selections per KV head.
#include <cmath>
#include <optional>

#include <fmt/format.h>

#include "cli/cli_util.hpp"
#include "cli/commands.hpp"
#include "cli/spec_flags.hpp"
#include "config/config.hpp"
#include "io/activation_file.hpp"
#include "io/hdf5_util.hpp"
#include "io/results_file.hpp"
#include "io/results_sink.hpp"
#include "parallel/session.hpp"
#include "util/progress.hpp"

namespace hils::cli {

namespace {

struct RunFlags {
  std::string input, output, config;
  std::vector<std::string> presets;
  std::vector<int64_t> layers;
  nlohmann::json spec = nlohmann::json::object();  // spec fields given as flags
  nlohmann::json run = nlohmann::json::object();   // [run] settings given as flags
  bool resume = false;
};

// Everything a run needs, resolved from TOML and flags (flags win).
struct RunPlan {
  std::vector<MechanismSpec> mechanisms;
  std::vector<int64_t> layers;
  std::string positional = "auto";  // auto | nope | rope | hope
  std::optional<std::string> rope_pairing;
  std::optional<double> rope_theta;
  double hope_train_length = 8192.0, hope_m = 2.0;
  int64_t last_queries = 0;
  bool keep_scores = false, keep_window = false;
  int64_t seed = 0;
};

void apply_run_settings(RunPlan& plan, const nlohmann::json& o, const std::string& where) {
  if (o.contains("layers")) {
    require(o["layers"].is_array(), where + ".layers", "an array of layer indices",
            o["layers"].dump());
    plan.layers.clear();
    for (const auto& layer : o["layers"]) {
      require(layer.is_number_integer(), where + ".layers", "integer layer indices",
              layer.dump());
      plan.layers.push_back(layer.get<int64_t>());
    }
  }
  if (o.contains("positional")) plan.positional = config::get_string(o, "positional", where);
  if (o.contains("rope_pairing")) plan.rope_pairing = config::get_string(o, "rope_pairing", where);
  if (o.contains("rope_theta")) plan.rope_theta = config::get_number(o, "rope_theta", where);
  if (o.contains("hope_train_length"))
    plan.hope_train_length = config::get_number(o, "hope_train_length", where);
  if (o.contains("hope_m")) plan.hope_m = config::get_number(o, "hope_m", where);
  if (o.contains("last_queries")) plan.last_queries = config::get_int(o, "last_queries", where);
  if (o.contains("keep_scores")) plan.keep_scores = config::get_bool(o, "keep_scores", where);
  if (o.contains("keep_window")) plan.keep_window = config::get_bool(o, "keep_window", where);
  if (o.contains("seed")) plan.seed = config::get_int(o, "seed", where);
  require(plan.positional == "auto" || plan.positional == "nope" || plan.positional == "rope" ||
              plan.positional == "hope",
          where + ".positional", "auto | nope | rope | hope", plan.positional);
  if (plan.rope_pairing) parse_rope_pairing(*plan.rope_pairing, where + ".rope_pairing");
  if (plan.rope_theta)
    require(std::isfinite(*plan.rope_theta) && *plan.rope_theta > 1.0, where + ".rope_theta",
            "a finite RoPE base greater than 1", std::to_string(*plan.rope_theta));
  require(std::isfinite(plan.hope_train_length) && plan.hope_train_length > 0.0,
          where + ".hope_train_length", "a finite, positive training length",
          std::to_string(plan.hope_train_length));
  require(std::isfinite(plan.hope_m) && plan.hope_m > 0.0, where + ".hope_m",
          "a finite, positive period multiplier", std::to_string(plan.hope_m));
  require(plan.last_queries >= 0, where + ".last_queries", ">= 0 (0 = every query)",
          std::to_string(plan.last_queries));
}

RunPlan make_plan(const RunFlags& f) {
  RunPlan plan;
  nlohmann::json toml = nlohmann::json::object();
  if (!f.config.empty()) {
    toml = config::load_toml(f.config, config::run_schema());
    if (toml.contains("run")) apply_run_settings(plan, toml["run"], f.config + ": [run]");
    if (toml.contains("mechanism")) {
      for (size_t i = 0; i < toml["mechanism"].size(); ++i)
        plan.mechanisms.push_back(config::spec_from_json(
            toml["mechanism"][i], fmt::format("{}: [[mechanism]] #{}", f.config, i + 1)));
    }
  }
  apply_run_settings(plan, f.run, "flags");
  if (!f.layers.empty()) plan.layers = f.layers;
  for (const auto& name : f.presets) plan.mechanisms.push_back(preset(name));
  nlohmann::json overrides = f.spec;
  if (plan.mechanisms.empty()) {
    if (overrides.empty())
      throw BadInput(
          "no mechanism to run: give --preset NAME (one of full, swa, naive_bsa, nsa, lmk, hils), "
          "spec flags (--fusion, --key-rule, ...), or [[mechanism]] tables in --config");
    plan.mechanisms.push_back(MechanismSpec{});
  }
  const nlohmann::json tables = toml.value("mechanism", nlohmann::json::array());
  for (size_t i = 0; i < plan.mechanisms.size(); ++i) {
    MechanismSpec& spec = plan.mechanisms[i];
    config::apply_spec_overrides(spec, overrides, "flags");
    // Mechanisms from [[mechanism]] tables come first; presets after them.
    const bool from_file = i < tables.size();
    config::check_naming_file([&] { spec.validate(); }, from_file ? tables[i] : nlohmann::json(),
                              overrides, fmt::format("{}: [[mechanism]] #{}", f.config, i + 1));
  }
  for (size_t i = 0; i < plan.mechanisms.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (plan.mechanisms[i].name == plan.mechanisms[j].name)
        throw BadInput(fmt::format(
            "mechanism names must be unique (they name the result groups): '{}' appears twice; "
            "give one a name (--name or name = \"...\")",
            plan.mechanisms[i].name));
  return plan;
}

nlohmann::json plan_json(const RunPlan& plan, const std::string& input, int64_t T) {
  nlohmann::json mechanisms = nlohmann::json::array();
  for (const auto& spec : plan.mechanisms) mechanisms.push_back(config::spec_to_json(spec));
  std::error_code ec;
  auto absolute = std::filesystem::weakly_canonical(input, ec);
  return {{"input", ec ? input : absolute.string()},
          {"T", T},
          {"layers", plan.layers},
          {"positional", plan.positional},
          {"rope_pairing", plan.rope_pairing ? nlohmann::json(*plan.rope_pairing) : nullptr},
          {"rope_theta", plan.rope_theta ? nlohmann::json(*plan.rope_theta) : nullptr},
          {"hope_train_length", plan.hope_train_length},
          {"hope_m", plan.hope_m},
          {"last_queries", plan.last_queries},
          {"keep_scores", plan.keep_scores},
          {"keep_window", plan.keep_window},
          {"mechanisms", mechanisms}};
}

// The file's slot layout must be the one the spec assumes.
void check_layout(const MechanismSpec& spec, const io::ActivationMeta& meta,
                  const std::string& input) {
  if (spec.landmarks && !meta.landmarks_match(spec.S))
    throw BadInput(fmt::format(
        "mechanism '{}' needs the landmark layout (a landmark slot at (c+1)S-1 of every chunk, "
        "S={}), but {} has {}. Real-model dumps have no landmark slots: run a landmark-free "
        "spec (--landmarks false, and --prior-rule shared for taylor/entropy summaries; lmk's "
        "landmark_key rule cannot run), or dump a synthetic source with --landmarks true -S {}",
        spec.name, spec.S, input,
        meta.has_landmarks() ? "landmark slots at other places" : "no landmark slots", spec.S));
  if (!spec.landmarks && meta.has_landmarks())
    throw BadInput(fmt::format(
        "mechanism '{}' has landmarks off, but {} has landmark slots (their keys would be "
        "attended as tokens); set --landmarks true with the file's chunk size",
        spec.name, input));
  if (spec.needs_prior() && spec.selects() && spec.prior_rule == PriorRule::given)
    throw BadInput(fmt::format("mechanism '{}': prior_rule given needs per-chunk prior queries, "
                               "which activation files do not hold; use landmark_query or shared",
                               spec.name));
}

PositionalEncoding encoding_for(const RunPlan& plan, const io::ActivationMeta& meta) {
  PositionalEncoding pe;
  pe.kind = parse_positional_kind(plan.positional == "auto" ? "rope" : plan.positional,
                                  "positional");
  std::string pairing = plan.rope_pairing.value_or(
      meta.rope_pairing == "none" ? std::string("half") : meta.rope_pairing);
  pe.pairing = parse_rope_pairing(pairing, "rope_pairing");
  pe.theta = plan.rope_theta.value_or(meta.rope_theta > 0 ? meta.rope_theta : 10000.0);
  pe.hope_train_length = plan.hope_train_length;
  pe.hope_m = plan.hope_m;
  return pe;
}

// One row per head: the mean query of the head (the shared prior of landmark-free runs).
std::vector<Matrix<double>> mean_queries(const std::vector<Matrix<double>>& q) {
  std::vector<Matrix<double>> prior;
  for (const auto& m : q) prior.emplace_back(m.colwise().mean());
  return prior;
}

// The mechanism's inputs: stored vectors as they are, or un-rotated ones with an encoding
// applied at the file's position ids.
AttentionInputs<double> inputs_for(const MechanismSpec& spec, const RunPlan& plan,
                                   const io::ActivationMeta& meta,
                                   const io::LayerActivations& layer, const std::string& input) {
  const bool already = meta.rotated;
  const bool apply = plan.positional == "auto" ? (!already && meta.rope_pairing != "none")
                                               : plan.positional != "nope" || already;
  AttentionInputs<double> raw = layer.inputs;
  if (!apply) {
    if (spec.needs_prior() && spec.prior_rule == PriorRule::shared) raw.prior = mean_queries(raw.q);
    return raw;
  }
  if (already) {
    if (layer.q_unrotated.empty() || layer.k_unrotated.empty())
      throw BadInput(fmt::format("--positional {}: {} holds rotated q/k without q_unrotated and "
                                 "k_unrotated, so no other encoding can be applied",
                                 plan.positional, input));
    if (!raw.q_retrieval.empty())
      throw BadInput(fmt::format("--positional {}: {} holds rotated q_retrieval without an "
                                 "un-rotated copy",
                                 plan.positional, input));
    raw.q = layer.q_unrotated;
    raw.k = layer.k_unrotated;
  }
  if (spec.needs_prior() && spec.prior_rule == PriorRule::shared) raw.prior = mean_queries(raw.q);
  Geometry geometry = geometry_of(spec, meta.T);
  if (geometry.position_ids() != meta.position_ids)
    throw BadInput(fmt::format("{}: position_ids differ from those of the mechanism's layout "
                               "(S={}, landmarks={}); cannot apply an encoding",
                               input, spec.S, spec.landmarks));
  PositionalEncoding pe = encoding_for(plan, meta);
  if (pe.kind == PositionalKind::nope) return raw;
  return apply_positional_encoding(raw, geometry, pe, spec.prior_rule);
}

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

// The layer the last unit of this process read, kept for the next unit of the same layer
// (units are listed layer by layer); one layer is held at a time, never all of them.
class LayerReader {
 public:
  LayerReader(std::string input, const io::ActivationMeta& meta)
      : input_(std::move(input)), meta_(meta) {}
  const io::LayerActivations& get(int64_t layer) {
    if (layer != index_) {
      data_ = io::LayerActivations{};  // free the old layer before reading the next
      data_ = io::read_activation_layer(input_, meta_, layer);
      index_ = layer;
    }
    return data_;
  }

 private:
  std::string input_;
  io::ActivationMeta meta_;
  int64_t index_ = -1;
  io::LayerActivations data_;
};

// One unit per (layer, mechanism), layer by layer, all of equal estimated cost, so that the
// schedule (analysis::schedule_order) is this list order under any runner.
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
                         auto inputs = inputs_for(spec, plan, meta, layers.get(l), input);
                         auto out = run_mechanism(spec, inputs, options);
                         sink.set_attribute(spec.name, "spec", config::spec_to_json(spec).dump());
                         sink.set_attribute(spec.name, "description", describe(spec));
                         write_unit(sink, path, out, options);
                       }});
    }
  return units;
}

// The configuration of a resumed file after this run: layers and mechanisms united. Throws
// BadInput when a mechanism of the same name was run with a different spec.
nlohmann::json merged_config(const std::string& output, const RunPlan& plan,
                             nlohmann::json config) {
  io::ResultsReader reader(output);
  for (const auto& spec : plan.mechanisms) {
    if (!reader.has_attribute(spec.name, "spec")) continue;
    auto stored = nlohmann::json::parse(reader.string_attribute(spec.name, "spec"));
    if (stored != config::spec_to_json(spec))
      throw BadInput(fmt::format("{}: mechanism '{}' was run with spec {}, this run asks for {}; "
                                 "give it another name or write a new results file",
                                 output, spec.name, stored.dump(),
                                 config::spec_to_json(spec).dump()));
  }
  nlohmann::json existing = reader.config();
  std::vector<int64_t> layers = existing.value("layers", std::vector<int64_t>{});
  for (int64_t l : plan.layers)
    if (std::find(layers.begin(), layers.end(), l) == layers.end()) layers.push_back(l);
  std::sort(layers.begin(), layers.end());
  nlohmann::json mechanisms = existing.value("mechanisms", nlohmann::json::array());
  for (const auto& spec : config["mechanisms"]) {
    bool known = false;
    for (const auto& m : mechanisms) known = known || m["name"] == spec["name"];
    if (!known) mechanisms.push_back(spec);
  }
  config["layers"] = layers;
  config["mechanisms"] = mechanisms;
  return config;
}

// The results file, on the process that holds the results (alone, or MPI rank 0): locked, then
// created, or resumed with its configuration merged with this run's.
class RunResults {
 public:
  RunResults(const RunFlags& flags, const RunPlan& plan, io::Provenance provenance)
      : lock_(flags.output, provenance.command),
        writer_(open(flags, plan, provenance)),
        sink_(writer_) {
    if (resuming_) writer_.set_attribute("", "config", provenance.config.dump());
    writer_.set_attribute("", "mpi_ranks", static_cast<double>(parallel::ranks()));
  }
  analysis::ResultSink& sink() { return sink_; }
  void commit() { writer_.commit(); }

 private:
  io::ResultsWriter open(const RunFlags& flags, const RunPlan& plan, io::Provenance& provenance) {
    std::error_code ec;
    resuming_ = flags.resume && std::filesystem::exists(flags.output, ec);
    if (!resuming_) return io::ResultsWriter::create(flags.output, provenance);
    provenance.config = merged_config(flags.output, plan, provenance.config);
    // Layers and mechanisms may grow when resuming; every other setting must match.
    return io::ResultsWriter::resume(flags.output, provenance, {"layers", "mechanisms"});
  }
  // Held from before the old file is read until the new one is published: a second writer of
  // this file (say another --resume) is refused instead of losing this run's units or its own.
  io::OutputLock lock_;
  bool resuming_ = false;
  io::ResultsWriter writer_;
  io::ResultsWriterSink sink_;
};

void run(const RunFlags& flags) {
  require_input_file(flags.input, "ACTIVATIONS");
  require_distinct_files(flags.input, "ACTIVATIONS", flags.output, "--output");
  io::require_writable_folder(flags.output);
  RunPlan plan = make_plan(flags);
  const io::ActivationMeta meta = io::read_activation_meta(flags.input);
  if (plan.layers.empty())
    for (int64_t l = 0; l < meta.n_layers; ++l) plan.layers.push_back(l);
  for (int64_t l : plan.layers)
    if (l < 0 || l >= meta.n_layers)
      throw BadInput(fmt::format("--layers: expected indices in 0..{} ({} has {} layers), got {}",
                                 meta.n_layers - 1, flags.input, meta.n_layers, l));
  require(plan.last_queries <= meta.T, "last_queries", fmt::format("at most T={}", meta.T),
          std::to_string(plan.last_queries));
  for (const auto& spec : plan.mechanisms) check_layout(spec, meta, flags.input);
  RunOptions options;
  options.keep_surrogate_scores = options.keep_exact_scores = plan.keep_scores;
  options.keep_window = plan.keep_window;
  for (int64_t t = meta.T - plan.last_queries; plan.last_queries > 0 && t < meta.T; ++t)
    options.queries.push_back(t);
  LayerReader layers(flags.input, meta);
  const auto units = list_units(plan, meta, flags.input, options, layers);
  analysis::UnitRunner& runner = parallel::current_runner();
  if (!runner.holds_results()) {  // an MPI worker: computes the units rank 0 hands out
    analysis::RecordingSink unused;
    runner.run(units, unused, {});
    return;
  }

  // Validate every layer before any output exists, so that bad input never leaves a partial
  // results file behind (layers are read again, one at a time, when they are run). Under MPI
  // only rank 0 does this: N ranks reading the whole file up front would cost N full reads.
  for (int64_t l : plan.layers) io::read_activation_layer(flags.input, meta, l);
  RunResults results(flags, plan,
                     {plan_json(plan, flags.input, meta.T), static_cast<uint64_t>(plan.seed),
                      command_line()});
  std::unique_ptr<ProgressBar> bar;
  auto progress = [&bar](int64_t, int64_t total) {
    if (!bar) bar = std::make_unique<ProgressBar>("hils run", total, "units", global_options().quiet);
    bar->advance();
  };
  const auto done = runner.run(units, results.sink(), progress);
  results.commit();
  if (bar) bar->finish();
  fmt::print("{} unit(s) computed, {} already complete -> {}\n", done.ran.size(), done.skipped,
             flags.output);
}

template <class T>
void add_json_option(CLI::App* cmd, nlohmann::json* target, const std::string& names,
                     const std::string& key, const std::string& help) {
  cmd->add_option_function<T>(names, [target, key](const T& v) { (*target)[key] = v; }, help);
}

}  // namespace

void register_run(CLI::App& app) {
  auto flags = std::make_shared<RunFlags>();
  auto* cmd = app.add_subcommand("run", "run attention mechanisms over an activation file");
  cmd->add_option("ACTIVATIONS", flags->input, "activation file (hils dump, hf_dump.py)")
      ->required();
  add_output_option(cmd, &flags->output, "results file to write (HDF5)")->required();
  add_config_option(cmd, &flags->config,
                  "TOML file: [run] settings and [[mechanism]] tables (flags win)");
  cmd->add_option("-p,--preset", flags->presets,
                  "preset(s): full swa naive_bsa nsa lmk hils (repeat or comma-separate)")
      ->delimiter(',');
  cmd->add_option("--layers", flags->layers, "layers to run (default all)")->delimiter(',');
  add_spec_flags(cmd, &flags->spec);
  nlohmann::json* run_settings = &flags->run;
  add_json_option<std::string>(cmd, run_settings, "--positional", "positional",
                               "auto | nope | rope | hope (auto: use the file as it is, "
                               "rotating un-rotated RoPE vectors)");
  add_json_option<std::string>(cmd, run_settings, "--rope-pairing", "rope_pairing",
                               "half | interleaved (default: the file's)");
  add_json_option<double>(cmd, run_settings, "--rope-theta", "rope_theta",
                          "RoPE base (default: the file's)");
  add_json_option<double>(cmd, run_settings, "--hope-train-length", "hope_train_length",
                          "HoPE training length (8192)");
  add_json_option<int64_t>(cmd, run_settings, "--last-queries", "last_queries",
                           "compute only the last N queries (0 = all)");
  add_json_option<bool>(cmd, run_settings, "--keep-scores", "keep_scores",
                        "true/false: also write surrogate and exact chunk scores");
  add_json_option<bool>(cmd, run_settings, "--keep-window", "keep_window",
                        "true/false: also write the window branch");
  add_json_option<int64_t>(cmd, run_settings, "--seed", "seed",
                           "recorded in the results (runs are deterministic)");
  cmd->add_flag("--resume", flags->resume,
                "continue an existing results file of the same configuration, skipping "
                "complete units");
  cmd->footer(
      "Spec flags override every mechanism (presets and [[mechanism]] tables).\n"
      "Output: /<mechanism>/layer<l>/head<h>/{o,lse,fusion_weights},\n"
      "        /<mechanism>/layer<l>/kv_head<g>/selection, /<mechanism>/layer<l>/queries.\n"
      "Examples:\n"
      "  hils dump synthetic -o synth.h5 -S 16     # landmark slots every 16 slots\n"
      "  hils run synth.h5 -o res.h5 --preset full,nsa,hils -S 16 -W 32 -K 4 --landmarks true\n"
      "  hils run synth.h5 -o res_cfg.h5 -c experiments/configs/run_example.toml --resume\n"
      "  hils dump llama2c -o llama.h5                # no landmark slots\n"
      "  hils run llama.h5 -o llama_res.h5 --preset full,swa,naive_bsa,nsa -S 16 -W 32 -K 2\n"
      "  hils run llama.h5 -o hils_res.h5 --preset hils --landmarks false --prior-rule shared\n"
      "A file with landmark slots needs --landmarks true and its own chunk size (-S).");
  cmd->callback([flags] { run(*flags); });
}

}  // namespace hils::cli
