// Helpers shared by the reference tests: relative errors that respect -inf masks, scalar casts.
#pragma once

#include <cmath>
#include <limits>
#include <string>

#include "case_inputs.hpp"

namespace hils::testing {

// Relative error ||a - b|| / min(||a||, ||b||) over entries finite in both (Eigen's meaning of
// "approximately equal"); returns +inf when the -inf patterns differ. Empty tensors give 0.
template <class A, class B>
double relative_error(const A& a, const B& b) {
  if (a.rows() != b.rows() || a.cols() != b.cols()) return std::numeric_limits<double>::infinity();
  long double diff = 0, na = 0, nb = 0;
  for (int64_t i = 0; i < a.rows(); ++i)
    for (int64_t j = 0; j < a.cols(); ++j) {
      const long double x = static_cast<long double>(a(i, j)), y = static_cast<long double>(b(i, j));
      if (std::isinf(x) || std::isinf(y)) {
        if (x != y) return std::numeric_limits<double>::infinity();
        continue;
      }
      diff += (x - y) * (x - y);
      na += x * x;
      nb += y * y;
    }
  if (diff == 0) return 0.0;
  return static_cast<double>(std::sqrt(diff) / std::sqrt(std::min(na, nb)));
}

// Maximum |a - b| over entries finite in both.
template <class A, class B>
double max_abs_difference(const A& a, const B& b) {
  double worst = 0;
  for (int64_t i = 0; i < a.rows(); ++i)
    for (int64_t j = 0; j < a.cols(); ++j) {
      const double x = static_cast<double>(a(i, j)), y = static_cast<double>(b(i, j));
      if (std::isinf(x) || std::isinf(y)) continue;
      worst = std::max(worst, std::abs(x - y));
    }
  return worst;
}

// Every spec the property tests sweep: the presets plus the Table 5 ablations, and every key rule
// under hierarchical fusion (cases::with_every_key_rule; today the ablations have them all).
inline std::vector<MechanismSpec> all_specs() {
  std::vector<MechanismSpec> specs;
  for (const auto& name : preset_names()) specs.push_back(preset(name));
  for (const auto& spec : table5_ablations()) specs.push_back(spec);
  MechanismSpec nsa_rule = preset("hils");
  nsa_rule.name = "hils_nsa_group_rule";
  nsa_rule.group_rule = GroupRule::sum_probabilities;
  nsa_rule.softmax1 = true;
  specs.push_back(nsa_rule);
  return cases::with_every_key_rule(specs, /*fused=*/true);
}

// The spec on the case's geometry, or nullopt when that combination is invalid (e.g. lmk on a
// case without landmarks).
inline std::optional<MechanismSpec> spec_for_case(const MechanismSpec& base, const cases::Case& c) {
  // Mechanisms built on landmark slots skip cases without them; the others take the case's
  // layout (with_case_geometry copies it).
  if (base.landmarks && !c.landmarks) return std::nullopt;
  MechanismSpec spec = cases::with_case_geometry(base, c);
  try {
    spec.validate();
  } catch (const InvalidArgument&) {
    return std::nullopt;
  }
  return spec;
}

}  // namespace hils::testing
