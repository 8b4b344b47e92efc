// Where a study's activations come from: the synthetic generators, the llama2.c model's trace of
// a text, or an activation file, as the analysis layer's StudySource (one layer at a time, at
// every length under study).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "hils/analysis/study.hpp"
#include "sources/model_trace.hpp"
#include "sources/synthetic.hpp"

namespace hils::sources {

// `positioned` feeds fidelity and overlap (it carries the source's positional encoding);
// `raw` (un-rotated) feeds extrapolation, which applies each encoding itself. `description`
// goes into the results file's config (the source's part of the provenance).
struct StudyInputs {
  analysis::StudySource positioned, raw;
  nlohmann::json description;
  // Every layer's query and KV heads and value width, known before any layer is loaded (for
  // the size checks made up front).
  int64_t Hq = 0, Hkv = 0, dv = 0;
};

// Synthetic: layer l at length T is draw_layer(params with T, l) with the study's S and
// landmarks already in `params` (its T is ignored); `positioned` applies `pe` to it. The drawn
// prior is dropped: the studies derive the prior by their own prior rule.
StudyInputs synthetic_study_inputs(const SyntheticParams& params, const PositionalEncoding& pe,
                                   int64_t n_layers, const std::vector<int64_t>& lengths);

// The model: one trace of the first max(lengths) tokens of the text (BOS first), cut to each
// length; at most the model's layers. InvalidArgument when a file is missing (naming the folder
// flag) or when the longest length exceeds the model's context or the text (naming
// `lengths_where`, the flag or config key that set the lengths).
StudyInputs model_study_inputs(const ModelFiles& files, int64_t n_layers,
                               const std::vector<int64_t>& lengths,
                               const std::string& lengths_where);

// An activation file, read one layer at a time; at most the file's layers. InvalidArgument up
// front when the longest length exceeds the file's T (naming `lengths_where`). `positioned` is
// what the model attended: q and k as stored when the file says they carry the model's RoPE
// (`rotated` 1) or the model has none (`rope_pairing` none); else (`rotated` 0 with a RoPE) q and
// k rotated by the file's pairing and theta at the study's position ids (chunk size S, landmarks),
// as `hils run --positional auto` does, which must be the file's position_ids (InvalidArgument up
// front naming position_ids otherwise). `raw` is q and k of a file with `rotated` 0, else its
// q_unrotated/k_unrotated (InvalidArgument when it has none, at the first load). Both carry the
// file's q_retrieval (q~, rotated with q), but for `raw` of a file with `rotated` 1, where it is
// stored rotated with no un-rotated copy: InvalidArgument at the first load.
StudyInputs activation_study_inputs(const std::filesystem::path& file, int64_t n_layers,
                                    const std::vector<int64_t>& lengths,
                                    const std::string& lengths_where, int64_t S, bool landmarks);

}  // namespace hils::sources
