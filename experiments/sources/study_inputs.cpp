#include "sources/study_inputs.hpp"

#include <memory>
#include <optional>

#include <fmt/format.h>

#include "io/activation_file.hpp"

namespace hils::sources {

namespace {

// The first T rows of every head (q_retrieval: none, or one per query head).
AttentionInputs<double> prefix(const std::vector<Matrix<double>>& q,
                               const std::vector<Matrix<double>>& k,
                               const std::vector<Matrix<double>>& v, int64_t T,
                               const std::vector<Matrix<double>>& q_retrieval = {}) {
  AttentionInputs<double> in;
  auto cut = [T](const std::vector<Matrix<double>>& heads, std::vector<Matrix<double>>& out) {
    for (const auto& m : heads) {
      require(m.rows() >= T, "lengths", fmt::format("T <= the source's {} slots", m.rows()),
              std::to_string(T));
      out.push_back(m.topRows(T));
    }
  };
  cut(q, in.q), cut(k, in.k), cut(v, in.v), cut(q_retrieval, in.q_retrieval);
  return in;
}

// What the results' config says of a synthetic source: its parameters, less those the study
// sets itself (the lengths, the layout, the positional encodings).
nlohmann::json synthetic_description(const SyntheticParams& params) {
  nlohmann::json description = params.to_json();
  for (const char* key : {"T", "S", "landmarks", "positional", "rope_pairing", "rope_theta",
                          "hope_train_length", "hope_m"})
    description.erase(key);
  description["kind"] = "synthetic";
  return description;
}

// The RoPE a study applies to a file's q and k: none when they carry it already (rotated = 1)
// or the model has none; else the file's pairing and theta, at the study's position ids (chunk
// size S, landmarks), which must be the file's over the first T slots: InvalidArgument naming
// position_ids otherwise. A file whose landmark layout is not the study's is the caller's
// refusal (study_sources.cpp names the layouts), so its position ids are not compared here.
std::optional<PositionalEncoding> rope_to_apply(const io::ActivationMeta& meta,
                                                const std::filesystem::path& file, int64_t T,
                                                int64_t S, bool landmarks) {
  if (meta.rotated || meta.rope_pairing == "none") return std::nullopt;
  PositionalEncoding pe;
  pe.kind = PositionalKind::rope;
  pe.pairing = parse_rope_pairing(meta.rope_pairing, "rope_pairing");
  pe.theta = meta.rope_theta;
  if (landmarks ? !meta.landmarks_match(S) : meta.has_landmarks()) return pe;
  const std::vector<int64_t> study = Geometry(T, S, S, landmarks).position_ids();
  for (int64_t t = 0; t < T; ++t)
    if (meta.position_ids.at(static_cast<size_t>(t)) != study[static_cast<size_t>(t)])
      throw InvalidArgument(fmt::format(
          "{}: position_ids: expected the study's position ids (S={}, landmarks={}: {} at slot "
          "{}) to rotate the un-rotated q and k (rotated = 0, rope_pairing {}) at, found {}",
          file.string(), S, landmarks, study[static_cast<size_t>(t)], t, meta.rope_pairing,
          meta.position_ids.at(static_cast<size_t>(t))));
  return pe;
}

}  // namespace

StudyInputs synthetic_study_inputs(const SyntheticParams& params, const PositionalEncoding& pe,
                                   int64_t n_layers, const std::vector<int64_t>& lengths) {
  auto raw = [params](int64_t layer, int64_t T) {
    SyntheticParams p = params;
    p.T = T;
    p.positional = PositionalEncoding{};
    AttentionInputs<double> in = draw_layer(p, layer).inputs;
    in.prior.clear();
    return in;
  };
  const int64_t S = params.S;
  const bool landmarks = params.landmarks;
  auto positioned = [raw, pe, S, landmarks](int64_t layer, int64_t T) {
    return apply_positional_encoding<double>(raw(layer, T), Geometry(T, S, S, landmarks), pe);
  };
  return {{"synthetic", n_layers, lengths, positioned},
          {"synthetic", n_layers, lengths, raw},
          synthetic_description(params),
          params.Hq,
          params.Hkv,
          params.value_dim()};
}

StudyInputs model_study_inputs(const ModelFiles& files, int64_t n_layers,
                               const std::vector<int64_t>& lengths,
                               const std::string& lengths_where) {
  for (const auto& path : {files.model, files.tokenizer, files.text})
    if (!std::filesystem::exists(path))
      throw InvalidArgument(fmt::format(
          "model source: {} not found (set --model-dir or HILS_SHARED_DATA to the folder of "
          "stories260K.bin, tok512.bin and tinystories_sample.txt)",
          path.string()));
  const int64_t T = lengths.back();
  auto trace = std::make_shared<const TextTrace>(trace_text(files, T, lengths_where));
  require(static_cast<int64_t>(trace->tokens.size()) >= T, lengths_where,
          fmt::format("lengths within the model source's text ({}: {} tokens)",
                      files.text.string(), trace->tokens.size()),
          std::to_string(T));
  n_layers = std::min<int64_t>(n_layers, static_cast<int64_t>(trace->layers.size()));
  const std::string name = files.model.stem().string();
  auto positioned = [trace](int64_t l, int64_t T) {
    const auto& L = trace->layers.at(static_cast<size_t>(l));
    return prefix(L.q, L.k, L.v, T);
  };
  auto raw = [trace](int64_t l, int64_t T) {
    const auto& L = trace->layers.at(static_cast<size_t>(l));
    return prefix(L.q_unrotated, L.k_unrotated, L.v, T);
  };
  return {{name, n_layers, lengths, positioned},
          {name, n_layers, lengths, raw},
          {{"kind", "model"},
           {"model", files.model.filename().string()},
           {"text", files.text.filename().string() + ", first T tokens, BOS first"}},
          trace->config.n_heads,
          trace->config.n_kv_heads,
          trace->config.head_dim()};
}

StudyInputs activation_study_inputs(const std::filesystem::path& file, int64_t n_layers,
                                    const std::vector<int64_t>& lengths,
                                    const std::string& lengths_where, int64_t S, bool landmarks) {
  const auto meta = std::make_shared<const io::ActivationMeta>(io::read_activation_meta(file));
  require(lengths.back() <= meta->T, lengths_where,
          fmt::format("lengths within the activation file's T = {} slots ({})", meta->T,
                      file.string()),
          std::to_string(lengths.back()));
  n_layers = std::min<int64_t>(n_layers, meta->n_layers);
  const std::string name = file.stem().string();
  nlohmann::json description = {
      {"kind", "activations"}, {"path", file.string()}, {"provenance", meta->source}};
  const std::optional<PositionalEncoding> rope = rope_to_apply(*meta, file, lengths.back(), S,
                                                               landmarks);
  if (rope)
    description["positional"] = fmt::format(
        "q and k stored un-rotated (rotated = 0): fidelity and overlap rotate them by RoPE {} "
        "theta {} at position_ids",
        meta->rope_pairing, meta->rope_theta);
  auto positioned = [file, meta, rope, S, landmarks](int64_t l, int64_t T) {
    const auto layer = io::read_activation_layer(file, *meta, l);
    AttentionInputs<double> in =
        prefix(layer.inputs.q, layer.inputs.k, layer.inputs.v, T, layer.inputs.q_retrieval);
    if (!rope) return in;
    return apply_positional_encoding<double>(in, Geometry(T, S, S, landmarks), *rope);
  };
  auto raw = [file, meta](int64_t l, int64_t T) {
    const auto layer = io::read_activation_layer(file, *meta, l);
    if (!meta->rotated)
      return prefix(layer.inputs.q, layer.inputs.k, layer.inputs.v, T, layer.inputs.q_retrieval);
    require(!layer.q_unrotated.empty(), "activations",
            "a file that stores q_unrotated/k_unrotated (extrapolation needs the un-rotated "
            "vectors)",
            "none in " + file.string());
    require(layer.inputs.q_retrieval.empty(), "activations",
            "an un-rotated q_retrieval (extrapolation applies each encoding to un-rotated "
            "vectors; hils run --positional refuses it alike; without q_retrieval q~ = q)",
            "q_retrieval stored rotated (rotated = 1), with no un-rotated copy, in " +
                file.string());
    return prefix(layer.q_unrotated, layer.k_unrotated, layer.inputs.v, T);
  };
  return {{name, n_layers, lengths, positioned},
          {name, n_layers, lengths, raw},
          std::move(description),
          meta->Hq,
          meta->Hkv,
          meta->dv};
}

}  // namespace hils::sources
