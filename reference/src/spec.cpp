#include "hils/spec.hpp"

#include <sstream>

#include "hils/spec_fields.hpp"
#include "hils/types.hpp"
#include "summary_prior.hpp"

namespace hils {
namespace {

// A row of kPresets as a spec (its other fields at MechanismSpec's defaults).
MechanismSpec make(const PresetRow& row) {
  MechanismSpec spec;
  spec.name = row.name;
  spec.fusion = row.fusion;
  spec.key_rule = row.key_rule;
  spec.bias_rule = row.bias_rule;
  spec.prior_rule = PriorRule::landmark_query;
  spec.landmarks = row.landmarks;
  return spec;
}

}  // namespace

bool MechanismSpec::needs_prior() const {
  return selects() && detail::summary_needs_prior(key_rule, bias_rule);
}

void validate_fields(const MechanismSpec& spec) {
  for_each_spec_field([&](const auto& field) {
    if (field.valid == nullptr) return;
    const auto& value = spec.*field.member;
    require(field.valid(value), field.key, field.expected, field_text(value));
  });
}

void MechanismSpec::validate() const {
  validate_fields(*this);
  require(!landmarks || S >= 2, "S", "at least 2 when landmarks are on", std::to_string(S));
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
  for (const auto& row : kPresets)
    if (name == row.name) return make(row);
  throw InvalidArgument("preset: expected one of " + preset_options() + ", got '" + name + "'");
}

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const auto& row : kPresets) names.emplace_back(row.name);
  return names;
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

std::string to_string(KeyRule v) { return enum_name(v); }
std::string to_string(BiasRule v) { return enum_name(v); }
std::string to_string(PriorRule v) { return enum_name(v); }
std::string to_string(GroupRule v) { return enum_name(v); }
std::string to_string(Fusion v) { return enum_name(v); }

KeyRule parse_key_rule(const std::string& t, const std::string& f) {
  return parse_enum<KeyRule>(t, f);
}
BiasRule parse_bias_rule(const std::string& t, const std::string& f) {
  return parse_enum<BiasRule>(t, f);
}
PriorRule parse_prior_rule(const std::string& t, const std::string& f) {
  return parse_enum<PriorRule>(t, f);
}
GroupRule parse_group_rule(const std::string& t, const std::string& f) {
  return parse_enum<GroupRule>(t, f);
}
Fusion parse_fusion(const std::string& t, const std::string& f) {
  return parse_enum<Fusion>(t, f);
}

// "name: key=value ..." over the field table, each field shown where it applies (Shown).
std::string describe(const MechanismSpec& spec) {
  std::ostringstream out;
  out << spec.name << ":";
  for_each_spec_field([&](const auto& field) {
    using T = std::decay_t<decltype(spec.*field.member)>;
    const T& value = spec.*field.member;
    if constexpr (std::is_same_v<T, std::string>) {
      return;  // the name leads the line
    } else {
      switch (field.shown) {
        case Shown::always: break;
        case Shown::selecting: if (!spec.selects()) return; break;
        case Shown::with_prior: if (!spec.needs_prior()) return; break;
        case Shown::when_set: if (value == T{}) return; break;
      }
      if constexpr (std::is_same_v<T, bool>) {
        if (field.shown == Shown::when_set) {  // a switch that is on: its name says it
          out << " " << field.key;
          return;
        }
      }
      out << " " << field.key << "=" << field_text(value);
    }
  });
  return out.str();
}

}  // namespace hils
