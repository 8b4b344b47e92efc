#include "hils/spec.hpp"

#include <array>
#include <cmath>
#include <sstream>
#include <utility>

#include "hils/types.hpp"

namespace hils {
namespace {

template <class Enum, size_t N>
std::string name_of(Enum value, const std::array<std::pair<Enum, const char*>, N>& names) {
  for (const auto& [e, text] : names)
    if (e == value) return text;
  return "?";
}

template <class Enum, size_t N>
Enum parse_enum(const std::string& text, const std::string& field,
                const std::array<std::pair<Enum, const char*>, N>& names) {
  std::string options;
  for (const auto& [e, name] : names) {
    if (text == name) return e;
    options += (options.empty() ? "" : " | ") + std::string(name);
  }
  throw InvalidArgument(field + ": expected one of " + options + ", got '" + text + "'");
}

constexpr std::array<std::pair<KeyRule, const char*>, 4> kKeyRuleNames{{
    {KeyRule::exact, "exact"},
    {KeyRule::mean, "mean"},
    {KeyRule::landmark_key, "landmark_key"},
    {KeyRule::taylor, "taylor"},
}};
constexpr std::array<std::pair<BiasRule, const char*>, 2> kBiasRuleNames{{
    {BiasRule::none, "none"},
    {BiasRule::entropy, "entropy"},
}};
constexpr std::array<std::pair<PriorRule, const char*>, 3> kPriorRuleNames{{
    {PriorRule::landmark_query, "landmark_query"},
    {PriorRule::shared, "shared"},
    {PriorRule::given, "given"},
}};
constexpr std::array<std::pair<GroupRule, const char*>, 3> kGroupRuleNames{{
    {GroupRule::max_normalized, "max_normalized"},
    {GroupRule::sum_probabilities, "sum_probabilities"},
    {GroupRule::max_raw, "max_raw"},
}};
constexpr std::array<std::pair<Fusion, const char*>, 4> kFusionNames{{
    {Fusion::full, "full"},
    {Fusion::window, "window"},
    {Fusion::flat, "flat"},
    {Fusion::hierarchical, "hierarchical"},
}};

MechanismSpec make(std::string name, Fusion fusion, KeyRule key, BiasRule bias, bool landmarks) {
  MechanismSpec spec;
  spec.name = std::move(name);
  spec.fusion = fusion;
  spec.key_rule = key;
  spec.bias_rule = bias;
  spec.prior_rule = PriorRule::landmark_query;
  spec.landmarks = landmarks;
  return spec;
}

}  // namespace

bool MechanismSpec::needs_prior() const {
  return selects() && (key_rule == KeyRule::taylor || bias_rule == BiasRule::entropy);
}

void MechanismSpec::validate() const {
  require(S >= 1, "S", "a chunk size of at least 1", std::to_string(S));
  require(W >= 1, "W", "a window of at least 1 slot (W <= 0 is not a window)", std::to_string(W));
  require(K >= 0, "K", "a chunk count of at least 0", std::to_string(K));
  require(!landmarks || S >= 2, "S", "at least 2 when landmarks are on", std::to_string(S));
  require(std::isfinite(scale) && scale >= 0.0, "scale",
          "0 (meaning 1/sqrt(d)) or a finite positive logit scale", std::to_string(scale));
  if (!selects()) return;
  require(key_rule != KeyRule::landmark_key || landmarks, "key_rule",
          "landmarks on for the landmark_key rule", "landmarks off");
  require(!needs_prior() || prior_rule != PriorRule::landmark_query || landmarks, "prior_rule",
          "shared or given when landmarks are off (the landmark_query prior needs landmarks)",
          "landmark_query");
  require(key_rule != KeyRule::exact || bias_rule == BiasRule::none, "bias_rule",
          "none with the exact key rule (the exact chunk mass has no bias)", to_string(bias_rule));
  require(!softmax1 || fusion == Fusion::hierarchical, "softmax1",
          "false unless fusion is hierarchical", "true with fusion " + to_string(fusion));
}

MechanismSpec preset(const std::string& name) {
  if (name == "full") return make(name, Fusion::full, KeyRule::exact, BiasRule::none, false);
  if (name == "swa") return make(name, Fusion::window, KeyRule::exact, BiasRule::none, false);
  if (name == "naive_bsa") return make(name, Fusion::flat, KeyRule::exact, BiasRule::none, false);
  if (name == "nsa") return make(name, Fusion::flat, KeyRule::mean, BiasRule::none, false);
  if (name == "lmk")
    return make(name, Fusion::hierarchical, KeyRule::landmark_key, BiasRule::none, true);
  if (name == "hils")
    return make(name, Fusion::hierarchical, KeyRule::taylor, BiasRule::entropy, true);
  std::string options;
  for (const auto& n : preset_names()) options += (options.empty() ? "" : " | ") + n;
  throw InvalidArgument("preset: expected one of " + options + ", got '" + name + "'");
}

std::vector<std::string> preset_names() {
  return {"full", "swa", "naive_bsa", "nsa", "lmk", "hils"};
}

std::vector<MechanismSpec> table5_ablations() {
  // Q-Cal variants change q~ (an input), not the spec; they run as hils with or without
  // inputs.q_retrieval. The summarization variants below are the spec-level rows of Table 5.
  MechanismSpec hils_spec = preset("hils");
  MechanismSpec no_prop = hils_spec;  // "w/o Prop. 3.1": raw landmark key, keep the bias
  no_prop.name = "hils_landmark_key_entropy";
  no_prop.key_rule = KeyRule::landmark_key;
  MechanismSpec lmk = preset("lmk");  // "LMK-Attn": landmark key, no bias, no calibration
  lmk.name = "lmk_attn";
  MechanismSpec mean_pool = hils_spec;  // "w/ mean pooling": mean key, entropy bias kept
  mean_pool.name = "hils_mean_pooling";
  mean_pool.key_rule = KeyRule::mean;
  MechanismSpec shared = hils_spec;  // "w/o lmk, shared q_c"
  shared.name = "hils_no_landmark_shared_prior";
  shared.landmarks = false;
  shared.prior_rule = PriorRule::shared;
  MechanismSpec flat_taylor = hils_spec;  // HiLS summaries with NSA-style flat fusion
  flat_taylor.name = "hils_flat_fusion";
  flat_taylor.fusion = Fusion::flat;
  return {hils_spec, no_prop, lmk, mean_pool, shared, flat_taylor};
}

std::string to_string(KeyRule v) { return name_of(v, kKeyRuleNames); }
std::string to_string(BiasRule v) { return name_of(v, kBiasRuleNames); }
std::string to_string(PriorRule v) { return name_of(v, kPriorRuleNames); }
std::string to_string(GroupRule v) { return name_of(v, kGroupRuleNames); }
std::string to_string(Fusion v) { return name_of(v, kFusionNames); }

KeyRule parse_key_rule(const std::string& t, const std::string& f) {
  return parse_enum(t, f, kKeyRuleNames);
}
BiasRule parse_bias_rule(const std::string& t, const std::string& f) {
  return parse_enum(t, f, kBiasRuleNames);
}
PriorRule parse_prior_rule(const std::string& t, const std::string& f) {
  return parse_enum(t, f, kPriorRuleNames);
}
GroupRule parse_group_rule(const std::string& t, const std::string& f) {
  return parse_enum(t, f, kGroupRuleNames);
}
Fusion parse_fusion(const std::string& t, const std::string& f) {
  return parse_enum(t, f, kFusionNames);
}

std::string describe(const MechanismSpec& spec) {
  std::ostringstream out;
  out << spec.name << ": fusion=" << to_string(spec.fusion);
  if (spec.selects()) {
    out << " key=" << to_string(spec.key_rule) << " bias=" << to_string(spec.bias_rule);
    if (spec.needs_prior()) out << " prior=" << to_string(spec.prior_rule);
    out << " group=" << to_string(spec.group_rule) << " K=" << spec.K;
    if (spec.softmax1) out << " softmax1";
  }
  out << " S=" << spec.S << " W=" << spec.W << " landmarks=" << (spec.landmarks ? "on" : "off");
  return out.str();
}

}  // namespace hils
