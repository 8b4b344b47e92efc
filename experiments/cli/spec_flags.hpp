// The mechanism spec's command-line flags, registered from the field table
// (hils/spec_fields.hpp) so that every `hils` command spells them the same way:
// -S,--chunk  -W,--window  -K,--top-k  --name  --fusion  --key-rule  --bias-rule  --prior-rule
// --group-rule  --softmax1  --landmarks  --scale (and the studies' older --S --W --K, hidden);
// and the two file options every command has: -o,--output (also --out) and -c,--config.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

namespace hils::cli {

// Registers on `cmd` the flag of every spec field in `keys` (every field when empty). A flag
// given on the command line sets (*overrides)[key] to its value, unchecked: apply the object with
// config::apply_spec_overrides(spec, *overrides, "flags"), the decoder that JSON and TOML specs
// go through, so that one function checks every value and words every error.
void add_spec_flags(CLI::App* cmd, nlohmann::json* overrides,
                    const std::vector<std::string>& keys = {});

// Registers the option `names` on `cmd`: a value given sets (*target)[key], unchecked, for the
// decoder of that settings table to check (hils run's [run] settings, hils dump synthetic's
// [synthetic] keys), as add_spec_flags does for the spec's fields.
template <class T>
CLI::Option* add_json_option(CLI::App* cmd, nlohmann::json* target, const std::string& names,
                             const std::string& key, const std::string& help) {
  return cmd->add_option_function<T>(
      names, [target, key](const T& value) { (*target)[key] = value; }, help);
}

// The output option of every command: -o,--output, with --out (the studies' first spelling)
// accepted too; a path beginning with ~, - or = is refused (the shell's or the parser's
// leftover: --out=~/x, -o --seed, -o=x), ./ before it names such a file. Returns the option,
// e.g. to mark it required.
CLI::Option* add_output_option(CLI::App* cmd, std::string* path, const std::string& help);
// The config option of every command that reads TOML: -c,--config (config::load_toml
// refuses a missing file, naming it).
CLI::Option* add_config_option(CLI::App* cmd, std::string* path, const std::string& help);

}  // namespace hils::cli
