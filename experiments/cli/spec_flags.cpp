#include "cli/spec_flags.hpp"

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "hils/spec_fields.hpp"

namespace hils::cli {
namespace {

// The value type a flag reads: enums are read as their names (checked by the spec decoder).
template <class T>
using FlagValue = std::conditional_t<kIsSpecEnum<T>, std::string, T>;

// "help (a | b | c)" for enum fields, the table's help otherwise.
template <class T>
std::string help_of(const SpecField<T>& field) {
  if constexpr (kIsSpecEnum<T>)
    return std::string(field.help) + ": " + enum_options<T>();
  else
    return field.help;
}

}  // namespace

// cmd, overrides, keys -> one option per selected table row (plus its hidden alias).
void add_spec_flags(CLI::App* cmd, nlohmann::json* overrides,
                    const std::vector<std::string>& keys) {
  for_each_spec_field([&](const auto& field) {
    if (!keys.empty() && std::find(keys.begin(), keys.end(), field.key) == keys.end()) return;
    using Value = FlagValue<std::decay_t<decltype(MechanismSpec{}.*field.member)>>;
    const std::string key = field.key;
    auto store = [overrides, key](const Value& value) { (*overrides)[key] = value; };
    cmd->add_option_function<Value>(field.flags, store, help_of(field));
    if (*field.alias != '\0')
      cmd->add_option_function<Value>(field.alias, store, "")->group("");  // hidden
  });
}

CLI::Option* add_output_option(CLI::App* cmd, std::string* path, const std::string& help) {
  return cmd->add_option("-o,--output,--out", *path, help);
}

CLI::Option* add_config_option(CLI::App* cmd, std::string* path, const std::string& help) {
  return cmd->add_option("-c,--config", *path, help);  // load_toml names a missing file
}

}  // namespace hils::cli
