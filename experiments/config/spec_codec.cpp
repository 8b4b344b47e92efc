#include "config/spec_codec.hpp"

#include <cstdint>
#include <limits>
#include <set>
#include <type_traits>

#include "hils/spec_fields.hpp"
#include "hils/types.hpp"

namespace hils::config {

void require_known_keys(const nlohmann::json& object, const std::vector<std::string>& keys,
                        const std::string& where) {
  require(object.is_object(), where, "a table of settings", object.type_name());
  for (const auto& item : object.items()) {
    bool known = false;
    for (const auto& key : keys) known = known || key == item.key();
    if (!known) {
      std::string list;
      for (const auto& key : keys) list += (list.empty() ? "" : ", ") + key;
      throw InvalidArgument(where + ": unknown key '" + item.key() + "' (expected one of " + list +
                            ")");
    }
  }
}

ParsedJson parse_json_text(const std::string& text) {
  ParsedJson parsed;
  std::vector<std::set<std::string>> open_objects;  // the keys read so far in each open object
  auto track = [&](int, nlohmann::json::parse_event_t event, nlohmann::json& value) {
    using Event = nlohmann::json::parse_event_t;
    if (event == Event::object_start) open_objects.emplace_back();
    if (event == Event::object_end) open_objects.pop_back();
    if (event == Event::key && !open_objects.back().insert(value.get<std::string>()).second &&
        parsed.repeated_key.empty())
      parsed.repeated_key = value.get<std::string>();
    return true;
  };
  parsed.value = nlohmann::json::parse(text, track);
  return parsed;
}

namespace {

// "string \"16\"", "number 4.5"; null alone (its type name and its text are the same word).
std::string found_text(const nlohmann::json& value) {
  if (value.is_null()) return "null";
  return std::string(value.type_name()) + " " + value.dump();
}

}  // namespace

int64_t get_int(const nlohmann::json& object, const std::string& key, const std::string& where) {
  const auto& value = object.at(key);
  // JSON integers above int64's range arrive unsigned: get<int64_t> would wrap them.
  if (value.is_number_unsigned() &&
      value.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    throw InvalidArgument(where + "." + key + ": expected an integer within int64's range, got " +
                          found_text(value));
  if (value.is_number_integer()) return value.get<int64_t>();
  // TOML integers arrive as integers; allow 64.0 written as a float only when integral.
  if (value.is_number_float() && value.get<double>() == static_cast<int64_t>(value.get<double>()))
    return static_cast<int64_t>(value.get<double>());
  throw InvalidArgument(where + "." + key + ": expected an integer, got " + found_text(value));
}

double get_number(const nlohmann::json& object, const std::string& key,
                  const std::string& where) {
  const auto& value = object.at(key);
  if (value.is_number()) return value.get<double>();
  throw InvalidArgument(where + "." + key + ": expected a number, got " + found_text(value));
}

bool get_bool(const nlohmann::json& object, const std::string& key, const std::string& where) {
  const auto& value = object.at(key);
  if (value.is_boolean()) return value.get<bool>();
  throw InvalidArgument(where + "." + key + ": expected true or false, got " + found_text(value));
}

std::string get_string(const nlohmann::json& object, const std::string& key,
                       const std::string& where) {
  const auto& value = object.at(key);
  if (value.is_string()) return value.get<std::string>();
  throw InvalidArgument(where + "." + key + ": expected a string, got " + found_text(value));
}

std::vector<std::string> spec_keys() {
  std::vector<std::string> keys{"preset"};
  for_each_spec_field([&](const auto& field) { keys.emplace_back(field.key); });
  return keys;
}

namespace {

// object[field.key], when present, decoded into spec's member with the type's getter.
template <class T>
void decode_field(const SpecField<T>& field, MechanismSpec& spec, const nlohmann::json& object,
                  const std::string& where) {
  if (!object.contains(field.key)) return;
  T& value = spec.*field.member;
  if constexpr (kIsSpecEnum<T>)
    value = parse_enum<T>(get_string(object, field.key, where), where + "." + field.key);
  else if constexpr (std::is_same_v<T, std::string>)
    value = get_string(object, field.key, where);
  else if constexpr (std::is_same_v<T, bool>)
    value = get_bool(object, field.key, where);
  else if constexpr (std::is_same_v<T, int64_t>)
    value = get_int(object, field.key, where);
  else
    value = get_number(object, field.key, where);
}

}  // namespace

void apply_spec_overrides(MechanismSpec& spec, const nlohmann::json& o, const std::string& where) {
  std::vector<std::string> keys = spec_keys();
  keys.erase(keys.begin());  // "preset" only starts a spec (spec_from_json)
  require_known_keys(o, keys, where);
  for_each_spec_field([&](const auto& field) { decode_field(field, spec, o, where); });
}

MechanismSpec spec_from_json(const nlohmann::json& o, const std::string& where) {
  require_known_keys(o, spec_keys(), where);
  MechanismSpec spec;
  if (o.contains("preset")) {
    const std::string name = get_string(o, "preset", where);  // its message names where.preset
    try {
      spec = preset(name);
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(where + "." + e.what());
    }
  }
  nlohmann::json rest = o;
  rest.erase("preset");
  apply_spec_overrides(spec, rest, where);
  return spec;
}

nlohmann::json spec_to_json(const MechanismSpec& spec) {
  nlohmann::json object = nlohmann::json::object();
  for_each_spec_field([&](const auto& field) {
    const auto& value = spec.*field.member;
    if constexpr (kIsSpecEnum<std::decay_t<decltype(value)>>)
      object[field.key] = enum_name(value);
    else
      object[field.key] = value;
  });
  return object;
}

}  // namespace hils::config
