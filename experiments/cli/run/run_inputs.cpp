// The inputs a mechanism of hils run sees: the file's layout checked against the spec, and the
// positional encoding the plan asks for applied (or not) to the stored vectors.
#include <fmt/format.h>

#include "cli/cli_util.hpp"
#include "cli/commands.hpp"
#include "cli/run/run_plan.hpp"

namespace hils::cli::run_command {

namespace {

// plan, meta -> the encoding to apply: the plan's settings, else the file's RoPE settings.
PositionalEncoding encoding_for(const RunPlan& plan, const io::ActivationMeta& meta) {
  PositionalEncoding pe;
  pe.kind = parse_positional_kind(plan.positional == "auto" ? "rope" : plan.positional,
                                  "positional");
  std::string pairing = plan.rope_pairing.value_or(
      meta.rope_pairing == "none" ? std::string("half") : meta.rope_pairing);
  pe.pairing = parse_rope_pairing(pairing, "rope_pairing");
  pe.theta = plan.rope_theta.value_or(meta.rope_theta > 0 ? meta.rope_theta : 10000.0);
  pe.hope_train_length = plan.hope_train_length;
  pe.hope_m = plan.hope_m;
  return pe;
}

// One row per head: the mean query of the head (the shared prior of landmark-free runs).
std::vector<Matrix<double>> mean_queries(const std::vector<Matrix<double>>& q) {
  std::vector<Matrix<double>> prior;
  for (const auto& m : q) prior.emplace_back(m.colwise().mean());
  return prior;
}

}  // namespace

// spec, meta, input -> nothing, or BadInput saying how the layout and the spec differ.
void check_layout(const MechanismSpec& spec, const io::ActivationMeta& meta,
                  const std::string& input) {
  require_landmark_layout(spec.landmarks, spec.S, meta, input,
                          fmt::format("mechanism '{}'", spec.name));
  if (spec.needs_prior() && spec.selects() && spec.prior_rule == PriorRule::given)
    throw BadInput(fmt::format("mechanism '{}': prior_rule given needs per-chunk prior queries, "
                               "which activation files do not hold; use landmark_query or shared",
                               spec.name));
}

// spec, plan, meta, layer, input -> the mechanism's inputs (prior included where the rule needs one).
AttentionInputs<double> inputs_for(const MechanismSpec& spec, const RunPlan& plan,
                                   const io::ActivationMeta& meta,
                                   const io::LayerActivations& layer, const std::string& input) {
  const bool already = meta.rotated;
  const bool apply = plan.positional == "auto" ? (!already && meta.rope_pairing != "none")
                                               : plan.positional != "nope" || already;
  AttentionInputs<double> raw = layer.inputs;
  if (!apply) {
    if (spec.needs_prior() && spec.prior_rule == PriorRule::shared) raw.prior = mean_queries(raw.q);
    return raw;
  }
  if (already) {
    if (layer.q_unrotated.empty() || layer.k_unrotated.empty())
      throw BadInput(fmt::format("--positional {}: {} holds rotated q/k without q_unrotated and "
                                 "k_unrotated, so no other encoding can be applied",
                                 plan.positional, input));
    if (!raw.q_retrieval.empty())
      throw BadInput(fmt::format("--positional {}: {} holds rotated q_retrieval without an "
                                 "un-rotated copy",
                                 plan.positional, input));
    raw.q = layer.q_unrotated;
    raw.k = layer.k_unrotated;
  }
  if (spec.needs_prior() && spec.prior_rule == PriorRule::shared) raw.prior = mean_queries(raw.q);
  Geometry geometry = geometry_of(spec, meta.T);
  if (geometry.position_ids() != meta.position_ids)
    throw BadInput(fmt::format("{}: position_ids differ from those of the mechanism's layout "
                               "(S={}, landmarks={}); cannot apply an encoding",
                               input, spec.S, spec.landmarks));
  PositionalEncoding pe = encoding_for(plan, meta);
  if (pe.kind == PositionalKind::nope) return raw;
  return apply_positional_encoding(raw, geometry, pe, spec.prior_rule);
}

}  // namespace hils::cli::run_command
