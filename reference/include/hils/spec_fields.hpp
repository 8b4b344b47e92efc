// The field table of MechanismSpec: one row per field with its key (JSON, TOML, the results'
// spec attribute), its command-line names (the same in every `hils` command), a help line, its
// own range check and when describe() shows it. The JSON codec (experiments/config/spec_codec),
// the command-line flags (experiments/cli/spec_flags), describe() and validate() all loop over
// this table; the enums' names are the tables in hils/spec.hpp. A new field is one row here and
// its uses in the mathematics; a new enum value is one row in spec.hpp.
#pragma once

#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>

#include "hils/spec.hpp"
#include "hils/types.hpp"

namespace hils {

// When describe() shows a field.
enum class Shown {
  always,
  selecting,   // only for mechanisms that select chunks (flat, hierarchical)
  with_prior,  // only when the key rule or bias needs a prior query
  when_set,    // only when true (bool) or nonzero (number)
};

template <class T>
struct SpecField {
  const char* key;    // JSON/TOML key and describe() label
  const char* flags;  // command-line names, CLI11 syntax ("-S,--chunk")
  const char* alias;  // "" or a hidden older spelling that keeps working ("--S")
  const char* help;   // one line; enum fields get their names appended
  T MechanismSpec::*member;
  Shown shown = Shown::always;
  bool (*valid)(const T&) = nullptr;  // this field's own range; nullptr: any value of T
  const char* expected = "";          // what valid() accepts, for the error message
};

inline constexpr auto kSpecFields = std::make_tuple(
    SpecField<std::string>{"name", "--name", "", "name of the mechanism (its results group)",
                           &MechanismSpec::name},
    SpecField<Fusion>{"fusion", "--fusion", "", "how the branches are combined",
                      &MechanismSpec::fusion},
    SpecField<KeyRule>{"key_rule", "--key-rule", "", "how a candidate chunk is scored",
                       &MechanismSpec::key_rule, Shown::selecting},
    SpecField<BiasRule>{"bias_rule", "--bias-rule", "", "bias added to a chunk's score",
                        &MechanismSpec::bias_rule, Shown::selecting},
    SpecField<PriorRule>{"prior_rule", "--prior-rule", "",
                         "where the prior query of the taylor key and entropy bias comes from",
                         &MechanismSpec::prior_rule, Shown::with_prior},
    SpecField<GroupRule>{"group_rule", "--group-rule", "",
                         "how the heads of a KV group agree on one selection",
                         &MechanismSpec::group_rule, Shown::selecting},
    SpecField<bool>{"softmax1", "--softmax1", "",
                    "true/false: an extra zero logit in the hierarchical fusion softmax",
                    &MechanismSpec::softmax1, Shown::when_set},
    SpecField<int64_t>{"S", "-S,--chunk", "--S", "chunk size in slots (counts the landmark)",
                       &MechanismSpec::S, Shown::always,
                       [](const int64_t& v) { return v >= 1; }, "a chunk size of at least 1"},
    SpecField<int64_t>{"W", "-W,--window", "--W", "window size in slots", &MechanismSpec::W,
                       Shown::always, [](const int64_t& v) { return v >= 1; },
                       "a window of at least 1 slot (W <= 0 is not a window)"},
    SpecField<int64_t>{"K", "-K,--top-k", "--K", "retrieved chunks per query",
                       &MechanismSpec::K, Shown::selecting,
                       [](const int64_t& v) { return v >= 0; }, "a chunk count of at least 0"},
    SpecField<bool>{"landmarks", "--landmarks", "",
                    "true/false: the landmark layout (slot (c+1)S-1 of each complete chunk)",
                    &MechanismSpec::landmarks},
    SpecField<double>{"scale", "--scale", "", "logit scale sigma (0 = 1/sqrt(d))",
                      &MechanismSpec::scale, Shown::when_set,
                      [](const double& v) { return std::isfinite(v) && v >= 0.0; },
                      "0 (meaning 1/sqrt(d)) or a finite positive logit scale"});

// Calls visit(field) for every row of kSpecFields, in table order.
template <class Visit>
void for_each_spec_field(Visit&& visit) {
  std::apply([&](const auto&... field) { (visit(field), ...); }, kSpecFields);
}

// True for the spec's enum types (those with a names table in hils/spec.hpp).
template <class T>
inline constexpr bool kIsSpecEnum = std::is_enum_v<T>;

// text -> value of a spec enum, or InvalidArgument "<field>: expected one of a | b, got 'x'".
template <class Enum>
Enum parse_enum(const std::string& text, const std::string& field) {
  if (auto value = enum_from_name<Enum>(text)) return *value;
  throw InvalidArgument(field + ": expected one of " + enum_options<Enum>() + ", got '" + text +
                        "'");
}

// A field's value as describe() and error messages print it.
template <class T>
std::string field_text(const T& value) {
  if constexpr (kIsSpecEnum<T>) {
    return enum_name(value);
  } else if constexpr (std::is_same_v<T, bool>) {
    return value ? "true" : "false";
  } else if constexpr (std::is_same_v<T, std::string>) {
    return value;
  } else {
    std::ostringstream out;
    out << value;
    return out.str();
  }
}

// Throws InvalidArgument naming the first field outside its own range (the table's checks;
// rules between fields are in MechanismSpec::validate, which calls this first).
void validate_fields(const MechanismSpec& spec);

}  // namespace hils
