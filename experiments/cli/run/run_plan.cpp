// hils run's settings: the [run] table or flags (apply_run_settings), the mechanisms from
// [[mechanism]] tables, presets and spec flags (make_plan), and the plan as the results file
// records it (plan_json).
#include <cmath>

#include <fmt/format.h>

#include "cli/commands.hpp"
#include "cli/run/run_plan.hpp"
#include "config/config.hpp"

namespace hils::cli::run_command {

namespace {

// plan, o ([run] table or flags), where -> plan with each setting given in o, checked.
void apply_run_settings(RunPlan& plan, const nlohmann::json& o, const std::string& where) {
  if (o.contains("layers")) {
    require(o["layers"].is_array(), where + ".layers", "an array of layer indices",
            o["layers"].dump());
    plan.layers.clear();
    for (const auto& layer : o["layers"]) {
      require(layer.is_number_integer(), where + ".layers", "integer layer indices",
              layer.dump());
      plan.layers.push_back(layer.get<int64_t>());
    }
  }
  if (o.contains("positional")) plan.positional = config::get_string(o, "positional", where);
  if (o.contains("rope_pairing")) plan.rope_pairing = config::get_string(o, "rope_pairing", where);
  if (o.contains("rope_theta")) plan.rope_theta = config::get_number(o, "rope_theta", where);
  if (o.contains("hope_train_length"))
    plan.hope_train_length = config::get_number(o, "hope_train_length", where);
  if (o.contains("hope_m")) plan.hope_m = config::get_number(o, "hope_m", where);
  if (o.contains("last_queries")) plan.last_queries = config::get_int(o, "last_queries", where);
  if (o.contains("keep_scores")) plan.keep_scores = config::get_bool(o, "keep_scores", where);
  if (o.contains("keep_window")) plan.keep_window = config::get_bool(o, "keep_window", where);
  if (o.contains("seed")) plan.seed = config::get_int(o, "seed", where);
  require(plan.positional == "auto" || plan.positional == "nope" || plan.positional == "rope" ||
              plan.positional == "hope",
          where + ".positional", "auto | nope | rope | hope", plan.positional);
  if (plan.rope_pairing) parse_rope_pairing(*plan.rope_pairing, where + ".rope_pairing");
  if (plan.rope_theta)
    require(std::isfinite(*plan.rope_theta) && *plan.rope_theta > 1.0, where + ".rope_theta",
            "a finite RoPE base greater than 1", std::to_string(*plan.rope_theta));
  require(std::isfinite(plan.hope_train_length) && plan.hope_train_length > 0.0,
          where + ".hope_train_length", "a finite, positive training length",
          std::to_string(plan.hope_train_length));
  require(std::isfinite(plan.hope_m) && plan.hope_m > 0.0, where + ".hope_m",
          "a finite, positive period multiplier", std::to_string(plan.hope_m));
  require(plan.last_queries >= 0, where + ".last_queries", ">= 0 (0 = every query)",
          std::to_string(plan.last_queries));
}

// text -> whether it is valid UTF-8 (unit names go into the complete_units JSON attribute).
bool is_utf8(const std::string& text) {
  try {
    (void)nlohmann::json(text).dump();
    return true;
  } catch (const nlohmann::json::type_error&) {
    return false;
  }
}

}  // namespace

// flags -> the plan: TOML first, flags over it.
RunPlan make_plan(const RunFlags& f) {
  RunPlan plan;
  nlohmann::json toml = nlohmann::json::object();
  if (!f.config.empty()) {
    toml = config::load_toml(f.config, config::run_schema());
    if (toml.contains("run")) apply_run_settings(plan, toml["run"], f.config + ": [run]");
    if (toml.contains("mechanism")) {
      for (size_t i = 0; i < toml["mechanism"].size(); ++i)
        plan.mechanisms.push_back(config::spec_from_json(
            toml["mechanism"][i], fmt::format("{}: [[mechanism]] #{}", f.config, i + 1)));
    }
  }
  apply_run_settings(plan, f.run, "flags");
  if (!f.layers.empty()) plan.layers = f.layers;
  for (const auto& name : f.presets) plan.mechanisms.push_back(preset(name));
  nlohmann::json overrides = f.spec;
  if (plan.mechanisms.empty()) {
    if (overrides.empty())
      throw BadInput("no mechanism to run: give --preset NAME (one of " + preset_options(", ") +
                     "), spec flags (--fusion, --key-rule, ...), or [[mechanism]] tables in "
                     "--config");
    plan.mechanisms.push_back(MechanismSpec{});
  }
  const nlohmann::json tables = toml.value("mechanism", nlohmann::json::array());
  for (size_t i = 0; i < plan.mechanisms.size(); ++i) {
    MechanismSpec& spec = plan.mechanisms[i];
    config::apply_spec_overrides(spec, overrides, "flags");
    // Mechanisms from [[mechanism]] tables come first; presets after them.
    const bool from_file = i < tables.size();
    config::check_naming_file([&] { spec.validate(); }, from_file ? tables[i] : nlohmann::json(),
                              overrides, fmt::format("{}: [[mechanism]] #{}", f.config, i + 1));
  }
  for (const auto& spec : plan.mechanisms)  // the name is one group of the results file
    if (spec.name.empty() || spec.name == "." || spec.name == ".." ||
        spec.name.find('/') != std::string::npos || !is_utf8(spec.name))
      throw BadInput(fmt::format("mechanism name: expected a results group name (UTF-8, not "
                                 "empty, no '/', not . or ..), got '{}'",
                                 spec.name));
  for (size_t i = 0; i < plan.mechanisms.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (plan.mechanisms[i].name == plan.mechanisms[j].name)
        throw BadInput(fmt::format(
            "mechanism names must be unique (they name the result groups): '{}' appears twice; "
            "give one a name (--name or name = \"...\")",
            plan.mechanisms[i].name));
  return plan;
}

// plan, input, T -> the results file's "config" attribute.
nlohmann::json plan_json(const RunPlan& plan, const std::string& input, int64_t T) {
  nlohmann::json mechanisms = nlohmann::json::array();
  for (const auto& spec : plan.mechanisms) mechanisms.push_back(config::spec_to_json(spec));
  std::error_code ec;
  auto absolute = std::filesystem::weakly_canonical(input, ec);
  return {{"input", ec ? input : absolute.string()},
          {"T", T},
          {"layers", plan.layers},
          {"positional", plan.positional},
          {"rope_pairing", plan.rope_pairing ? nlohmann::json(*plan.rope_pairing) : nullptr},
          {"rope_theta", plan.rope_theta ? nlohmann::json(*plan.rope_theta) : nullptr},
          {"hope_train_length", plan.hope_train_length},
          {"hope_m", plan.hope_m},
          {"last_queries", plan.last_queries},
          {"keep_scores", plan.keep_scores},
          {"keep_window", plan.keep_window},
          {"mechanisms", mechanisms}};
}

}  // namespace hils::cli::run_command
