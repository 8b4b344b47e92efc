// The one model tracer: a text -> llama2.c tokens -> the model's forward pass -> every layer's
// q, k (before and after RoPE), v and hidden state, with the provenance of what went in. Used by
// `hils dump llama2c` (which writes it to an activation file) and by the studies' model source.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/activation_file.hpp"
#include "sources/llama2c.hpp"

namespace hils::sources {

// The three files of a llama2.c source.
struct ModelFiles {
  std::filesystem::path model, tokenizer, text;
  // stories260K.bin, tok512.bin and tinystories_sample.txt in `folder` (empty: the shared data
  // folder, $HILS_SHARED_DATA or ../shared/data).
  static ModelFiles in_folder(const std::filesystem::path& folder);
};

struct TextTrace {
  Llama2cConfig config;
  std::vector<int32_t> tokens;     // BOS first, at most the requested count
  std::vector<LayerTrace> layers;  // one per layer
  double mean_nll = 0;             // mean next-token NLL over the tokens, nats/token
  bool truncated = false;          // the text holds more tokens than were kept
  // kind, file names and FNV-1a hashes of model, tokenizer and text, token range, truncation,
  // tool version and commit, NLL: the `source` of the activation file.
  nlohmann::json provenance;
};

// The first `tokens` tokens of the text (BOS included; fewer when the text is shorter) through
// the model. `field` names the setting that asked for `tokens` in errors ("--tokens").
// Throws InvalidArgument (io::FileError for the files) naming the file or the field.
TextTrace trace_text(const ModelFiles& files, int64_t tokens, const std::string& field);

// Every layer of the trace as an activation file (see activations_from_trace).
io::ActivationFile to_activation_file(const TextTrace& trace);

}  // namespace hils::sources
