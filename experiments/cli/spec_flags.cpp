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

// "" for an output path, or why it is one the shell or the option parser left as typed, not
// the path meant: "--out=~/x" (the shell expands ~ only at the start of a word: a folder named
// ~ would be made), "-o --seed" (an option taken as the value of an -o given none), "-o=x"
// (a short option's value follows it, so the name begins with '=').
std::string typed_output_path(const std::string& path) {
  if (path.empty()) return "";
  if (path[0] == '~')
    return "expected a path, got '" + path + "': the shell expands ~ only at the start of a "
           "word (write --out ~/x or $HOME/x, not --out=~/x); ./" + path + " names a folder ~ here";
  if (path[0] == '-')
    return "expected a path, got '" + path + "', which looks like an option (no value after "
           "the output option?); ./" + path + " names a file of that name";
  if (path[0] == '=')
    return "expected a path, got '" + path + "': a short option takes its value after a space "
           "(-o x; --out=x for the long one); ./" + path + " names a file of that name";
  return "";
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
  return cmd->add_option("-o,--output,--out", *path, help)
      ->check(CLI::Validator(typed_output_path, "", "PATH"));
}

CLI::Option* add_config_option(CLI::App* cmd, std::string* path, const std::string& help) {
  return cmd->add_option("-c,--config", *path, help);  // load_toml names a missing file
}

}  // namespace hils::cli
