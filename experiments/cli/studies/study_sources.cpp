// A study's inputs: the source kind resolved by study_config.cpp, handed to the one sources
// module (experiments/sources/study_inputs.hpp).
#include <fmt/format.h>

#include "cli/cli_util.hpp"
#include "cli/commands.hpp"
#include "cli/studies/study_config.hpp"
#include "sources/study_inputs.hpp"

namespace hils::cli::studies {

namespace {

// The synthetic source's parameters: the studies' default (the drift generator, seed 0x5eed),
// then the [source] table's keys, which are those of `hils dump synthetic` (config/config.hpp)
// less the ones a study sets itself (study_schema() refuses those by name).
sources::SyntheticParams synthetic_params(const config::ConfigValues& c,
                                          const analysis::StudyGeometry& geometry) {
  sources::SyntheticParams params;
  params.generator = "drift";
  params.seed = 0x5eed;
  nlohmann::json keys = c.table("source");
  keys.erase("kind"), keys.erase("layers");
  config::apply_synthetic_json(params, keys, c.file() + ": [source]");
  params.S = geometry.S;
  params.landmarks = geometry.landmarks;
  return params;
}

// params at the longest of the lengths (the layer a unit holds at once).
sources::SyntheticParams longest(sources::SyntheticParams params,
                                 const std::vector<int64_t>& lengths) {
  params.T = lengths.back();
  return params;
}

// A layer count set by the user (--n-layers, or [source] layers) beyond the source's layers is
// refused: the studies read layers 0..n-1 and studied the source's count without a word (the
// results' config recorded it). A default (the model's 5) is capped as before.
void require_layers_within(int64_t requested, int64_t available, const std::string& source,
                           const StudyArgs& a, const config::ConfigValues& c) {
  if (requested <= available || !(a.layers || c.has("source", "layers"))) return;
  const std::string where = a.layers ? (a.layers_old_name ? "--layers" : "--n-layers")
                                     : c.where("source", "layers");
  require(false, where, fmt::format("at most {} (the layers of {})", available, source),
          std::to_string(requested));
}

}  // namespace

// r (source kind, layers, lengths, geometry), args, c, lengths_where -> r.source, r.raw_source,
// r.config["source"].
void build_sources(Resolved& r, const StudyArgs& a, const config::ConfigValues& c,
                   const std::string& lengths_where) {
  sources::StudyInputs inputs;
  if (r.source_kind == "synthetic") {
    const sources::SyntheticParams params = synthetic_params(c, r.geometry);
    require_fits_in_memory(longest(params, r.source.lengths).working_bytes(), lengths_where);
    // Fidelity and overlap see the synthetic vectors under RoPE, as a model would.
    const PositionalEncoding pe{PositionalKind::rope, RopePairing::half, r.theta};
    inputs = sources::synthetic_study_inputs(params, pe, r.source.n_layers, r.source.lengths);
  } else if (r.source_kind == "model") {
    inputs = sources::model_study_inputs(sources::ModelFiles::in_folder(a.model_dir),
                                         r.source.n_layers, r.source.lengths, lengths_where);
  } else {  // activations (resolve() accepts no other kind)
    if (a.activations.empty()) throw BadInput("--activations: a file is needed for source=activations");
    r.activations = a.activations;
    inputs = sources::activation_study_inputs(a.activations, r.source.n_layers, r.source.lengths,
                                              lengths_where, r.geometry.S, r.geometry.landmarks);
    // The study's chunks must be the file's (run does the same check per mechanism).
    require_landmark_layout(r.geometry.landmarks, r.geometry.S,
                            io::read_activation_meta(a.activations), a.activations,
                            fmt::format("the study's geometry (-S {}, --landmarks {})",
                                        r.geometry.S, r.geometry.landmarks));
  }
  require_layers_within(r.source.n_layers, inputs.positioned.n_layers,
                        r.source_kind == "model" ? "the model in " + a.model_dir
                                                 : "the activation file " + a.activations,
                        a, c);
  r.Hq = inputs.Hq, r.Hkv = inputs.Hkv, r.dv = inputs.dv;
  r.source = std::move(inputs.positioned);
  r.raw_source = std::move(inputs.raw);
  r.config["source"] = std::move(inputs.description);
}

}  // namespace hils::cli::studies
