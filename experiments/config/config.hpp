// Configuration: TOML files read as JSON objects, mechanism specs and synthetic parameters to and
// from JSON with every key checked (a typo is an error naming the key, never silently ignored).
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "hils/spec.hpp"
#include "sources/synthetic.hpp"

namespace hils::config {

// Parses a TOML file into a JSON object (tables become objects, arrays arrays). Throws
// io::FileError naming the file, line and column on a syntax error or a missing file.
nlohmann::json load_toml(const std::filesystem::path& path);

// Throws InvalidArgument "<where>: unknown key 'x' (expected one of ...)" for keys not listed.
void require_known_keys(const nlohmann::json& object, const std::vector<std::string>& keys,
                        const std::string& where);

// Spec fields: preset, name, fusion, key_rule, bias_rule, prior_rule, group_rule, softmax1,
// S, W, K, landmarks, scale. A `preset` key starts from that preset; other keys override it.
// Throws InvalidArgument naming `where` and the key for unknown keys or bad values.
MechanismSpec spec_from_json(const nlohmann::json& object, const std::string& where);
// Applies the keys present in `overrides` (spec fields except preset) on top of `spec`.
void apply_spec_overrides(MechanismSpec& spec, const nlohmann::json& overrides,
                          const std::string& where);
nlohmann::json spec_to_json(const MechanismSpec& spec);
std::vector<std::string> spec_keys();

// Synthetic parameters from a JSON object with the field names of SyntheticParams (plus
// positional, rope_pairing, rope_theta, hope_train_length, hope_m); unknown keys are errors.
void apply_synthetic_json(sources::SyntheticParams& params, const nlohmann::json& object,
                          const std::string& where);
std::vector<std::string> synthetic_keys();

// A value of the expected JSON type or InvalidArgument naming where.key, expected and found.
int64_t get_int(const nlohmann::json& object, const std::string& key, const std::string& where);
double get_number(const nlohmann::json& object, const std::string& key, const std::string& where);
bool get_bool(const nlohmann::json& object, const std::string& key, const std::string& where);
std::string get_string(const nlohmann::json& object, const std::string& key,
                       const std::string& where);

}  // namespace hils::config
