// The report of `hils info`: activation and results files described from their attributes
// (the readers of experiments/io/ validate them on the way), and their datasets listed.
#include "cli/info/info_report.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "io/activation_file.hpp"
#include "io/hdf5_util.hpp"
#include "io/results_file.hpp"

namespace hils::cli::info {

// group, prefix -> out: one row per dataset, depth first in name order; a link that leads
// nowhere (a soft link to a removed dataset) is a row of its own, not a corrupt file.
void list_datasets(const H5::Group& group, const std::string& prefix, nlohmann::json& out) {
  std::vector<std::string> names;
  for (hsize_t i = 0; i < group.getNumObjs(); ++i) names.push_back(group.getObjnameByIdx(i));
  std::sort(names.begin(), names.end());
  for (const auto& name : names) {
    std::string path = prefix + "/" + name;
    const auto object = io::linked_object_type(group, name);
    if (!object) {
      out.push_back({{"path", path}, {"shape", nlohmann::json::array()}, {"dtype", "link"},
                     {"meaning", "a link that cannot be followed"}});
      continue;
    }
    if (*object == H5O_TYPE_GROUP) {
      list_datasets(group.openGroup(name), path, out);
      continue;
    }
    if (*object != H5O_TYPE_DATASET) continue;
    H5::DataSet dataset = group.openDataSet(name);
    std::vector<int64_t> shape;
    for (auto extent : io::dataset_dims(dataset)) shape.push_back(static_cast<int64_t>(extent));
    H5::DataType type = dataset.getDataType();
    std::string dtype = type.getClass() == H5T_FLOAT     ? fmt::format("float{}", 8 * type.getSize())
                        : type.getClass() == H5T_INTEGER
                            ? fmt::format("{}int{}",
                                          dataset.getIntType().getSign() == H5T_SGN_NONE ? "u" : "",
                                          8 * type.getSize())
                        : type.getClass() == H5T_STRING  ? "string"
                                                         : "other";
    std::string meaning =
        dataset.attrExists("meaning")
            ? io::read_string_attribute(path, dataset, path, "meaning")
            : "";
    out.push_back({{"path", path}, {"shape", shape}, {"dtype", dtype}, {"meaning", meaning}});
  }
}

// path, check -> the activation file's kind, sizes, encoding, source and validation.
nlohmann::json activation_info(const std::string& path, bool check) {
  auto meta = io::read_activation_meta(path);
  if (check)
    for (int64_t layer = 0; layer < meta.n_layers; ++layer)
      io::read_activation_layer(path, meta, layer);
  int64_t landmarks = 0;
  for (auto flag : meta.landmarks) landmarks += flag;
  return {{"kind", "activations"},
          {"format_version", io::kActivationFormatVersion},
          {"n_layers", meta.n_layers},
          {"Hq", meta.Hq},
          {"Hkv", meta.Hkv},
          {"T", meta.T},
          {"d", meta.d},
          {"dv", meta.dv},
          {"d_model", meta.d_model},
          {"rotated", meta.rotated},
          {"rope_pairing", meta.rope_pairing},
          {"rope_theta", meta.rope_theta},
          {"landmark_slots", landmarks},
          {"has_tokens", !meta.tokens.empty()},
          {"source", meta.source},
          {"validated", check ? "all layers" : "attributes and slot layout only"}};
}

// path -> the results file's provenance attributes, config and complete units.
nlohmann::json results_info(const std::string& path) {
  io::ResultsReader reader(path);
  nlohmann::json info = {{"kind", "results"}};
  for (const char* name : {"hils_version", "git_commit", "created", "command", "seed_text"})
    info[name] = reader.string_attribute("", name);
  info["config"] = reader.config();
  info["complete_units"] = nlohmann::json::parse(reader.string_attribute("", "complete_units"));
  return info;
}

// info, datasets -> the text report.
void print_text(const nlohmann::json& info, const nlohmann::json& datasets) {
  if (info["kind"] == "activations") {
    fmt::print("activation file: {} layer(s), Hq={} Hkv={} T={} d={} dv={} d_model={}\n",
               info["n_layers"].get<int64_t>(), info["Hq"].get<int64_t>(),
               info["Hkv"].get<int64_t>(), info["T"].get<int64_t>(), info["d"].get<int64_t>(),
               info["dv"].get<int64_t>(), info["d_model"].get<int64_t>());
    fmt::print("  q/k rotated: {}  RoPE: {} theta={}  landmark slots: {}  tokens: {}\n",
               info["rotated"].get<bool>() ? "yes" : "no",
               info["rope_pairing"].get<std::string>(), info["rope_theta"].get<double>(),
               info["landmark_slots"].get<int64_t>(), info["has_tokens"].get<bool>() ? "yes" : "no");
    fmt::print("  source: {}\n  validated: {}\n", info["source"].dump(),
               info["validated"].get<std::string>());
  } else {
    fmt::print("results file: hils {} (git {}), created {}, seed {}\n",
               info["hils_version"].get<std::string>(), info["git_commit"].get<std::string>(),
               info["created"].get<std::string>(), info["seed_text"].get<std::string>());
    fmt::print("  command: {}\n  config: {}\n  complete units: {}\n",
               info["command"].get<std::string>(), info["config"].dump(),
               info["complete_units"].size());
  }
  fmt::print("datasets:\n");
  for (const auto& d : datasets) {
    std::string shape;
    for (const auto& e : d["shape"]) shape += (shape.empty() ? "" : ", ") + e.dump();
    fmt::print("  {:<36} [{}] {}  {}\n", d["path"].get<std::string>(), shape,
               d["dtype"].get<std::string>(), d["meaning"].get<std::string>());
  }
}

}  // namespace hils::cli::info
