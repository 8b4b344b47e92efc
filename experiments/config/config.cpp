#include "config/config.hpp"

#include <sstream>

#include <fmt/format.h>
#include <toml++/toml.h>

#include "io/file_error.hpp"

namespace hils::config {

nlohmann::json load_toml(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    io::fail(path, "", "a TOML configuration file", "no such file");
  toml::table table;
  try {
    table = toml::parse_file(path.string());
  } catch (const toml::parse_error& e) {
    const auto& begin = e.source().begin;
    io::fail(path, fmt::format("line {} column {}", begin.line, begin.column), "valid TOML",
             std::string(e.description()));
  }
  std::stringstream text;
  text << toml::json_formatter{table};
  return nlohmann::json::parse(text.str());
}

void require_known_keys(const nlohmann::json& object, const std::vector<std::string>& keys,
                        const std::string& where) {
  require(object.is_object(), where, "a table of settings", object.type_name());
  for (const auto& item : object.items()) {
    bool known = false;
    for (const auto& key : keys) known = known || key == item.key();
    if (!known) {
      std::string list;
      for (const auto& key : keys) list += (list.empty() ? "" : ", ") + key;
      throw InvalidArgument(fmt::format("{}: unknown key '{}' (expected one of {})", where,
                                        item.key(), list));
    }
  }
}

namespace {

std::string found_text(const nlohmann::json& value) {
  return fmt::format("{} {}", value.type_name(), value.dump());
}

}  // namespace

int64_t get_int(const nlohmann::json& object, const std::string& key, const std::string& where) {
  const auto& value = object.at(key);
  if (value.is_number_integer()) return value.get<int64_t>();
  // TOML integers arrive as integers; allow 64.0 written as a float only when integral.
  if (value.is_number_float() && value.get<double>() == static_cast<int64_t>(value.get<double>()))
    return static_cast<int64_t>(value.get<double>());
  throw InvalidArgument(fmt::format("{}.{}: expected an integer, got {}", where, key,
                                    found_text(value)));
}

double get_number(const nlohmann::json& object, const std::string& key,
                  const std::string& where) {
  const auto& value = object.at(key);
  if (value.is_number()) return value.get<double>();
  throw InvalidArgument(fmt::format("{}.{}: expected a number, got {}", where, key,
                                    found_text(value)));
}

bool get_bool(const nlohmann::json& object, const std::string& key, const std::string& where) {
  const auto& value = object.at(key);
  if (value.is_boolean()) return value.get<bool>();
  throw InvalidArgument(fmt::format("{}.{}: expected true or false, got {}", where, key,
                                    found_text(value)));
}

std::string get_string(const nlohmann::json& object, const std::string& key,
                       const std::string& where) {
  const auto& value = object.at(key);
  if (value.is_string()) return value.get<std::string>();
  throw InvalidArgument(fmt::format("{}.{}: expected a string, got {}", where, key,
                                    found_text(value)));
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

std::vector<std::string> synthetic_keys() {
  return {"generator",        "T",           "S",           "landmarks",    "Hq",
          "Hkv",              "d",           "dv",          "logit_std",    "topic_share",
          "query_topic_share", "depth",      "needle_query", "needle_logit", "retrieval_noise",
          "positional",       "rope_pairing", "rope_theta",  "hope_train_length", "hope_m",
          "seed"};
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
