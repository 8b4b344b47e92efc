#include "io/activation_file.hpp"

#include <cmath>
#include <cstring>
#include <limits>

#include <fmt/format.h>

#include "io/file_error.hpp"
#include "io/hdf5_util.hpp"

namespace hils::io {

bool ActivationMeta::has_landmarks() const {
  for (auto flag : landmarks)
    if (flag) return true;
  return false;
}

bool ActivationMeta::landmarks_match(int64_t S) const {
  if (S < 2 || static_cast<int64_t>(landmarks.size()) != T) return false;
  for (int64_t slot = 0; slot < T; ++slot) {
    bool expected = (slot + 1) % S == 0;  // slot (c+1)S-1 of a complete chunk
    if (static_cast<bool>(landmarks[slot]) != expected) return false;
  }
  return true;
}

namespace {

std::string layer_name(int64_t layer) { return fmt::format("layer{}", layer); }

// ---- writing ------------------------------------------------------------------------------

// Throws InvalidArgument when a matrix holds a value that float32 storage would turn into Inf.
void check_float32_range(const Matrix<double>& m, const std::string& what) {
  if (m.size() == 0) return;
  const double largest = m.cwiseAbs().maxCoeff();
  require(largest <= static_cast<double>(std::numeric_limits<float>::max()), what,
          "values within float32's range (|x| <= 3.4e38) for float32 storage (store float64)",
          fmt::format("|x| = {:.3g}", largest));
}

// Throws InvalidArgument when a stack of head matrices disagrees with [heads x rows x cols].
void check_heads(const std::vector<Matrix<double>>& heads, int64_t n, int64_t rows, int64_t cols,
                 const std::string& what, bool as_float32) {
  require(static_cast<int64_t>(heads.size()) == n, what + " heads", std::to_string(n),
          std::to_string(heads.size()));
  for (const auto& m : heads) {
    require(m.rows() == rows && m.cols() == cols, what + " shape",
            fmt::format("[{} x {}]", rows, cols), fmt::format("[{} x {}]", m.rows(), m.cols()));
    require(m.allFinite(), what, "finite values", "NaN or Inf");
    if (as_float32) check_float32_range(m, what);
  }
}

void check_meta(const ActivationMeta& meta) {
  require(meta.n_layers >= 1, "n_layers", ">= 1", std::to_string(meta.n_layers));
  require(meta.Hq >= 1 && meta.Hkv >= 1 && meta.Hq % meta.Hkv == 0, "Hq, Hkv",
          "Hq a positive multiple of Hkv >= 1", fmt::format("Hq={} Hkv={}", meta.Hq, meta.Hkv));
  require(meta.T >= 1 && meta.d >= 1 && meta.dv >= 1, "T, d, dv", ">= 1",
          fmt::format("T={} d={} dv={}", meta.T, meta.d, meta.dv));
  require(static_cast<int64_t>(meta.position_ids.size()) == meta.T, "position_ids",
          "T entries", std::to_string(meta.position_ids.size()));
  require(static_cast<int64_t>(meta.landmarks.size()) == meta.T, "landmarks", "T entries",
          std::to_string(meta.landmarks.size()));
  require(meta.tokens.empty() || static_cast<int64_t>(meta.tokens.size()) == meta.T, "tokens",
          "none or T entries", std::to_string(meta.tokens.size()));
  require(meta.rope_pairing == "none" || meta.rope_pairing == "half" ||
              meta.rope_pairing == "interleaved",
          "rope_pairing", "none, half or interleaved", meta.rope_pairing);
  require(!meta.rotated || meta.rope_pairing != "none", "rotated",
          "false when rope_pairing is none", "true");
}

void check_layer(const ActivationMeta& meta, const LayerActivations& layer, int64_t index,
                 bool as_float32) {
  std::string prefix = layer_name(index) + "/";
  const auto& in = layer.inputs;
  check_heads(in.q, meta.Hq, meta.T, meta.d, prefix + "q", as_float32);
  check_heads(in.k, meta.Hkv, meta.T, meta.d, prefix + "k", as_float32);
  check_heads(in.v, meta.Hkv, meta.T, meta.dv, prefix + "v", as_float32);
  if (!in.q_retrieval.empty())
    check_heads(in.q_retrieval, meta.Hq, meta.T, meta.d, prefix + "q_retrieval", as_float32);
  if (!layer.q_unrotated.empty())
    check_heads(layer.q_unrotated, meta.Hq, meta.T, meta.d, prefix + "q_unrotated", as_float32);
  if (!layer.k_unrotated.empty())
    check_heads(layer.k_unrotated, meta.Hkv, meta.T, meta.d, prefix + "k_unrotated", as_float32);
  if (layer.hidden.size() > 0) {
    require(layer.hidden.rows() == meta.T && layer.hidden.cols() == meta.d_model,
            prefix + "hidden shape", fmt::format("[{} x {}]", meta.T, meta.d_model),
            fmt::format("[{} x {}]", layer.hidden.rows(), layer.hidden.cols()));
    require(layer.hidden.allFinite(), prefix + "hidden", "finite values", "NaN or Inf");
    if (as_float32) check_float32_range(layer.hidden, prefix + "hidden");
  }
}

void write_heads(H5::Group& group, const std::string& name,
                 const std::vector<Matrix<double>>& heads, const std::string& meaning,
                 bool as_float32) {
  const int64_t rows = heads.front().rows(), cols = heads.front().cols();
  std::vector<double> flat(heads.size() * rows * cols);
  for (size_t h = 0; h < heads.size(); ++h)
    std::copy(heads[h].data(), heads[h].data() + rows * cols, flat.begin() + h * rows * cols);
  H5::DataSet dataset =
      write_doubles(group, name, flat.data(),
                    {heads.size(), static_cast<hsize_t>(rows), static_cast<hsize_t>(cols)},
                    as_float32);
  write_attribute(dataset, "meaning", meaning);
  // Closed here, inside the write guard: a failed close (full disk) becomes FileError rather
  // than a "DataSet::~DataSet - H5Dclose failed" line printed by the destructor.
  dataset.close();
}

void write_layer(H5::H5File& file, const LayerActivations& layer, int64_t index,
                 bool as_float32, bool rotated) {
  H5::Group group = file.createGroup(layer_name(index));
  const auto& in = layer.inputs;
  std::string rotation = rotated ? "after RoPE" : "not rotated";
  write_heads(group, "q", in.q, "queries [Hq, T, d], " + rotation, as_float32);
  write_heads(group, "k", in.k, "keys [Hkv, T, d], " + rotation, as_float32);
  write_heads(group, "v", in.v, "values [Hkv, T, dv]", as_float32);
  if (!in.q_retrieval.empty())
    write_heads(group, "q_retrieval", in.q_retrieval, "retrieval queries [Hq, T, d], " + rotation,
                as_float32);
  if (!layer.q_unrotated.empty())
    write_heads(group, "q_unrotated", layer.q_unrotated, "queries [Hq, T, d] before RoPE",
                as_float32);
  if (!layer.k_unrotated.empty())
    write_heads(group, "k_unrotated", layer.k_unrotated, "keys [Hkv, T, d] before RoPE",
                as_float32);
  if (layer.hidden.size() > 0) {
    H5::DataSet dataset = write_doubles(
        group, "hidden", layer.hidden.data(),
        {static_cast<hsize_t>(layer.hidden.rows()), static_cast<hsize_t>(layer.hidden.cols())},
        as_float32);
    write_attribute(dataset, "meaning", std::string("hidden state entering the layer [T, d_model]"));
    dataset.close();  // see write_heads
  }
}

void write_meta(H5::H5File& file, const ActivationMeta& meta) {
  write_attribute(file, "format", std::string(kActivationFormat));
  write_attribute(file, "format_version", kActivationFormatVersion);
  write_attribute(file, "n_layers", meta.n_layers);
  write_attribute(file, "Hq", meta.Hq);
  write_attribute(file, "Hkv", meta.Hkv);
  write_attribute(file, "T", meta.T);
  write_attribute(file, "d", meta.d);
  write_attribute(file, "dv", meta.dv);
  write_attribute(file, "d_model", meta.d_model);
  write_attribute(file, "rotated", static_cast<int64_t>(meta.rotated ? 1 : 0));
  write_attribute(file, "rope_pairing", meta.rope_pairing);
  write_attribute(file, "rope_theta", meta.rope_theta);
  write_attribute(file, "source", json_text(meta.source));
  const auto T = static_cast<hsize_t>(meta.T);
  // A copy of an H5File sliced to a Group has no valid id: write through the root group.
  H5::Group root = file.openGroup("/");
  auto positions = write_int64s(root, "position_ids", meta.position_ids.data(), {T});
  write_attribute(positions, "meaning", std::string("position id of every slot (for RoPE)"));
  positions.close();  // see write_heads
  auto landmarks = write_uint8s(root, "landmarks", meta.landmarks.data(), {T});
  write_attribute(landmarks, "meaning", std::string("1 where the slot is a landmark slot"));
  landmarks.close();
  if (!meta.tokens.empty()) {
    auto tokens = write_int32s(root, "tokens", meta.tokens.data(), {T});
    write_attribute(tokens, "meaning", std::string("token id of every slot, -1 at landmarks"));
    tokens.close();
  }
}

// ---- reading ------------------------------------------------------------------------------

int64_t positive_int(const std::filesystem::path& path, const H5::H5File& file,
                     const std::string& name) {
  int64_t value = read_int_attribute(path, file, "/", name);
  if (value < 1) fail(path, "/ attribute " + name, "an integer >= 1", std::to_string(value));
  return value;
}

void read_slot_layout(const std::filesystem::path& path, const H5::H5File& file,
                      ActivationMeta& meta) {
  auto positions = open_dataset(path, file, "position_ids");
  require_integer(path, "position_ids", positions);
  require_dims(path, "position_ids", positions, {meta.T}, "(T)");
  meta.position_ids = read_int64s(positions);

  auto landmarks = open_dataset(path, file, "landmarks");
  require_integer(path, "landmarks", landmarks);
  require_dims(path, "landmarks", landmarks, {meta.T}, "(T)");
  for (int64_t flag : read_int64s(landmarks)) {
    if (flag != 0 && flag != 1) fail(path, "landmarks", "values 0 or 1", std::to_string(flag));
    meta.landmarks.push_back(static_cast<uint8_t>(flag));
  }

  if (has_object(file, "tokens")) {
    auto tokens = open_dataset(path, file, "tokens");
    require_integer(path, "tokens", tokens);
    require_dims(path, "tokens", tokens, {meta.T}, "(T)");
    for (int64_t token : read_int64s(tokens)) meta.tokens.push_back(static_cast<int32_t>(token));
  }
}

std::vector<Matrix<double>> read_heads(const std::filesystem::path& path, const H5::Group& group,
                                       const std::string& group_name, const std::string& name,
                                       int64_t heads, int64_t rows, int64_t cols,
                                       const std::string& shape_text) {
  std::string full = group_name + "/" + name;
  if (!has_object(group, name)) fail(path, full, "a dataset", "nothing at that path");
  auto dataset = open_dataset(path, group, name);
  require_float(path, full, dataset);
  require_dims(path, full, dataset, {heads, rows, cols}, shape_text);
  auto flat = read_doubles(path, full, dataset);
  std::vector<Matrix<double>> result;
  for (int64_t h = 0; h < heads; ++h) {
    Matrix<double> m(rows, cols);
    std::copy(flat.begin() + h * rows * cols, flat.begin() + (h + 1) * rows * cols, m.data());
    result.push_back(std::move(m));
  }
  return result;
}

}  // namespace

void write_activation_file(const std::filesystem::path& path, const ActivationFile& file,
                           StorageType storage) {
  check_meta(file.meta);
  require(static_cast<int64_t>(file.layers.size()) == file.meta.n_layers, "layers",
          std::to_string(file.meta.n_layers), std::to_string(file.layers.size()));
  for (size_t i = 0; i < file.layers.size(); ++i)
    check_layer(file.meta, file.layers[i], static_cast<int64_t>(i),
                storage == StorageType::float32);

  H5::Exception::dontPrint();
  TempFile temp(path);
  guard_write(path, [&] {
    auto h5 = std::make_unique<H5::H5File>(temp.path().string(), H5F_ACC_TRUNC);
    try {
      write_meta(*h5, file.meta);
      for (size_t i = 0; i < file.layers.size(); ++i)
        write_layer(*h5, file.layers[i], static_cast<int64_t>(i), storage == StorageType::float32,
                    file.meta.rotated);
    } catch (...) {
      try {
        close_file(path, h5);  // never leave a failed file for H5File's destructor to close
      } catch (const FileError&) {
      }
      throw;
    }
    close_file(path, h5);
  });
  temp.publish();
}

ActivationMeta read_activation_meta(const std::filesystem::path& path) {
  H5::H5File file = open_hdf5(path);
  ActivationMeta meta;
  std::string format = read_string_attribute(path, file, "/", "format");
  if (format != kActivationFormat)
    fail(path, "/ attribute format", std::string("\"") + kActivationFormat + "\"",
         "\"" + format + "\"");
  int64_t version = read_int_attribute(path, file, "/", "format_version");
  if (version != kActivationFormatVersion)
    fail(path, "/ attribute format_version", std::to_string(kActivationFormatVersion),
         std::to_string(version));
  meta.n_layers = positive_int(path, file, "n_layers");
  meta.Hq = positive_int(path, file, "Hq");
  meta.Hkv = positive_int(path, file, "Hkv");
  if (meta.Hq % meta.Hkv != 0)
    fail(path, "/ attributes Hq, Hkv", "Hq a multiple of Hkv (grouped-query attention)",
         fmt::format("Hq={} Hkv={}", meta.Hq, meta.Hkv));
  meta.T = positive_int(path, file, "T");
  meta.d = positive_int(path, file, "d");
  meta.dv = positive_int(path, file, "dv");
  meta.d_model = read_int_attribute(path, file, "/", "d_model");
  if (meta.d_model < 0)
    fail(path, "/ attribute d_model", "an integer >= 0", std::to_string(meta.d_model));
  int64_t rotated = read_int_attribute(path, file, "/", "rotated");
  if (rotated != 0 && rotated != 1)
    fail(path, "/ attribute rotated", "0 or 1", std::to_string(rotated));
  meta.rotated = rotated == 1;
  meta.rope_pairing = read_string_attribute(path, file, "/", "rope_pairing");
  if (meta.rope_pairing != "none" && meta.rope_pairing != "half" &&
      meta.rope_pairing != "interleaved")
    fail(path, "/ attribute rope_pairing", "none, half or interleaved", meta.rope_pairing);
  if (meta.rotated && meta.rope_pairing == "none")
    fail(path, "/ attribute rotated", "0 when rope_pairing is none", "1");
  meta.rope_theta = read_double_attribute(path, file, "/", "rope_theta");
  if (meta.rope_pairing != "none" && meta.rope_theta <= 0)
    fail(path, "/ attribute rope_theta", "a positive number", std::to_string(meta.rope_theta));
  std::string source = read_string_attribute(path, file, "/", "source");
  try {
    meta.source = nlohmann::json::parse(source);
  } catch (const nlohmann::json::exception&) {
    fail(path, "/ attribute source", "a JSON document", "\"" + source.substr(0, 60) + "\"");
  }
  read_slot_layout(path, file, meta);
  for (int64_t layer = 0; layer < meta.n_layers; ++layer)
    if (!has_object(file, layer_name(layer)))
      fail(path, layer_name(layer), fmt::format("a group per layer (n_layers={})", meta.n_layers),
           "no such group");
  return meta;
}

LayerActivations read_activation_layer(const std::filesystem::path& path,
                                       const ActivationMeta& meta, int64_t layer) {
  require(layer >= 0 && layer < meta.n_layers, "layer",
          fmt::format("0 <= layer < {}", meta.n_layers), std::to_string(layer));
  H5::H5File file = open_hdf5(path);
  std::string name = layer_name(layer);
  if (!has_object(file, name)) fail(path, name, "a group", "nothing at that path");
  H5::Group group = file.openGroup(name);
  LayerActivations result;
  auto& in = result.inputs;
  in.q = read_heads(path, group, name, "q", meta.Hq, meta.T, meta.d, "(Hq, T, d)");
  in.k = read_heads(path, group, name, "k", meta.Hkv, meta.T, meta.d, "(Hkv, T, d)");
  in.v = read_heads(path, group, name, "v", meta.Hkv, meta.T, meta.dv, "(Hkv, T, dv)");
  if (has_object(group, "q_retrieval"))
    in.q_retrieval =
        read_heads(path, group, name, "q_retrieval", meta.Hq, meta.T, meta.d, "(Hq, T, d)");
  if (has_object(group, "q_unrotated"))
    result.q_unrotated =
        read_heads(path, group, name, "q_unrotated", meta.Hq, meta.T, meta.d, "(Hq, T, d)");
  if (has_object(group, "k_unrotated"))
    result.k_unrotated =
        read_heads(path, group, name, "k_unrotated", meta.Hkv, meta.T, meta.d, "(Hkv, T, d)");
  if (has_object(group, "hidden")) {
    if (meta.d_model < 1)
      fail(path, name + "/hidden", "no hidden states when d_model is 0", "a dataset");
    std::string full = name + "/hidden";
    auto dataset = open_dataset(path, group, "hidden");
    require_float(path, full, dataset);
    require_dims(path, full, dataset, {meta.T, meta.d_model}, "(T, d_model)");
    auto flat = read_doubles(path, full, dataset);
    result.hidden.resize(meta.T, meta.d_model);
    std::copy(flat.begin(), flat.end(), result.hidden.data());
  }
  return result;
}

namespace {

// 64-bit words mixed one at a time (an FNV-1a step per word, then the high half folded into the
// low so that every bit reaches the next multiply).
class Digest {
 public:
  void add(uint64_t word) {
    h_ = (h_ ^ word) * 0x100000001b3ULL;
    h_ ^= h_ >> 32;
  }
  void add(double x) {
    uint64_t word;
    std::memcpy(&word, &x, sizeof word);
    add(word);
  }
  void add(const std::string& text) {
    add(static_cast<uint64_t>(text.size()));
    for (unsigned char c : text) add(static_cast<uint64_t>(c));
  }
  std::string hex() const { return fmt::format("{:016x}", h_); }

 private:
  uint64_t h_ = 0xcbf29ce484222325ULL;
};

}  // namespace

std::string layer_fingerprint(const std::filesystem::path& path, const ActivationMeta& meta,
                              int64_t layer) {
  require(layer >= 0 && layer < meta.n_layers, "layer",
          fmt::format("0 <= layer < {}", meta.n_layers), std::to_string(layer));
  Digest digest;
  for (int64_t n : {meta.T, meta.Hq, meta.Hkv, meta.d, meta.dv})
    digest.add(static_cast<uint64_t>(n));
  digest.add(static_cast<uint64_t>(meta.rotated));
  digest.add(meta.rope_pairing);
  digest.add(meta.rope_theta);
  for (int64_t id : meta.position_ids) digest.add(static_cast<uint64_t>(id));
  for (uint8_t flag : meta.landmarks) digest.add(static_cast<uint64_t>(flag));
  H5::H5File file = open_hdf5(path);
  const std::string group_name = layer_name(layer);
  if (!has_object(file, group_name)) fail(path, group_name, "a group", "nothing at that path");
  const H5::Group group = file.openGroup(group_name);
  // Each dataset's name, then its shape and values, or none: an absent dataset and an empty
  // one, or two shapes of the same values, differ.
  for (const char* name : {"q", "k", "v", "q_retrieval", "q_unrotated", "k_unrotated"}) {
    digest.add(std::string(name));
    if (!has_object(group, name)) {
      digest.add(uint64_t{0});
      continue;
    }
    const H5::DataSet dataset = open_dataset(path, group, name);
    const std::vector<hsize_t> dims = dataset_dims(dataset);
    digest.add(static_cast<uint64_t>(dims.size()));
    for (hsize_t n : dims) digest.add(static_cast<uint64_t>(n));
    for (double x : read_doubles(path, group_name + "/" + name, dataset, /*finite_only=*/false))
      digest.add(x);
  }
  return digest.hex();
}

ActivationFile read_activation_file(const std::filesystem::path& path) {
  ActivationFile result;
  result.meta = read_activation_meta(path);
  for (int64_t layer = 0; layer < result.meta.n_layers; ++layer)
    result.layers.push_back(read_activation_layer(path, result.meta, layer));
  return result;
}

}  // namespace hils::io
