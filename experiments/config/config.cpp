#include "config/config.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <sstream>

#include <fmt/format.h>
#include <toml++/toml.h>

#include "io/file_error.hpp"

namespace hils::config {

namespace {

// The first inf or nan that `node` holds -> io::FileError naming its key and line. No setting
// of the project takes one, and the JSON the document becomes would hold them as the strings
// "Infinity" and "NaN", which the settings' readers would report as strings the user never wrote.
// `where`: the node's key as the readers name it ("[run].rope_theta", "[[mechanism]] #1.scale").
void require_finite_numbers(const toml::node& node, const std::string& where,
                            const std::filesystem::path& path) {
  if (const auto* table = node.as_table()) {
    for (const auto& [key, value] : *table) {
      const std::string name(key.str());
      const std::string top = value.is_table()             ? "[" + name + "]"
                              : value.is_array_of_tables() ? "[[" + name + "]]"
                                                           : name;
      require_finite_numbers(value, where.empty() ? top : where + "." + name, path);
    }
  } else if (const auto* array = node.as_array()) {
    for (size_t i = 0; i < array->size(); ++i)
      require_finite_numbers(*array->get(i),
                             array->is_array_of_tables()
                                 ? fmt::format("{} #{}", where, i + 1)
                                 : fmt::format("{}[{}]", where, i),
                             path);
  } else if (const auto* number = node.as_floating_point()) {
    const double x = number->get();
    if (std::isfinite(x)) return;
    io::fail(path, fmt::format("{} (line {})", where, node.source().begin.line), "a finite number",
             std::isnan(x) ? "nan" : x > 0 ? "inf" : "-inf");
  }
}

// path -> the TOML document as JSON, or io::FileError naming the file, line and column.
nlohmann::json parse_toml_file(const std::filesystem::path& path) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (!std::filesystem::exists(status))
    io::fail(path, "", "a TOML configuration file", "no such file");
  if (std::filesystem::is_directory(status))
    io::fail(path, "", "a TOML configuration file", "a folder");
  if (!std::filesystem::is_regular_file(status))  // a FIFO would block the read
    io::fail(path, "", "a TOML configuration file", "a FIFO, socket or device");
  if (::access(path.c_str(), R_OK) != 0)
    io::fail(path, "", "a TOML configuration file this user can read", std::strerror(errno));
  toml::table table;
  try {
    table = toml::parse_file(path.string());
  } catch (const toml::parse_error& e) {
    const auto& begin = e.source().begin;
    io::fail(path, fmt::format("line {} column {}", begin.line, begin.column), "valid TOML",
             std::string(e.description()));
  }
  require_finite_numbers(table, "", path);
  std::stringstream text;
  text << toml::json_formatter{table};
  return nlohmann::json::parse(text.str());
}

// "[a], [b], [[c]]": the schema's tables as a reader writes them.
std::string table_list(const TomlSchema& schema) {
  std::string list;
  for (const auto& table : schema)
    list += (list.empty() ? "" : ", ") + (table.array ? "[[" + table.name + "]]"
                                                       : "[" + table.name + "]");
  return list;
}

std::string found_text(const nlohmann::json& value) {
  return std::string(value.type_name()) + " " + value.dump();
}

// A key of `table` that the schema refuses with a hint -> InvalidArgument
// "<file>: [table] key: <hint>"; each element of an array of tables is checked.
void require_not_refused(const nlohmann::json& value, const TomlTable& table,
                         const std::string& file) {
  if (value.is_array()) {
    for (const auto& element : value) require_not_refused(element, table, file);
    return;
  }
  if (!value.is_object()) return;
  for (const auto& [key, hint] : table.refused) {
    if (!value.contains(key)) continue;
    std::string text = hint;
    if (const size_t at = text.find("{value}"); at != std::string::npos)
      text.replace(at, 7, value[key].dump());
    throw InvalidArgument(fmt::format("{}: [{}] {}: {}", file, table.name, key, text));
  }
}

}  // namespace

// path, schema -> the document, every table and key checked against the schema.
nlohmann::json load_toml(const std::filesystem::path& path, const TomlSchema& schema) {
  nlohmann::json document = parse_toml_file(path);
  const std::string file = path.string();
  for (const auto& item : document.items()) {
    const TomlTable* table = nullptr;
    for (const auto& t : schema)
      if (t.name == item.key()) table = &t;
    if (!table)
      throw InvalidArgument(fmt::format("{}: unknown table or key '{}' (expected the tables {})",
                                        file, item.key(), table_list(schema)));
    require_not_refused(item.value(), *table, file);
    if (!table->array) {
      require(item.value().is_object(), fmt::format("{}: {}", file, item.key()),
              fmt::format("a table [{}]", item.key()), found_text(item.value()));
      require_known_keys(item.value(), table->keys, fmt::format("{}: [{}]", file, item.key()));
      continue;
    }
    require(item.value().is_array(), fmt::format("{}: {}", file, item.key()),
            fmt::format("an array of tables [[{}]]", item.key()), found_text(item.value()));
    for (size_t i = 0; i < item.value().size(); ++i)
      require_known_keys(item.value()[i], table->keys,
                         fmt::format("{}: [[{}]] #{}", file, item.key(), i + 1));
  }
  return document;
}

ConfigValues::ConfigValues(nlohmann::json root, std::string file)
    : root_(std::move(root)), file_(std::move(file)) {}

const nlohmann::json* ConfigValues::find(const std::string& table, const std::string& key) const {
  if (!root_.contains(table) || !root_[table].is_object() || !root_[table].contains(key))
    return nullptr;
  return &root_[table][key];
}

bool ConfigValues::has(const std::string& table, const std::string& key) const {
  return find(table, key) != nullptr;
}

std::string ConfigValues::where(const std::string& table, const std::string& key) const {
  return fmt::format("{}: [{}].{}", file_, table, key);
}

nlohmann::json ConfigValues::table(const std::string& name) const {
  return root_.contains(name) ? root_[name] : nlohmann::json::object();
}

int64_t ConfigValues::integer(const std::string& table, const std::string& key, int64_t fallback,
                              int64_t least) const {
  if (!has(table, key)) return fallback;
  const int64_t value = get_int(root_[table], key, fmt::format("{}: [{}]", file_, table));
  require(value >= least, where(table, key), fmt::format("an integer >= {}", least),
          std::to_string(value));
  return value;
}

double ConfigValues::number(const std::string& table, const std::string& key,
                            double fallback) const {
  return has(table, key) ? get_number(root_[table], key, fmt::format("{}: [{}]", file_, table))
                         : fallback;
}

bool ConfigValues::boolean(const std::string& table, const std::string& key,
                           bool fallback) const {
  return has(table, key) ? get_bool(root_[table], key, fmt::format("{}: [{}]", file_, table))
                         : fallback;
}

std::string ConfigValues::text(const std::string& table, const std::string& key,
                               const std::string& fallback) const {
  return has(table, key) ? get_string(root_[table], key, fmt::format("{}: [{}]", file_, table))
                         : fallback;
}

const nlohmann::json& ConfigValues::array(const std::string& table, const std::string& key,
                                          const char* expected) const {
  const nlohmann::json& value = *find(table, key);
  require(value.is_array(), where(table, key), expected, found_text(value));
  return value;
}

std::vector<int64_t> ConfigValues::integers(const std::string& table, const std::string& key,
                                            const std::vector<int64_t>& fallback,
                                            int64_t least) const {
  if (!has(table, key)) return fallback;
  const std::string expected = fmt::format("an array of integers >= {}", least);
  std::vector<int64_t> out;
  for (const auto& element : array(table, key, expected.c_str())) {
    const bool integral = element.is_number_integer() ||
                          (element.is_number_float() &&
                           element.get<double>() == static_cast<int64_t>(element.get<double>()));
    require(integral && element.get<int64_t>() >= least, where(table, key), expected,
            found_text(element));
    out.push_back(element.get<int64_t>());
  }
  return out;
}

std::vector<double> ConfigValues::numbers(const std::string& table, const std::string& key,
                                          const std::vector<double>& fallback) const {
  if (!has(table, key)) return fallback;
  std::vector<double> out;
  for (const auto& element : array(table, key, "an array of numbers")) {
    require(element.is_number(), where(table, key), "an array of numbers", found_text(element));
    out.push_back(element.get<double>());
  }
  return out;
}

std::vector<std::string> ConfigValues::texts(const std::string& table, const std::string& key,
                                             const std::vector<std::string>& fallback) const {
  if (!has(table, key)) return fallback;
  std::vector<std::string> out;
  for (const auto& element : array(table, key, "an array of strings")) {
    require(element.is_string(), where(table, key), "an array of strings", found_text(element));
    out.push_back(element.get<std::string>());
  }
  return out;
}

// check, table, flags, where -> check(), its error naming the file when the file set the key.
void check_naming_file(const std::function<void()>& check, const nlohmann::json& table,
                       const nlohmann::json& flags, const std::string& table_where) {
  try {
    check();
  } catch (const InvalidArgument& e) {
    const std::string message = e.what();
    const size_t colon = message.find(": ");
    bool from_file = false;
    std::stringstream keys(message.substr(0, colon == std::string::npos ? 0 : colon));
    for (std::string key; std::getline(keys, key, ',');) {
      key.erase(0, key.find_first_not_of(' '));
      if (table.is_object() && table.contains(key) && !flags.contains(key)) from_file = true;
    }
    if (!from_file) throw;
    throw InvalidArgument(table_where + ": " + message);
  }
}

std::vector<std::string> synthetic_keys() {
  return {"generator",        "T",           "S",           "landmarks",    "Hq",
          "Hkv",              "d",           "dv",          "logit_std",    "topic_share",
          "query_topic_share", "depth",      "needle_query", "needle_logit", "retrieval_noise",
          "segment",          "key_noise",   "query_rho",
          "positional",       "rope_pairing", "rope_theta",  "hope_train_length", "hope_m",
          "seed"};
}

const TomlSchema& run_schema() {
  static const TomlSchema schema = {
      {"run",
       {"layers", "positional", "rope_pairing", "rope_theta", "hope_train_length", "hope_m",
        "last_queries", "keep_scores", "keep_window", "seed"}},
      {"mechanism", spec_keys(), true}};
  return schema;
}

const TomlSchema& synthetic_schema() {
  static const TomlSchema schema = {{"synthetic", synthetic_keys()}};
  return schema;
}

namespace {

// The studies' [source] table: kind, layers and the synthetic generators' keys, less those a
// study sets itself (refused with where to set them), and the studies' old name of logit_std.
TomlTable study_source_table() {
  TomlTable table{"source", {"kind", "layers"}};
  const std::vector<std::string> owned = {"T",          "S",           "landmarks",
                                          "positional", "rope_pairing", "rope_theta",
                                          "hope_train_length", "hope_m"};
  for (const auto& key : synthetic_keys())
    if (std::find(owned.begin(), owned.end(), key) == owned.end()) table.keys.push_back(key);
  for (const auto& key : owned)
    table.refused.emplace_back(key, "set by the study (lengths, [geometry], [extrapolation]), "
                                    "not by the source");
  table.refused.emplace_back("query_gain", "renamed logit_std (the same number: the queries' "
                                           "gain); write logit_std = {value}");
  return table;
}

}  // namespace

const TomlSchema& study_schema() {
  static const TomlSchema schema = {
      study_source_table(),
      {"geometry", {"S", "W", "K", "landmarks"}},
      {"study", {"prior_rule", "prior_source", "mechanisms", "queries", "keep_scores"}},
      {"fidelity", {"lengths"}},
      {"overlap", {"lengths", "tail_queries", "block_sizes", "final_block", "mechanism"}},
      {"extrapolation",
       {"lengths", "encodings", "train_length", "theta", "pairing", "depths", "needle_logit"}}};
  return schema;
}

void apply_synthetic_json(sources::SyntheticParams& p, const nlohmann::json& o,
                          const std::string& where) {
  require_known_keys(o, synthetic_keys(), where);
  auto f = [&](const char* key) { return where + "." + key; };
  if (o.contains("generator")) p.generator = get_string(o, "generator", where);
  if (o.contains("T")) p.T = get_int(o, "T", where);
  if (o.contains("S")) p.S = get_int(o, "S", where);
  if (o.contains("landmarks")) p.landmarks = get_bool(o, "landmarks", where);
  if (o.contains("Hq")) p.Hq = get_int(o, "Hq", where);
  if (o.contains("Hkv")) p.Hkv = get_int(o, "Hkv", where);
  if (o.contains("d")) p.d = get_int(o, "d", where);
  if (o.contains("dv")) p.dv = get_int(o, "dv", where);
  if (o.contains("logit_std")) p.logit_std = get_number(o, "logit_std", where);
  if (o.contains("topic_share")) p.topic_share = get_number(o, "topic_share", where);
  if (o.contains("query_topic_share"))
    p.query_topic_share = get_number(o, "query_topic_share", where);
  if (o.contains("depth")) p.depth = get_number(o, "depth", where);
  if (o.contains("needle_query")) p.needle_query = get_int(o, "needle_query", where);
  if (o.contains("needle_logit")) p.needle_logit = get_number(o, "needle_logit", where);
  if (o.contains("retrieval_noise")) p.retrieval_noise = get_number(o, "retrieval_noise", where);
  if (o.contains("segment")) p.segment = get_int(o, "segment", where);
  if (o.contains("key_noise")) p.key_noise = get_number(o, "key_noise", where);
  if (o.contains("query_rho")) p.query_rho = get_number(o, "query_rho", where);
  if (o.contains("positional"))
    p.positional.kind = parse_positional_kind(get_string(o, "positional", where), f("positional"));
  if (o.contains("rope_pairing"))
    p.positional.pairing =
        parse_rope_pairing(get_string(o, "rope_pairing", where), f("rope_pairing"));
  if (o.contains("rope_theta")) p.positional.theta = get_number(o, "rope_theta", where);
  if (o.contains("hope_train_length"))
    p.positional.hope_train_length = get_number(o, "hope_train_length", where);
  if (o.contains("hope_m")) p.positional.hope_m = get_number(o, "hope_m", where);
  if (o.contains("seed")) {
    int64_t seed = get_int(o, "seed", where);
    require(seed >= 0, f("seed"), ">= 0", std::to_string(seed));
    p.seed = static_cast<uint64_t>(seed);
  }
}

}  // namespace hils::config
