// The one MechanismSpec <-> JSON codec, used by `hils run` and `hils verify`, the studies, the
// tests and the Python module. Its own target (hils_spec_codec): it needs only the reference and
// nlohmann_json's headers, so the Python module links it without HDF5, toml++, fmt or CLI11.
// Every key is checked: a typo is an error naming the key, never silently ignored.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "hils/spec.hpp"
#include "hils/types.hpp"

namespace hils::config {

// Throws InvalidArgument "<where>: unknown key 'x' (expected one of ...)" for keys not listed.
void require_known_keys(const nlohmann::json& object, const std::vector<std::string>& keys,
                        const std::string& where);

// JSON text -> JSON, or the first key an object of it repeats: nlohmann keeps the last of two
// equal keys without a word, so a verify file's spec {"K": 4, "K": 8} was judged with K = 8.
// Throws nlohmann::json::parse_error for text that is not JSON.
struct ParsedJson {
  nlohmann::json value;
  std::string repeated_key;  // empty when every object's keys differ
};
ParsedJson parse_json_text(const std::string& text);

// Keys: `preset` and the fields of the table in hils/spec_fields.hpp (name, fusion, key_rule,
// ..., scale). A `preset` key starts from that preset; other keys override it.
// Throws InvalidArgument naming `where` and the key for unknown keys or bad values.
MechanismSpec spec_from_json(const nlohmann::json& object, const std::string& where);
// Applies the keys present in `overrides` (spec fields except preset) on top of `spec`.
void apply_spec_overrides(MechanismSpec& spec, const nlohmann::json& overrides,
                          const std::string& where);
// Every field of the table, enums by name.
nlohmann::json spec_to_json(const MechanismSpec& spec);
// "preset" and the table's keys, in table order.
std::vector<std::string> spec_keys();

// A value of the expected JSON type or InvalidArgument naming where.key, expected and found.
int64_t get_int(const nlohmann::json& object, const std::string& key, const std::string& where);
double get_number(const nlohmann::json& object, const std::string& key, const std::string& where);
bool get_bool(const nlohmann::json& object, const std::string& key, const std::string& where);
std::string get_string(const nlohmann::json& object, const std::string& key,
                       const std::string& where);

}  // namespace hils::config
