#include "config/spec_codec.hpp"

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

namespace {

std::string found_text(const nlohmann::json& value) {
  return std::string(value.type_name()) + " " + value.dump();
}

}  // namespace

int64_t get_int(const nlohmann::json& object, const std::string& key, const std::string& where) {
  const auto& value = object.at(key);
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
  return {"preset", "name", "fusion", "key_rule", "bias_rule", "prior_rule", "group_rule",
          "softmax1", "S", "W", "K", "landmarks", "scale"};
}

void apply_spec_overrides(MechanismSpec& spec, const nlohmann::json& o, const std::string& where) {
  require_known_keys(o, spec_keys(), where);
  auto field = [&](const char* key) { return where + "." + key; };
  if (o.contains("name")) spec.name = get_string(o, "name", where);
  if (o.contains("fusion")) spec.fusion = parse_fusion(get_string(o, "fusion", where), field("fusion"));
  if (o.contains("key_rule"))
    spec.key_rule = parse_key_rule(get_string(o, "key_rule", where), field("key_rule"));
  if (o.contains("bias_rule"))
    spec.bias_rule = parse_bias_rule(get_string(o, "bias_rule", where), field("bias_rule"));
  if (o.contains("prior_rule"))
    spec.prior_rule = parse_prior_rule(get_string(o, "prior_rule", where), field("prior_rule"));
  if (o.contains("group_rule"))
    spec.group_rule = parse_group_rule(get_string(o, "group_rule", where), field("group_rule"));
  if (o.contains("softmax1")) spec.softmax1 = get_bool(o, "softmax1", where);
  if (o.contains("S")) spec.S = get_int(o, "S", where);
  if (o.contains("W")) spec.W = get_int(o, "W", where);
  if (o.contains("K")) spec.K = get_int(o, "K", where);
  if (o.contains("landmarks")) spec.landmarks = get_bool(o, "landmarks", where);
  if (o.contains("scale")) spec.scale = get_number(o, "scale", where);
}

MechanismSpec spec_from_json(const nlohmann::json& o, const std::string& where) {
  require_known_keys(o, spec_keys(), where);
  MechanismSpec spec;
  if (o.contains("preset")) {
    try {
      spec = preset(get_string(o, "preset", where));
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(where + "." + e.what());
    }
  }
  nlohmann::json rest = o;
  rest.erase("preset");
  apply_spec_overrides(spec, rest, where);
  return spec;
}

nlohmann::json spec_to_json(const MechanismSpec& s) {
  return {{"name", s.name},
          {"fusion", to_string(s.fusion)},
          {"key_rule", to_string(s.key_rule)},
          {"bias_rule", to_string(s.bias_rule)},
          {"prior_rule", to_string(s.prior_rule)},
          {"group_rule", to_string(s.group_rule)},
          {"softmax1", s.softmax1},
          {"S", s.S},
          {"W", s.W},
          {"K", s.K},
          {"landmarks", s.landmarks},
          {"scale", s.scale}};
}

}  // namespace hils::config
