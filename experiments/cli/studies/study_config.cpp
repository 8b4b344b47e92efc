// A study's settings: the study's defaults per source, then the TOML config (every table and key
// checked by config::study_schema), then the flags; checked, then joined to their inputs.
#include <algorithm>

#include <fmt/format.h>

#include "cli/cli_util.hpp"
#include "cli/commands.hpp"
#include "cli/studies/study_config.hpp"
#include "io/activation_file.hpp"

namespace hils::cli::studies {

namespace {

// The TOML config (every table and key checked), or no values when there is none.
config::ConfigValues read_config(const StudyArgs& a) {
  if (a.config.empty()) return {};
  return {config::load_toml(a.config, config::study_schema()), a.config};
}

// The geometry and the prior. The spec fields a study uses go through the spec decoder:
// [geometry], then the spec flags (their ranges: require_study_values).
void resolve_geometry(Resolved& r, const StudyArgs& a, const config::ConfigValues& c, bool model,
                      const SourceDefaults& defaults) {
  // Synthetic: the paper's geometry. The real model (512 tokens, head dim 8): S=16, W=64, K=8,
  // so that the last query has 28 candidates of which K covers ~30% (the paper: 32 of 57-121).
  // An activation file: the model's, but for a file with landmark slots, its chunk size with
  // landmarks on (the file's layout is the only one a study of it accepts).
  MechanismSpec spec;
  spec.S = model ? 16 : 64, spec.W = model ? 64 : 512, spec.K = model ? 8 : 32;
  spec.landmarks = !model;
  if (defaults.landmark_chunk > 0) spec.S = defaults.landmark_chunk, spec.landmarks = true;
  config::apply_spec_overrides(spec, c.table("geometry"), c.file() + ": [geometry]");
  config::apply_spec_overrides(spec, a.spec, "flags");
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
}

// Where the lengths were set: --lengths, else the config's [<study>] lengths.
std::string lengths_where(const StudyArgs& a, const config::ConfigValues& c,
                          const std::string& study) {
  return a.lengths.empty() ? c.where(study, "lengths") : "--lengths";
}

// The defaults of a source kind (SourceDefaults); an activation file's are read from it.
SourceDefaults source_defaults(const std::string& kind, const StudyArgs& a) {
  SourceDefaults d;
  if (kind == "synthetic") return d;
  d.whole_context = true, d.train_length = 128, d.pairing = "interleaved";
  if (kind == "model") {
    d.context = 512, d.layers = 5;
    return d;
  }
  if (a.activations.empty()) throw BadInput("--activations: a file is needed for source=activations");
  const io::ActivationMeta meta = io::read_activation_meta(a.activations);
  d.context = meta.T, d.layers = meta.n_layers;
  if (meta.rope_pairing != "none") d.pairing = meta.rope_pairing, d.theta = meta.rope_theta;
  // The first landmark slot is S - 1 in the HiLS layout of chunk size S.
  const auto first = std::find_if(meta.landmarks.begin(), meta.landmarks.end(),
                                  [](uint8_t flag) { return flag != 0; });
  const int64_t S = static_cast<int64_t>(first - meta.landmarks.begin()) + 1;
  if (first != meta.landmarks.end() && meta.landmarks_match(S)) d.landmark_chunk = S;
  return d;
}

// The default context lengths of every row of kStudies (std::logic_error, exit 3, for a study
// without them: a row added to kStudies needs its lengths here).
std::vector<int64_t> default_lengths(const std::string& study, const SourceDefaults& defaults,
                                     int64_t train_length) {
  const std::vector<int64_t> whole{defaults.context};
  if (study == "fidelity") return defaults.whole_context ? whole : std::vector<int64_t>{4096};
  if (study == "overlap")
    return defaults.whole_context ? whole : std::vector<int64_t>{4096, 16384, 65536};
  if (study != "extrapolation")
    throw std::logic_error("study " + study + ": no default lengths in study_config.cpp");
  std::vector<int64_t> lengths;
  for (int64_t x = 1; x <= 64 && train_length * x <= defaults.context; x *= 2)
    lengths.push_back(train_length * x);
  return lengths;
}

// The context lengths: the study's default, then the config's [<study>] lengths, then --lengths.
std::vector<int64_t> resolve_lengths(const StudyArgs& a, const config::ConfigValues& c,
                                     const std::string& study, const SourceDefaults& defaults,
                                     int64_t train_length) {
  std::vector<int64_t> lengths = default_lengths(study, defaults, train_length);
  lengths = c.integers(study, "lengths", lengths);
  if (!a.lengths.empty()) lengths = a.lengths;
  if (lengths.empty() && study == "extrapolation" && !c.has(study, "lengths"))
    throw BadInput(fmt::format("{}: expected a train length whose default lengths (train_length "
                               "x 1, 2, 4, ..., 64) start within {} slots, got {} (or set "
                               "--lengths)",
                               c.where(study, "train_length"), defaults.context,
                               train_length));
  require_ascending_lengths(lengths, lengths_where(a, c, study));
  return lengths;
}

// The source: --source (--source synthetic included), else the config's [source] kind, else the
// kind a file flag names (--activations, --model-dir), else synthetic. A file flag of another
// source is refused: it was ignored without a word (the synthetic source ran instead).
std::string source_kind(const StudyArgs& a, const config::ConfigValues& c) {
  std::string kind = a.source, set_by = "--source " + a.source;
  if (kind.empty() && c.has("source", "kind"))
    kind = c.text("source", "kind", ""), set_by = "[source] kind = " + kind + " in " + c.file();
  const auto require_read_by = [&](const std::string& value, const std::string& flag,
                                   const std::string& wanted) {
    if (value.empty() || kind.empty() || kind == wanted) return;
    throw BadInput(fmt::format("{}: expected --source {} (or no --source), got {}, which does "
                               "not read it", flag, wanted, set_by));
  };
  require_read_by(a.activations, "--activations", "activations");
  if (kind.empty() && !a.activations.empty()) kind = set_by = "activations";
  require_read_by(a.model_dir, "--model-dir", "model");
  return kind.empty() ? (a.model_dir.empty() ? "synthetic" : "model") : kind;
}

// A study whose units sample no queries (overlap studies one mechanism over the last
// tail_queries queries): the flags that choose the other studies' mechanisms and sampled queries
// are refused, not ignored, each with the row's reason.
void require_sampling_flags(const StudyArgs& a, const StudyRow& row) {
  if (row.samples_queries()) return;
  std::vector<std::string_view> sampling;
  for (const auto& other : kStudies)
    if (other.samples_queries()) sampling.push_back(other.command);
  const auto refused = [&](const char* flag, std::string_view why) {
    return BadInput(fmt::format("{}: hils {} {}; {} is for hils {}", flag, row.command, why, flag,
                                listed(sampling)));
  };
  if (!a.mechanisms.empty()) throw refused("--mechanisms", row.why_no_mechanisms);
  if (a.queries) throw refused("--queries", row.why_no_queries);
}

// study -> its row of kStudies (std::logic_error for a name that has none).
const StudyRow& row_of(const std::string& study) {
  const StudyRow* row = study_row(study);
  if (!row) throw std::logic_error("study " + study + ": no row in kStudies");
  return *row;
}

// What went into the run, as the results file records it (its provenance and resume check).
void record_config(Resolved& r, const std::string& study, const StudyRow& row) {
  r.config["study"] = study;
  r.config["geometry"] = {{"S", r.geometry.S}, {"W", r.geometry.W}, {"K", r.geometry.K},
                          {"landmarks", r.geometry.landmarks}};
  r.config["prior"] = {{"rule", to_string(r.prior.rule)},
                       {"source", analysis::to_string(r.prior.source)}};
  r.config["lengths"] = r.source.lengths;
  r.config["layers"] = r.source.n_layers;
  if (row.samples_queries()) r.config["mechanisms"] = r.mechanisms, r.config["queries"] = r.queries;
  if (study == "overlap")
    r.config["overlap"] = {{"mechanism", r.overlap_mechanism}, {"tail_queries", r.tail_queries},
                           {"block_sizes", r.block_sizes}, {"final_block", r.final_block}};
  if (study == "extrapolation")
    r.config["extrapolation"] = {{"encodings", r.encodings}, {"train_length", r.train_length},
                                 {"theta", r.theta}, {"pairing", r.pairing},
                                 {"depths", r.depths}, {"needle_logit", r.needle_logit}};
}

}  // namespace

// args, study -> the resolved, checked settings with their inputs.
Resolved resolve(const StudyArgs& a, const std::string& study) {
  const StudyRow& row = row_of(study);
  require_sampling_flags(a, row);
  const config::ConfigValues c = read_config(a);
  Resolved r;
  r.source_kind = source_kind(a, c);
  require(r.source_kind == "synthetic" || r.source_kind == "model" ||
              r.source_kind == "activations",
          c.where("source", "kind"), "synthetic, model or activations", r.source_kind);
  const bool model = r.source_kind != "synthetic";
  const SourceDefaults defaults = source_defaults(r.source_kind, a);
  resolve_geometry(r, a, c, model, defaults);
  resolve_study_tables(r, a, c);
  resolve_extrapolation_table(r, c, defaults);
  const std::vector<int64_t> lengths = resolve_lengths(a, c, study, defaults, r.train_length);
  r.source.lengths = lengths;
  r.source.n_layers = a.layers ? *a.layers : c.integer("source", "layers", defaults.layers);
  if (a.layers_old_name)
    note("--layers: the study commands call it --n-layers now (the number of layers studied, "
         "from layer 0); in hils run, --layers lists layer indices");
  require_study_values(r, c);
  // First: its config errors come before this cross-value check.
  build_sources(r, a, c, lengths_where(a, c, study));
  require_retrieval_candidates(lengths, r.geometry, lengths_where(a, c, study));
  require_outputs_fit(r, c, row);
  r.raw_source.lengths = r.source.lengths = lengths;
  r.raw_source.n_layers = r.source.n_layers;
  record_config(r, study, row);
  return r;
}

// r -> one StudyMechanism per name, with r's geometry, validated.
std::vector<analysis::StudyMechanism> mechanisms_of(const Resolved& r) {
  std::vector<analysis::StudyMechanism> out;
  for (const auto& n : r.mechanisms) {
    out.push_back(analysis::study_mechanism(n, r.prior.rule));
    analysis::with_geometry(out.back().spec, r.geometry).validate();
  }
  return out;
}

}  // namespace hils::cli::studies
