// hils studies: the three studies (fidelity, overlap, extrapolation) on a built-in default in a
// few minutes, plus the plumbing the study commands share (study_cli.hpp): configs, sources,
// the HDF5 results sink and plotting.
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/cli_util.hpp"
#include "cli/commands.hpp"
#include "cli/spec_flags.hpp"
#include "config/config.hpp"
#include "hils/spec_fields.hpp"
#include "hils/analysis/chunk_stats.hpp"
#include "hils/analysis/extrapolation.hpp"
#include "hils/analysis/overlap.hpp"
#include "hils/analysis/study_cli.hpp"
#include "io/activation_file.hpp"
#include "io/hdf5_util.hpp"
#include "io/results_file.hpp"
#include "io/results_sink.hpp"
#include "parallel/session.hpp"
#include "sources/study_inputs.hpp"
#include "util/progress.hpp"
#include "util/shared_data.hpp"

namespace hils::cli::studies {

namespace {

using analysis::PriorChoice;
using analysis::StudyGeometry;
using analysis::StudySource;
using nlohmann::json;

// ---- Results sink over the HDF5 results writer --------------------------------------------

// The study's results file: locked, the earlier (interrupted) file kept for reading back its
// units, and the writer seen as a sink (io::ResultsWriterSink).
class ResultsFileSink {
 public:
  ResultsFileSink(const std::filesystem::path& path, const io::Provenance& provenance)
      : lock_(path, provenance.command),
        writer_(open(path, provenance)),
        sink_(writer_, io::ResultsWriterSink::ReadBack::written_and_previous, previous_.get()) {}
  analysis::ResultSink& sink() { return sink_; }
  void commit() { writer_.commit(); }

 private:
  io::ResultsWriter open(const std::filesystem::path& path, const io::Provenance& provenance) {
    if (std::filesystem::exists(path)) previous_ = std::make_unique<io::ResultsReader>(path);
    return io::ResultsWriter::open(path, provenance);
  }
  io::OutputLock lock_;  // taken before the earlier file is read (see io::OutputLock)
  std::unique_ptr<io::ResultsReader> previous_;
  io::ResultsWriter writer_;
  io::ResultsWriterSink sink_;
};

// ---- Configuration ------------------------------------------------------------------------

// Everything a study run needs, resolved from defaults, the TOML config and flags.
struct Resolved {
  std::string source_kind;
  StudySource source;       // positioned inputs
  StudySource raw_source;   // un-rotated inputs (extrapolation)
  StudyGeometry geometry;
  PriorChoice prior;
  std::vector<std::string> mechanisms;
  int64_t queries = 32;
  int64_t tail_queries = 256;
  std::vector<int64_t> block_sizes{1, 2, 4, 8, 16, 32, 64};
  int64_t final_block = 16;
  std::vector<std::string> encodings{"rope", "hope", "nope"};
  int64_t train_length = 1024;
  double theta = 10000.0;
  std::string pairing = "half";
  std::vector<double> depths{0.0, 0.25, 0.5, 0.75, 1.0};
  double needle_logit = 6.0;
  std::string overlap_mechanism = "taylor_entropy";
  bool keep_scores = true;
  json config;  // what went into the run, for provenance and resume checks
};

// The synthetic source's parameters: the studies' default (the drift generator, seed 0x5eed),
// then the [source] table's keys, which are those of `hils dump synthetic` (config/config.hpp)
// less the ones a study sets itself (study_schema() refuses those by name).
sources::SyntheticParams synthetic_params(const config::ConfigValues& c,
                                          const StudyGeometry& geometry) {
  sources::SyntheticParams params;
  params.generator = "drift";
  params.seed = 0x5eed;
  json keys = c.table("source");
  keys.erase("kind"), keys.erase("layers");
  config::apply_synthetic_json(params, keys, c.file() + ": [source]");
  params.S = geometry.S;
  params.landmarks = geometry.landmarks;
  return params;
}

void build_sources(Resolved& r, const StudyArgs& a, const config::ConfigValues& c) {
  sources::StudyInputs inputs;
  if (r.source_kind == "synthetic") {
    // Fidelity and overlap see the synthetic vectors under RoPE, as a model would.
    const PositionalEncoding pe{PositionalKind::rope, RopePairing::half, r.theta};
    inputs = sources::synthetic_study_inputs(synthetic_params(c, r.geometry), pe,
                                             r.source.n_layers, r.source.lengths);
  } else if (r.source_kind == "model") {
    inputs = sources::model_study_inputs(sources::ModelFiles::in_folder(a.model_dir),
                                         r.source.n_layers, r.source.lengths);
  } else if (r.source_kind == "activations") {
    if (a.activations.empty()) throw BadInput("--activations: a file is needed for source=activations");
    inputs = sources::activation_study_inputs(a.activations, r.source.n_layers, r.source.lengths);
  } else {
    throw BadInput("source: one of synthetic, model, activations, got '" + r.source_kind + "'");
  }
  r.source = std::move(inputs.positioned);
  r.raw_source = std::move(inputs.raw);
  r.config["source"] = std::move(inputs.description);
}

// How an error names a value that a flag or a config key can set: "--flag (or key in FILE)".
std::string where_set(const std::string& flag, const std::string& key,
                      const config::ConfigValues& c) {
  return c.file() == "(defaults)" ? flag : flag + " (or " + key + " in " + c.file() + ")";
}

// BadInput unless `value` >= `least`, naming the flag and the config key that can set it.
void require_at_least(int64_t value, int64_t least, const std::string& flag,
                      const std::string& key, const config::ConfigValues& c) {
  if (value >= least) return;
  throw BadInput(fmt::format("{}: expected an integer >= {}, got {}", where_set(flag, key, c),
                             least, value));
}

// The most layers a synthetic source draws. Each layer is one more independent draw of the same
// model (its intervals narrow as 1/sqrt(layers x heads)), so more only lengthen the run: a
// larger sample is a second run with another [source] seed. The limit stops a slip such as
// --layers 1000000 from starting a run of days (reference/SEMANTICS.md §9, the studies' inputs).
constexpr int64_t kMaxSyntheticLayers = 128;

// The resolved study values a run cannot use that flags and the config alike can set: a chunk
// of no slots, a window of no slots, a negative K, no queries, no layers, or more synthetic
// layers than kMaxSyntheticLayers.
void require_study_values(const Resolved& r, const config::ConfigValues& c) {
  require_at_least(r.geometry.S, 1, "-S,--chunk", "[geometry] S", c);
  require_at_least(r.geometry.W, 1, "-W,--window", "[geometry] W", c);
  require_at_least(r.geometry.K, 0, "-K,--top-k", "[geometry] K", c);
  require_at_least(r.queries, 1, "--queries", "[study] queries", c);
  require_at_least(r.source.n_layers, 1, "--layers", "[source] layers", c);
  if (r.source_kind == "synthetic" && r.source.n_layers > kMaxSyntheticLayers)
    throw BadInput(fmt::format(
        "{}: expected at most {} layers for the synthetic source (each layer is one more "
        "independent draw of the same model; for a larger sample run again with another "
        "[source] seed), got {}",
        where_set("--layers", "[source] layers", c), kMaxSyntheticLayers, r.source.n_layers));
}

// Every context length must hold a query with a retrieval candidate (T > W + S, the condition
// the study drivers check unit by unit), or BadInput naming where the lengths were set.
void require_retrieval_candidates(const std::vector<int64_t>& lengths, const StudyGeometry& g,
                                  const std::string& where) {
  for (int64_t T : lengths)
    if (analysis::tail_queries(Geometry(T, g.S, g.W, g.landmarks), 1).empty())
      throw BadInput(fmt::format("{}: expected lengths with a retrieval candidate (T > W + S = "
                                 "{} at S={}, W={}), got {}",
                                 where, g.W + g.S, g.S, g.W, T));
}

// The TOML config (every table and key checked), or no values when there is none.
config::ConfigValues read_config(const StudyArgs& a) {
  if (a.config.empty()) return {};
  return {config::load_toml(a.config, config::study_schema()), a.config};
}

// Each name checked now (a preset, mean, ..., <key>+<bias>), the error naming where it was set.
void require_mechanism_names(const std::vector<std::string>& names, PriorRule rule,
                             const std::string& where) {
  for (const auto& name : names) {
    try {
      analysis::study_mechanism(name, rule);
    } catch (const InvalidArgument& e) {
      throw BadInput(where + ": " + e.what());
    }
  }
}

// Where the lengths were set: --lengths, else the config's [<study>] lengths.
std::string lengths_where(const StudyArgs& a, const config::ConfigValues& c,
                          const std::string& study) {
  return a.lengths.empty() ? c.where(study, "lengths") : "--lengths";
}

// The context lengths: the study's default, then the config's [<study>] lengths, then --lengths.
std::vector<int64_t> resolve_lengths(const StudyArgs& a, const config::ConfigValues& c,
                                     const std::string& study, bool model, int64_t train_length) {
  std::vector<int64_t> lengths;
  if (study == "fidelity") lengths = model ? std::vector<int64_t>{512} : std::vector<int64_t>{4096};
  if (study == "overlap")
    lengths = model ? std::vector<int64_t>{512} : std::vector<int64_t>{4096, 16384, 65536};
  if (study == "extrapolation")
    for (int64_t x = 1; x <= 64 && train_length * x <= (model ? 512 : 1 << 20); x *= 2)
      lengths.push_back(train_length * x);
  lengths = c.integers(study, "lengths", lengths);
  if (!a.lengths.empty()) lengths = a.lengths;
  const std::string where = lengths_where(a, c, study);
  for (size_t i = 0; i < lengths.size(); ++i)
    if (lengths[i] < 1 || (i > 0 && lengths[i] <= lengths[i - 1]))
      throw BadInput(fmt::format("{}: expected positive, strictly ascending lengths, got {}",
                                 where, nlohmann::json(lengths).dump()));
  return lengths;
}

// Defaults per source and study, then the TOML config, then flags.
Resolved resolve(const StudyArgs& a, const std::string& study) {
  const config::ConfigValues c = read_config(a);
  Resolved r;
  // An explicit --source wins over the config's [source] kind, --source synthetic included.
  r.source_kind = a.source.empty() ? c.text("source", "kind", "synthetic") : a.source;
  require(r.source_kind == "synthetic" || r.source_kind == "model" ||
              r.source_kind == "activations",
          c.where("source", "kind"), "synthetic, model or activations", r.source_kind);
  const bool model = r.source_kind != "synthetic";
  // Synthetic: the paper's geometry. The real model (512 tokens, head dim 8): S=16, W=64, K=8,
  // so that the last query has 28 candidates of which K covers ~30% (the paper: 32 of 57-121).
  // The spec fields a study uses go through the spec decoder: [geometry], then the spec flags.
  MechanismSpec spec;
  spec.S = model ? 16 : 64, spec.W = model ? 64 : 512, spec.K = model ? 8 : 32;
  spec.landmarks = !model;
  config::apply_spec_overrides(spec, c.table("geometry"), c.file() + ": [geometry]");
  config::apply_spec_overrides(spec, a.spec, "flags");  // ranges: require_study_values
  r.geometry.S = spec.S, r.geometry.W = spec.W, r.geometry.K = spec.K;
  r.geometry.landmarks = spec.landmarks;
  // Without landmark slots there is no landmark query: the prior is the chunk's mean query.
  r.prior.rule = a.spec.contains("prior_rule")
                     ? spec.prior_rule
                     : parse_prior_rule(c.text("study", "prior_rule",
                                               spec.landmarks ? "landmark_query" : "given"),
                                        c.where("study", "prior_rule"));
  const std::string source_default =
      r.prior.rule == PriorRule::landmark_query ? "inputs" : "chunk_mean_query";
  r.prior.source = a.prior_source.empty()
                       ? analysis::parse_prior_source(
                             c.text("study", "prior_source", source_default),
                             c.where("study", "prior_source"))
                       : analysis::parse_prior_source(a.prior_source, "--prior-source");
  r.mechanisms = c.texts("study", "mechanisms",
                         analysis::default_mechanism_names(r.geometry.landmarks));
  require_mechanism_names(r.mechanisms, r.prior.rule, c.where("study", "mechanisms"));
  if (!a.mechanisms.empty()) r.mechanisms = a.mechanisms;
  require_mechanism_names(a.mechanisms, r.prior.rule, "--mechanisms");
  r.queries = a.queries ? *a.queries : c.integer("study", "queries", 32);
  r.keep_scores = c.boolean("study", "keep_scores", true);
  r.tail_queries = c.integer("overlap", "tail_queries", 256, 1);
  r.block_sizes = c.integers("overlap", "block_sizes", r.block_sizes, 1);
  r.final_block = c.integer("overlap", "final_block", r.final_block, 1);
  r.overlap_mechanism = c.text("overlap", "mechanism", r.overlap_mechanism);
  require_mechanism_names({r.overlap_mechanism}, r.prior.rule, c.where("overlap", "mechanism"));
  r.encodings = c.texts("extrapolation", "encodings", r.encodings);
  for (const auto& name : r.encodings)
    parse_positional_kind(name, c.where("extrapolation", "encodings"));
  r.train_length = c.integer("extrapolation", "train_length", model ? 128 : 1024, 1);
  r.theta = c.number("extrapolation", "theta", r.theta);
  require(std::isfinite(r.theta) && r.theta > 1.0, c.where("extrapolation", "theta"),
          "a finite RoPE base greater than 1", std::to_string(r.theta));
  r.pairing = c.text("extrapolation", "pairing", model ? "interleaved" : "half");
  parse_rope_pairing(r.pairing, c.where("extrapolation", "pairing"));
  r.depths = c.numbers("extrapolation", "depths", r.depths);
  for (double depth : r.depths)
    require(depth >= 0.0 && depth <= 1.0, c.where("extrapolation", "depths"),
            "needle depths in [0, 1]", std::to_string(depth));
  r.needle_logit = c.number("extrapolation", "needle_logit", r.needle_logit);
  require(std::isfinite(r.needle_logit), c.where("extrapolation", "needle_logit"),
          "a finite logit", std::to_string(r.needle_logit));

  const std::vector<int64_t> lengths = resolve_lengths(a, c, study, model, r.train_length);
  r.source.lengths = lengths;
  r.source.n_layers = a.layers ? *a.layers : c.integer("source", "layers", model ? 5 : 2);
  require_study_values(r, c);
  build_sources(r, a, c);  // first: its config errors come before this cross-value check
  require_retrieval_candidates(lengths, r.geometry, lengths_where(a, c, study));
  r.raw_source.lengths = r.source.lengths = lengths;
  r.raw_source.n_layers = r.source.n_layers;

  r.config["study"] = study;
  r.config["geometry"] = {{"S", r.geometry.S}, {"W", r.geometry.W}, {"K", r.geometry.K},
                          {"landmarks", r.geometry.landmarks}};
  r.config["prior"] = {{"rule", to_string(r.prior.rule)},
                       {"source", analysis::to_string(r.prior.source)}};
  r.config["lengths"] = lengths;
  r.config["layers"] = r.source.n_layers;
  if (study != "overlap") r.config["mechanisms"] = r.mechanisms, r.config["queries"] = r.queries;
  if (study == "overlap")
    r.config["overlap"] = {{"mechanism", r.overlap_mechanism}, {"tail_queries", r.tail_queries},
                           {"block_sizes", r.block_sizes}, {"final_block", r.final_block}};
  if (study == "extrapolation")
    r.config["extrapolation"] = {{"encodings", r.encodings}, {"train_length", r.train_length},
                                 {"theta", r.theta}, {"pairing", r.pairing},
                                 {"depths", r.depths}, {"needle_logit", r.needle_logit}};
  return r;
}

std::vector<analysis::StudyMechanism> mechanisms_of(const Resolved& r) {
  std::vector<analysis::StudyMechanism> out;
  for (const auto& n : r.mechanisms) {
    if (n == "landmark_key" && !r.geometry.landmarks) continue;  // needs landmark slots
    out.push_back(analysis::study_mechanism(n, r.prior.rule));
    analysis::with_geometry(out.back().spec, r.geometry).validate();
  }
  return out;
}

// The results file where this process holds the results; on MPI worker ranks a sink that is
// never written (their units' results travel to rank 0, experiments/parallel/).
class StudyResults {
 public:
  StudyResults(const std::filesystem::path& path, const io::Provenance& provenance) {
    if (!parallel::holds_results()) return;
    file_ = std::make_unique<ResultsFileSink>(path, provenance);
    file_->sink().set_attribute("", "mpi_ranks", static_cast<double>(parallel::ranks()));
  }
  analysis::ResultSink& sink() {
    return file_ ? file_->sink() : unused_;
  }
  void commit() {
    if (file_) file_->commit();
  }

 private:
  std::unique_ptr<ResultsFileSink> file_;
  analysis::RecordingSink unused_;
};

io::Provenance provenance(const Resolved& r, const std::string& command) {
  return {r.config, 0x5eed, command_line().empty() ? command : command_line()};
}

std::string out_path(const StudyArgs& a, const std::string& study) {
  if (!a.out.empty()) {
    if (!a.activations.empty()) require_distinct_files(a.activations, "--activations", a.out, "--out");
    return a.out;
  }
  throw BadInput("--out: a results file path is needed for hils " + study);
}

analysis::Progress progress_bar(std::unique_ptr<ProgressBar>& bar, const std::string& label) {
  return [&bar, label](int64_t done, int64_t total) {
    if (!bar) bar = std::make_unique<ProgressBar>(label, total, "units", global_options().quiet);
    bar->advance();
    (void)done;
  };
}

void say(const std::string& text) {
  if (!global_options().quiet) std::cerr << text << "\n";
}

}  // namespace

void register_study(CLI::App& app, const std::string& name, const std::string& description,
                    StudyRunner run) {
  auto args = std::make_shared<StudyArgs>();
  auto* cmd = app.add_subcommand(name, description);
  add_study_options(cmd, *args);
  cmd->callback([args, run] {
    const auto path = run(*args);
    if (!parallel::holds_results()) return;
    std::cout << "results: " << path.string() << "\n";
    if (!args->plot) return;
    const auto folder = path.parent_path() / (path.stem().string() + "_plots");
    for (const auto& png : draw_plots(path, folder)) std::cout << "plot: " << png.string() << "\n";
  });
}

void add_study_options(CLI::App* cmd, StudyArgs& a) {
  add_config_option(cmd, &a.config, "study config (TOML, see experiments/configs/)");
  add_output_option(cmd, &a.out, "results file (.h5); an existing one is resumed");
  cmd->add_option("--source", a.source,
                  "synthetic | model | activations (default: the config's [source] kind, else "
                  "synthetic)")
      ->check(CLI::IsMember({"synthetic", "model", "activations"}));
  cmd->add_option("--activations", a.activations, "activation file (source=activations)");
  cmd->add_option("--model-dir", a.model_dir,
                  "folder of stories260K.bin, tok512.bin, tinystories_sample.txt (source=model; "
                  "default $HILS_SHARED_DATA or ../shared/data)");
  cmd->add_option("--lengths", a.lengths, "context lengths in slots, ascending");
  // Optional values, not sentinels: any integer given (-1 too) is checked by
  // require_study_values, naming the flag.
  cmd->add_option_function<int64_t>(
      "--layers", [&a](int64_t n) { a.layers = n; },
      "number of layers to study (synthetic: at most 128 independent draws)");
  add_spec_flags(cmd, &a.spec, {"S", "W", "K", "landmarks", "prior_rule"});
  cmd->add_option_function<int64_t>(
      "--queries", [&a](int64_t n) { a.queries = n; }, "sampled queries per unit");
  cmd->add_option("--mechanisms", a.mechanisms,
                  "scores to study: presets, mean, landmark_key, taylor, taylor_entropy, "
                  "max_logit, <key>+<bias>");
  cmd->add_option("--prior-source", a.prior_source,
                  "inputs | chunk_mean_query | chunk_last_query");
  cmd->add_flag("--plot", a.plot, "draw the plots next to the results file");
}

std::filesystem::path run_fidelity(const StudyArgs& a) {
  const auto r = resolve(a, "fidelity");
  analysis::FidelityOptions o;
  o.geometry = r.geometry, o.prior = r.prior, o.mechanisms = mechanisms_of(r);
  o.queries_per_unit = r.queries, o.keep_scores = r.keep_scores;
  o.runner = &parallel::current_runner();
  const std::filesystem::path path = out_path(a, "fidelity");
  StudyResults results(path, provenance(r, "hils fidelity"));
  auto& sink = results.sink();
  std::unique_ptr<ProgressBar> bar;
  const auto start = std::chrono::steady_clock::now();
  const auto report = analysis::run_fidelity_study(r.source, o, sink, progress_bar(bar, "fidelity"));
  results.commit();
  bar.reset();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  say(fmt::format("fidelity: {} units run, {} resumed, {:.1f} s -> {}", report.units_run,
                  report.units_skipped, s, path.string()));
  say(fmt::format("fidelity: Taylor gap = KL check over {} pairs: max |gap - KL| = {:.3g}, "
                  "min gap = {:.3g}", report.worst_kl.pairs, report.worst_kl.max_abs_deviation,
                  report.worst_kl.min_gap));
  if (!report.kl_ok)
    throw CheckFailed(fmt::format("Taylor gap differs from KL by {:.3g} (> {:.1g})",
                                  report.worst_kl.max_abs_deviation, o.kl_tolerance));
  return path;
}

std::filesystem::path run_overlap(const StudyArgs& a) {
  const auto r = resolve(a, "overlap");
  analysis::OverlapOptions o;
  o.geometry = r.geometry, o.prior = r.prior;
  o.mechanism = analysis::study_mechanism(r.overlap_mechanism, r.prior.rule);
  o.block_sizes = r.block_sizes, o.final_block = r.final_block, o.tail_queries = r.tail_queries;
  o.runner = &parallel::current_runner();
  const std::filesystem::path path = out_path(a, "overlap");
  StudyResults results(path, provenance(r, "hils overlap"));
  auto& sink = results.sink();
  std::unique_ptr<ProgressBar> bar;
  const auto start = std::chrono::steady_clock::now();
  const auto report = analysis::run_overlap_study(r.source, o, sink, progress_bar(bar, "overlap"));
  results.commit();
  bar.reset();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  say(fmt::format("overlap: {} units run, {} resumed, {:.1f} s -> {}", report.units_run,
                  report.units_skipped, s, path.string()));
  return path;
}

std::filesystem::path run_extrapolation(const StudyArgs& a) {
  const auto r = resolve(a, "extrapolation");
  analysis::ExtrapolationOptions o;
  o.fidelity.geometry = r.geometry, o.fidelity.prior = r.prior;
  o.fidelity.mechanisms = mechanisms_of(r), o.fidelity.queries_per_unit = r.queries;
  o.fidelity.keep_scores = false;
  o.fidelity.runner = &parallel::current_runner();
  for (const auto& name : r.encodings) {
    PositionalEncoding pe;
    pe.kind = parse_positional_kind(name, "encodings");
    pe.pairing = parse_rope_pairing(r.pairing, "pairing");
    pe.theta = r.theta;
    pe.hope_train_length = static_cast<double>(r.train_length);
    o.encodings.push_back({name, pe});
  }
  o.depths = r.depths, o.needle_logit = r.needle_logit;
  const std::filesystem::path path = out_path(a, "extrapolate");
  StudyResults results(path, provenance(r, "hils extrapolate"));
  auto& sink = results.sink();
  std::unique_ptr<ProgressBar> bar;
  const auto start = std::chrono::steady_clock::now();
  const auto report =
      analysis::run_extrapolation_study(r.raw_source, o, sink, progress_bar(bar, "extrapolate"));
  results.commit();
  bar.reset();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  say(fmt::format("extrapolate: {} units run, {} resumed, {:.1f} s -> {}", report.units_run,
                  report.units_skipped, s, path.string()));
  if (!report.kl_ok)
    throw CheckFailed(fmt::format("Taylor gap differs from KL by {:.3g}",
                                  report.worst_kl.max_abs_deviation));
  return path;
}

std::vector<std::filesystem::path> draw_plots(const std::filesystem::path& results,
                                              const std::filesystem::path& folder) {
  if (!std::filesystem::exists(results))
    throw BadInput(results.string() + ": no such results file");
  const std::filesystem::path script = plots_dir() / "plot_study.py";
  if (!std::filesystem::exists(script))
    throw BadInput(script.string() + ": plotting script not found (set HILS_PLOTS_DIR)");
  make_output_folder(folder, "plots");
  const auto list = folder / ".plots.txt";
  const std::string command = fmt::format("/usr/bin/python3 '{}' '{}' --out '{}' --list '{}'",
                                          script.string(), results.string(), folder.string(),
                                          list.string());
  const int rc = std::system(command.c_str());
  if (rc != 0) {
    if (WIFEXITED(rc) && WEXITSTATUS(rc) == 2)
      throw BadInput(results.string() + ": not a study results file (see the message above)");
    throw std::runtime_error("plotting failed: " + command);
  }
  std::vector<std::filesystem::path> pngs;
  std::ifstream in(list);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) pngs.emplace_back(line);
  std::filesystem::remove(list);
  return pngs;
}

}  // namespace hils::cli::studies

namespace hils::cli {

// hils studies: all three studies on the built-in default, then the plots.
void register_studies(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "studies",
      "Run the fidelity, overlap and extrapolation studies on the built-in default (synthetic "
      "activations, and the real stories260K model when ../shared/data or --model-dir has it) "
      "and draw their plots.\nExample: hils studies --out results/");
  auto out = std::make_shared<std::string>("results");
  auto model_dir = std::make_shared<std::string>();
  auto skip_model = std::make_shared<bool>(false);
  add_output_option(cmd, out.get(), "folder for the results files and plots (created)");
  cmd->add_option("--model-dir", *model_dir, "folder of the real model's files");
  cmd->add_flag("--no-model", *skip_model, "skip the real-model runs");
  cmd->callback([out, model_dir, skip_model] {
    const std::filesystem::path folder = *out;
    make_output_folder(folder, "--out");
    const auto start = std::chrono::steady_clock::now();
    std::vector<std::filesystem::path> files;
    studies::StudyArgs a;
    a.out = (folder / "fidelity_synthetic.h5").string();
    files.push_back(studies::run_fidelity(a));
    a.out = (folder / "overlap_synthetic.h5").string();
    files.push_back(studies::run_overlap(a));
    a.out = (folder / "extrapolation_synthetic.h5").string();
    // A lighter sweep than `hils extrapolate`'s default (7 lengths) to keep this run short.
    a.layers = 1;
    a.queries = 8;
    a.lengths = {1024, 4096, 16384, 65536};
    files.push_back(studies::run_extrapolation(a));
    const std::filesystem::path data =
        model_dir->empty() ? shared_data_dir() : std::filesystem::path(*model_dir);
    if (!*skip_model && std::filesystem::exists(data / "stories260K.bin")) {
      studies::StudyArgs m;
      m.source = "model";
      m.model_dir = data.string();
      m.out = (folder / "fidelity_stories260K.h5").string();
      files.push_back(studies::run_fidelity(m));
      m.out = (folder / "overlap_stories260K.h5").string();
      files.push_back(studies::run_overlap(m));
    } else if (!*skip_model) {
      std::cerr << "studies: no real model at " << data.string()
                << " (stories260K.bin); skipping the real-model runs\n";
    }
    if (!parallel::holds_results()) return;
    std::vector<std::filesystem::path> pngs;
    for (const auto& f : files)
      for (const auto& p : studies::draw_plots(f, folder / "plots")) pngs.push_back(p);
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::cout << fmt::format("studies: {} results files and {} plots in {:.0f} s\n",
                             files.size(), pngs.size(), s);
    for (const auto& f : files) std::cout << "  results: " << f.string() << "\n";
    std::cout << "  plots:   " << (folder / "plots").string() << "/\n";
  });
}

}  // namespace hils::cli
