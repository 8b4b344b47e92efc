// Configuration: TOML files read as JSON objects and synthetic parameters from JSON, with every
// key checked (a typo is an error naming the key, never silently ignored). The mechanism spec
// codec and the typed JSON getters are in config/spec_codec.hpp (its own small target).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/spec_codec.hpp"
#include "sources/synthetic.hpp"

namespace hils::config {

// What a TOML config may hold: its tables, each with its keys. `array`: the table is written
// [[name]] (an array of tables, each element with these keys).
// `refused`: keys this table does not take but a user may write (an old name, a key another
// command's table takes), each with the hint its error gives; "{value}" in a hint is replaced
// by the value written, so a rename can say what to write instead.
struct TomlTable {
  std::string name;
  std::vector<std::string> keys;
  bool array = false;
  std::vector<std::pair<std::string, std::string>> refused = {};
};
using TomlSchema = std::vector<TomlTable>;

// The one TOML reader of every `hils` command: parses `path` into a JSON object (tables become
// objects, arrays arrays) and refuses anything `schema` does not list: an unknown table, an
// unknown key, a key outside any table, a table written as a plain value. Errors are
// InvalidArgument "<file>: [table]: unknown key 'x' (expected one of ...)"; a syntax error or a
// missing file is an io::FileError naming the file, line and column.
nlohmann::json load_toml(const std::filesystem::path& path, const TomlSchema& schema);

// Typed values of a config that load_toml read, each with a default for when it is absent. A
// value of the wrong type or out of range is an InvalidArgument naming the file, the table, the
// key and the expected value ("s.toml: [geometry].S: expected an integer, got string \"x\"").
class ConfigValues {
 public:
  ConfigValues() = default;  // no file: every value is its default
  ConfigValues(nlohmann::json root, std::string file);

  bool has(const std::string& table, const std::string& key) const;
  // "<file>: [table].key", how errors name a key of this file.
  std::string where(const std::string& table, const std::string& key) const;
  // "<file>" or "(defaults)" when no file was read.
  const std::string& file() const { return file_; }

  int64_t integer(const std::string& table, const std::string& key, int64_t fallback,
                  int64_t least = std::numeric_limits<int64_t>::min()) const;
  double number(const std::string& table, const std::string& key, double fallback) const;
  bool boolean(const std::string& table, const std::string& key, bool fallback) const;
  std::string text(const std::string& table, const std::string& key,
                   const std::string& fallback) const;
  std::vector<int64_t> integers(const std::string& table, const std::string& key,
                                const std::vector<int64_t>& fallback,
                                int64_t least = std::numeric_limits<int64_t>::min()) const;
  std::vector<double> numbers(const std::string& table, const std::string& key,
                              const std::vector<double>& fallback) const;
  std::vector<std::string> texts(const std::string& table, const std::string& key,
                                 const std::vector<std::string>& fallback) const;
  // The table as read (an empty object when absent).
  nlohmann::json table(const std::string& name) const;

 private:
  const nlohmann::json* find(const std::string& table, const std::string& key) const;
  // The value as an array, or InvalidArgument naming the key.
  const nlohmann::json& array(const std::string& table, const std::string& key,
                              const char* expected) const;
  nlohmann::json root_ = nlohmann::json::object();
  std::string file_ = "(defaults)";
};

// Runs `check` (a validate() of values merged from a config table and flags). When it throws
// an InvalidArgument about a key ("T: expected >= 1, got 0", "Hq, Hkv: ...") that `table` set
// and `flags` did not override, the error is re-thrown prefixed with `table_where`, so that it
// names the file: "s.toml: [synthetic]: T: expected >= 1, got 0".
void check_naming_file(const std::function<void()>& check, const nlohmann::json& table,
                       const nlohmann::json& flags, const std::string& table_where);

// Synthetic parameters from a JSON object with the field names of SyntheticParams (plus
// positional, rope_pairing, rope_theta, hope_train_length, hope_m); unknown keys are errors.
void apply_synthetic_json(sources::SyntheticParams& params, const nlohmann::json& object,
                          const std::string& where);
std::vector<std::string> synthetic_keys();

// The schemas of the commands that read TOML: every table and key each may hold. Adding a
// config key: add it here and read it where the command resolves its settings.
const TomlSchema& run_schema();        // hils run: [run], [[mechanism]] (the spec's keys)
const TomlSchema& synthetic_schema();  // hils dump synthetic: [synthetic]
// hils fidelity / overlap / extrapolate / studies: one config serves the three studies, so
// each accepts every study table (experiments/configs/stories260k.toml is one).
const TomlSchema& study_schema();

}  // namespace hils::config
