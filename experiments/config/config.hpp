// Configuration: TOML files read as JSON objects and synthetic parameters from JSON, with every
// key checked (a typo is an error naming the key, never silently ignored). The mechanism spec
// codec and the typed JSON getters are in config/spec_codec.hpp (its own small target).
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/spec_codec.hpp"
#include "sources/synthetic.hpp"

namespace hils::config {

// Parses a TOML file into a JSON object (tables become objects, arrays arrays). Throws
// io::FileError naming the file, line and column on a syntax error or a missing file.
nlohmann::json load_toml(const std::filesystem::path& path);

// Synthetic parameters from a JSON object with the field names of SyntheticParams (plus
// positional, rope_pairing, rope_theta, hope_train_length, hope_m); unknown keys are errors.
void apply_synthetic_json(sources::SyntheticParams& params, const nlohmann::json& object,
                          const std::string& where);
std::vector<std::string> synthetic_keys();

}  // namespace hils::config
