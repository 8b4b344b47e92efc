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

std::vector<std::string> synthetic_keys() {
  return {"generator",        "T",           "S",           "landmarks",    "Hq",
          "Hkv",              "d",           "dv",          "logit_std",    "topic_share",
          "query_topic_share", "depth",      "needle_query", "needle_logit", "retrieval_noise",
          "segment",          "key_noise",   "query_rho",
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
  if (o.contains("segment")) p.segment = get_int(o, "segment", where);
  if (o.contains("key_noise")) p.key_noise = get_number(o, "key_noise", where);
  if (o.contains("query_rho")) p.query_rho = get_number(o, "query_rho", where);
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
