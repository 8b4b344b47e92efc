// Whether a chunk summary reads the prior query mu_c (reference/SEMANTICS.md §3): the taylor
// key k'_c = sum p_j k_j and the entropy bias b'_c = H(p) both use p = softmax(sigma mu_c.k_j),
// whatever the other rule is. One decision for the spec, the forward and the backward stages.
// Internal (not installed; spec.hpp's MechanismSpec::needs_prior is the public form).
#pragma once

#include "hils/spec.hpp"

namespace hils::detail {

inline bool summary_needs_prior(KeyRule key_rule, BiasRule bias_rule) {
  return key_rule == KeyRule::taylor || bias_rule == BiasRule::entropy;
}

}  // namespace hils::detail
