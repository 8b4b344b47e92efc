// One description for every mechanism (reference/SEMANTICS.md §7): presets and Table 5 ablations
// are values of MechanismSpec, never separate code paths.
#pragma once

#include <cstdint>
#include <string>
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

// Presets of reference/SEMANTICS.md §7; the geometry fields keep their defaults (S=64, W=512, K=32)
// and landmarks are on only where the mechanism uses them (lmk, hils).
MechanismSpec preset(const std::string& name);
std::vector<std::string> preset_names();
// The paper's Table 5 ablations as (name, spec) pairs, all on the hils geometry.
std::vector<MechanismSpec> table5_ablations();

std::string to_string(KeyRule);
std::string to_string(BiasRule);
std::string to_string(PriorRule);
std::string to_string(GroupRule);
std::string to_string(Fusion);
// Parsers accept exactly the to_string names; others throw InvalidArgument naming `field`.
KeyRule parse_key_rule(const std::string& text, const std::string& field = "key_rule");
BiasRule parse_bias_rule(const std::string& text, const std::string& field = "bias_rule");
PriorRule parse_prior_rule(const std::string& text, const std::string& field = "prior_rule");
GroupRule parse_group_rule(const std::string& text, const std::string& field = "group_rule");
Fusion parse_fusion(const std::string& text, const std::string& field = "fusion");

// A one-line human-readable description, e.g. "hils: taylor+entropy prior=landmark_query ...".
std::string describe(const MechanismSpec& spec);

}  // namespace hils
