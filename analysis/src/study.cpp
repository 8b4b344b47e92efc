#include "hils/analysis/study.hpp"

namespace hils::analysis {

StudyMechanism study_mechanism(const std::string& name, PriorRule prior_rule) {
  StudyMechanism m;
  m.name = name;
  if (name == "max_logit") {
    m.max_logit = true;
    m.spec = preset("naive_bsa");
    m.spec.name = name;
    return m;
  }
  if (name == "mean") {
    m.spec = preset("nsa");
  } else if (name == "landmark_key") {
    m.spec = preset("lmk");
  } else if (name == "taylor" || name == "taylor_entropy") {
    m.spec = preset("hils");
    if (name == "taylor") m.spec.bias_rule = BiasRule::none;
  } else if (auto plus = name.find('+'); plus != std::string::npos) {
    m.spec = preset("hils");
    m.spec.key_rule = parse_key_rule(name.substr(0, plus), "mechanism '" + name + "' key rule");
    m.spec.bias_rule =
        parse_bias_rule(name.substr(plus + 1), "mechanism '" + name + "' bias rule");
  } else {
    try {
      m.spec = preset(name);
    } catch (const InvalidArgument&) {
      throw InvalidArgument("mechanism: a preset, mean, landmark_key, taylor, taylor_entropy, "
                            "max_logit or <key>+<bias>, got '" + name + "'");
    }
  }
  m.spec.name = name;
  if (m.spec.prior_rule == PriorRule::landmark_query || m.spec.needs_prior())
    m.spec.prior_rule = prior_rule;
  return m;
}

std::vector<std::string> default_mechanism_names(bool landmarks) {
  std::vector<std::string> names{"mean"};
  if (landmarks) names.push_back("landmark_key");
  for (const char* n : {"taylor", "taylor_entropy", "max_logit", "naive_bsa"}) names.push_back(n);
  return names;
}

MechanismSpec with_geometry(MechanismSpec spec, const StudyGeometry& geometry) {
  spec.S = geometry.S;
  spec.W = geometry.W;
  spec.K = geometry.K;
  spec.landmarks = geometry.landmarks;
  spec.group_rule = geometry.group_rule;
  spec.scale = geometry.scale;
  return spec;
}

std::string unit_path(int64_t T, int64_t layer, int64_t group) {
  return layer_input(T, layer) + "/group" + std::to_string(group);
}

std::string layer_input(int64_t T, int64_t layer) {
  return std::string("T") + std::to_string(T) + "/layer" + std::to_string(layer);
}

}  // namespace hils::analysis
