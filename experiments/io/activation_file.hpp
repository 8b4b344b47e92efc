// Activation files (HDF5, format documented in data/activation_format.md): one layer's q, k, v
// (and optional retrieval queries, un-rotated q/k, hidden states) per group /layer<i>, plus the
// slot layout (position ids, landmarks) and provenance shared by all layers.
//
// Readers validate everything and throw io::FileError naming the file, the dataset or
// attribute, what was found and what was expected. Writers write to a temporary name in the
// target folder and rename it, so an interrupted write never leaves a half file.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "hils/attention.hpp"

namespace hils::io {

inline constexpr const char* kActivationFormat = "hils-activations";
inline constexpr int64_t kActivationFormatVersion = 1;

// What is stored on disk for floating point data; readers accept both and compute in double.
enum class StorageType { float32, float64 };

// Attributes and slot layout shared by every layer of a file.
struct ActivationMeta {
  int64_t n_layers = 0;
  int64_t Hq = 0, Hkv = 0, T = 0, d = 0, dv = 0;
  int64_t d_model = 0;             // width of the hidden states; 0 when none are stored
  bool rotated = false;            // q, k, q_retrieval already carry RoPE at position_ids
  std::string rope_pairing = "none";  // "interleaved", "half" or "none" (no RoPE in the model)
  double rope_theta = 0.0;         // 0 when rope_pairing is "none"
  std::vector<int64_t> position_ids;  // [T]
  std::vector<uint8_t> landmarks;     // [T], 1 where the slot is a landmark slot
  std::vector<int32_t> tokens;        // [T] token ids (-1 at landmark slots); empty if none
  nlohmann::json source = nlohmann::json::object();  // provenance: model, text, generator, seed...

  bool has_landmarks() const;
  // Whether the stored landmark layout is the HiLS layout of chunk size S (slot (c+1)S-1 of every
  // complete chunk is a landmark, no other slot is).
  bool landmarks_match(int64_t S) const;
};

// One layer. inputs.prior is never stored (it is a mechanism's choice, not an activation).
struct LayerActivations {
  AttentionInputs<double> inputs;           // q [Hq][T x d], k, v [Hkv][...], q_retrieval opt.
  std::vector<Matrix<double>> q_unrotated;  // [Hq][T x d] before RoPE; empty if not stored
  std::vector<Matrix<double>> k_unrotated;  // [Hkv][T x d] before RoPE; empty if not stored
  Matrix<double> hidden;                    // [T x d_model] input of the layer; 0x0 if none
};

struct ActivationFile {
  ActivationMeta meta;
  std::vector<LayerActivations> layers;
};

// Writes atomically (temporary name + rename). Throws FileError if the folder is not writable
// and InvalidArgument when the data disagree with meta (shapes, NaN/Inf).
void write_activation_file(const std::filesystem::path& path, const ActivationFile& file,
                           StorageType storage = StorageType::float32);

// Reads and validates the root attributes and slot layout (cheap: no layer data).
ActivationMeta read_activation_meta(const std::filesystem::path& path);
// Reads and validates one layer (shapes against meta, float dtype, no NaN/Inf).
LayerActivations read_activation_layer(const std::filesystem::path& path,
                                       const ActivationMeta& meta, int64_t layer);
ActivationFile read_activation_file(const std::filesystem::path& path);

// A digest of what a unit reads of layer `layer` of the file at `path`: the shape and values of
// its q, k, v, q_retrieval, q_unrotated and k_unrotated datasets as read (doubles, so a float32
// and a float64 file of equal values agree) and the slot layout and RoPE attributes every layer
// shares; 16 hex digits. It judges no value (a NaN is digested like any other: a bad layer is
// the units' refusal, as it was), so a study can take it of every layer before its first unit.
// Not cryptographic: it tells a re-dumped or edited file from the one a results file's units
// were computed from (resuming checks it). FileError for a dataset that is not floating point.
std::string layer_fingerprint(const std::filesystem::path& path, const ActivationMeta& meta,
                              int64_t layer);

}  // namespace hils::io
