// One description for every mechanism (reference/SEMANTICS.md §7): presets and Table 5 ablations
// are values of MechanismSpec, never separate code paths.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace hils {

// How a candidate chunk is scored (reference/SEMANTICS.md §3).
enum class KeyRule {
  exact,         // s_hat = L(t,c), the true chunk log-mass (naive BSA)
  mean,          // k'_c = mean key of T_c (NSA-style, Eq. 6)
  landmark_key,  // k'_c = key at the landmark slot (LMK)
  taylor,        // k'_c = sum_j p_j k_j, p = softmax(sigma mu_c . k_j) (HiLS, Prop. 3.1)
};
enum class BiasRule { none, entropy };  // b'_c = 0, or H(p) with the prior's p
// Where the prior query mu_c of the taylor key and the entropy bias comes from.
enum class PriorRule {
  landmark_query,  // retrieval query q~ at the landmark slot of chunk c (needs landmarks)
  shared,          // a per-query-head vector: inputs.prior[h] has 1 row (or n_chunks rows once
                   // positioned by apply_positional_encoding)
  given,           // inputs.prior[h] has one row per complete chunk
};
// How heads of a KV group agree on one selection (reference/SEMANTICS.md §4).
enum class GroupRule {
  max_normalized,     // max_h (s_hat - log Z_hat): the authors' code, our default
  sum_probabilities,  // sum_h exp(s_hat - log Z_hat): the NSA paper's rule
  max_raw,            // max_h s_hat: the paper's Appendix C as written
};
enum class Fusion {
  full,          // flat softmax over every attendable j <= t
  window,        // sliding-window attention only (o_swa)
  flat,          // one softmax over A(t) and the selected chunks' tokens (Eq. 3)
  hierarchical,  // softmax over [s_hat of selected chunks, lse_swa (, 0)] (Eq. 10)
};

struct MechanismSpec {
  std::string name = "custom";
  Fusion fusion = Fusion::hierarchical;
  KeyRule key_rule = KeyRule::taylor;
  BiasRule bias_rule = BiasRule::entropy;
  PriorRule prior_rule = PriorRule::landmark_query;
  GroupRule group_rule = GroupRule::max_normalized;
  bool softmax1 = false;  // hierarchical only: an extra zero logit in the fusion softmax
  int64_t S = 64;         // chunk size in slots (counts the landmark)
  int64_t W = 512;        // window size in slots
  int64_t K = 32;         // retrieved chunks
  bool landmarks = true;  // the HiLS layout: slot (c+1)S-1 of each complete chunk
  double scale = 0.0;     // logit scale sigma; 0 means 1/sqrt(d)

  // True for mechanisms that select chunks (flat or hierarchical fusion).
  bool selects() const { return fusion == Fusion::flat || fusion == Fusion::hierarchical; }
  // True when the key rule needs a prior query (taylor key or entropy bias).
  bool needs_prior() const;
  // Throws InvalidArgument naming the first field that makes no sense.
  void validate() const;
};

// Presets of reference/SEMANTICS.md §7 (the rows of kPresets, below); the geometry fields keep
// their defaults (S=64, W=512, K=32) and landmarks are on only where the mechanism uses them
// (lmk, hils). An unknown name throws InvalidArgument listing the table's names.
MechanismSpec preset(const std::string& name);
std::vector<std::string> preset_names();  // kPresets' names, in table order
// The paper's Table 5 ablations as (name, spec) pairs, all on the hils geometry.
std::vector<MechanismSpec> table5_ablations();

// ---- Enum names --------------------------------------------------------------------------
// The one list of each enum's names, in integer order (checked below): to_string, the parsers,
// the JSON codec, the command-line help, describe, the GPU C API (hils_gpu_enum_names) and the
// Python ctypes wrapper all read it. Adding a value means adding its row here, nothing else in
// the plumbing. Header-only and C++17: the CUDA code (nvcc, no reference library) uses it.
template <class Enum>
struct EnumName {
  Enum value;
  const char* name;
};
inline constexpr std::array<EnumName<KeyRule>, 4> kKeyRuleNames{{
    {KeyRule::exact, "exact"},
    {KeyRule::mean, "mean"},
    {KeyRule::landmark_key, "landmark_key"},
    {KeyRule::taylor, "taylor"},
}};
inline constexpr std::array<EnumName<BiasRule>, 2> kBiasRuleNames{{
    {BiasRule::none, "none"},
    {BiasRule::entropy, "entropy"},
}};
inline constexpr std::array<EnumName<PriorRule>, 3> kPriorRuleNames{{
    {PriorRule::landmark_query, "landmark_query"},
    {PriorRule::shared, "shared"},
    {PriorRule::given, "given"},
}};
inline constexpr std::array<EnumName<GroupRule>, 3> kGroupRuleNames{{
    {GroupRule::max_normalized, "max_normalized"},
    {GroupRule::sum_probabilities, "sum_probabilities"},
    {GroupRule::max_raw, "max_raw"},
}};
inline constexpr std::array<EnumName<Fusion>, 4> kFusionNames{{
    {Fusion::full, "full"},
    {Fusion::window, "window"},
    {Fusion::flat, "flat"},
    {Fusion::hierarchical, "hierarchical"},
}};
// enum_names(Enum{}) -> that enum's table (overloads, so that generic code can ask by type).
constexpr const auto& enum_names(KeyRule) { return kKeyRuleNames; }
constexpr const auto& enum_names(BiasRule) { return kBiasRuleNames; }
constexpr const auto& enum_names(PriorRule) { return kPriorRuleNames; }
constexpr const auto& enum_names(GroupRule) { return kGroupRuleNames; }
constexpr const auto& enum_names(Fusion) { return kFusionNames; }

// True when row i holds the value with integer i: the C API passes enums as these integers.
template <class Enum, size_t N>
constexpr bool in_integer_order(const std::array<EnumName<Enum>, N>& names) {
  for (size_t i = 0; i < N; ++i)
    if (static_cast<size_t>(names[i].value) != i) return false;
  return true;
}
static_assert(in_integer_order(kKeyRuleNames) && in_integer_order(kBiasRuleNames) &&
              in_integer_order(kPriorRuleNames) && in_integer_order(kGroupRuleNames) &&
              in_integer_order(kFusionNames),
              "enum name tables must list the values in integer order");

// value -> its name ("?" for a value outside the table).
template <class Enum>
const char* enum_name(Enum value) {
  for (const auto& entry : enum_names(Enum{}))
    if (entry.value == value) return entry.name;
  return "?";
}
// name -> value, or nothing when the name is not in the table.
template <class Enum>
std::optional<Enum> enum_from_name(std::string_view name) {
  for (const auto& entry : enum_names(Enum{}))
    if (name == entry.name) return entry.value;
  return std::nullopt;
}
// integer -> value, or nothing when no value has that integer (the C API's input).
template <class Enum>
std::optional<Enum> enum_from_int(long long value) {
  const auto& names = enum_names(Enum{});
  if (value < 0 || value >= static_cast<long long>(names.size())) return std::nullopt;
  return names[static_cast<size_t>(value)].value;
}
// "a | b | c" (with the given separator): the names in integer order.
template <class Enum>
std::string enum_options(const char* separator = " | ") {
  std::string options;
  for (const auto& entry : enum_names(Enum{}))
    options += (options.empty() ? "" : separator) + std::string(entry.name);
  return options;
}

// ---- Presets -----------------------------------------------------------------------------
// The one list of presets (reference/SEMANTICS.md §7): preset(), preset_names(), the command
// line's help and messages (preset_options), the studies' --mechanisms, the JSON codec's
// "preset" key (hils run's TOML, hils verify, the Python package) and the tests' spec lists all
// read it; hils.gpu's copy in Python is checked against it (tests/python/test_gpu_module.py).
// Adding a preset means adding its row here. Every other field keeps MechanismSpec's default
// (prior_rule landmark_query).
struct PresetRow {
  const char* name;
  Fusion fusion;
  KeyRule key_rule;
  BiasRule bias_rule;
  bool landmarks;
};
inline constexpr std::array<PresetRow, 6> kPresets{{
    {"full", Fusion::full, KeyRule::exact, BiasRule::none, false},
    {"swa", Fusion::window, KeyRule::exact, BiasRule::none, false},
    {"naive_bsa", Fusion::flat, KeyRule::exact, BiasRule::none, false},
    {"nsa", Fusion::flat, KeyRule::mean, BiasRule::none, false},
    {"lmk", Fusion::hierarchical, KeyRule::landmark_key, BiasRule::none, true},
    {"hils", Fusion::hierarchical, KeyRule::taylor, BiasRule::entropy, true},
}};
// "full | swa | ..." (with the given separator): the presets' names in table order.
inline std::string preset_options(const char* separator = " | ") {
  std::string options;
  for (const auto& row : kPresets)
    options += (options.empty() ? "" : separator) + std::string(row.name);
  return options;
}

std::string to_string(KeyRule);
std::string to_string(BiasRule);
std::string to_string(PriorRule);
std::string to_string(GroupRule);
std::string to_string(Fusion);
// Parsers accept exactly the to_string names; others throw InvalidArgument naming `field`
// (generic form: parse_enum<Enum> in hils/spec_fields.hpp).
KeyRule parse_key_rule(const std::string& text, const std::string& field = "key_rule");
BiasRule parse_bias_rule(const std::string& text, const std::string& field = "bias_rule");
PriorRule parse_prior_rule(const std::string& text, const std::string& field = "prior_rule");
GroupRule parse_group_rule(const std::string& text, const std::string& field = "group_rule");
Fusion parse_fusion(const std::string& text, const std::string& field = "fusion");

// A one-line human-readable description, e.g. "hils: taylor+entropy prior=landmark_query ...".
std::string describe(const MechanismSpec& spec);

}  // namespace hils
