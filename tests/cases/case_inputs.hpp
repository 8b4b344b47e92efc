// Random inputs for a case of the table, in any scalar type, from the case's seed.
#pragma once

#include <random>
#include <string>
#include <vector>

#include "case_table.hpp"
#include "hils/hils.hpp"

namespace hils::cases {

// Gaussian q (times the case's gain), k, v, and a distinct retrieval query; draws are made in
// double and rounded to Scalar, so every scalar type sees the same values.
template <class Scalar>
AttentionInputs<Scalar> make_inputs(const Case& c, uint64_t salt = 0) {
  std::mt19937_64 rng(seed_of(c.name) ^ salt);
  std::normal_distribution<double> gauss(0.0, 1.0);
  auto draw = [&](int64_t rows, int64_t cols, double gain) {
    Matrix<Scalar> m(rows, cols);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) m(i, j) = static_cast<Scalar>(gain * gauss(rng));
    return m;
  };
  AttentionInputs<Scalar> in;
  for (int64_t h = 0; h < c.Hq; ++h) in.q.push_back(draw(c.T, c.d, c.query_gain));
  for (int64_t g = 0; g < c.Hkv; ++g) in.k.push_back(draw(c.T, c.d, 1.0));
  for (int64_t g = 0; g < c.Hkv; ++g) in.v.push_back(draw(c.T, c.dv, 1.0));
  for (int64_t h = 0; h < c.Hq; ++h)
    in.q_retrieval.push_back(in.q[h] + draw(c.T, c.d, 0.3 * c.query_gain));
  for (int64_t h = 0; h < c.Hq; ++h) in.prior.push_back(draw(1, c.d, c.query_gain));
  return in;
}

// The case's geometry applied to a preset or ablation spec.
inline MechanismSpec with_case_geometry(MechanismSpec spec, const Case& c) {
  spec.S = c.S;
  spec.W = c.W;
  spec.K = c.K;
  spec.landmarks = c.landmarks;
  return spec;
}

// `specs` plus, for every key rule with a summary (kKeyRuleNames, hils/spec.hpp) that no spec of
// the list uses, the hils preset with that key rule, so that the tests sweep a new key rule
// without a preset of its own. With `fused`, only a spec of hierarchical fusion counts: there a
// summary's score is a fusion logit (reference/SEMANTICS.md §5), the only way its gradient
// reaches the inputs (§6); flat fusion uses it for the selection alone.
inline std::vector<MechanismSpec> with_every_key_rule(std::vector<MechanismSpec> specs,
                                                      bool fused) {
  for (const auto& rule : kKeyRuleNames) {
    if (rule.value == KeyRule::exact) continue;  // no summary
    bool covered = false;
    for (const auto& spec : specs)
      covered = covered || (spec.key_rule == rule.value &&
                            (!fused || spec.fusion == Fusion::hierarchical));
    if (covered) continue;
    MechanismSpec spec = preset("hils");
    spec.name = std::string("hils_") + rule.name + "_key";
    spec.key_rule = rule.value;
    specs.push_back(spec);
  }
  return specs;
}

}  // namespace hils::cases
