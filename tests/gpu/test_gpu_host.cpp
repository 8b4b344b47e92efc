// Host checks of the GPU library that need no device (so no `gpu` label: the CPU suite runs
// them). The key rules: every rule of hils/spec.hpp's table is either in the GPU's one list
// (gpu/src/key_rules.hpp, which summarize_kernels.cu's dispatch reads) or refused before any
// launch, naming key_rule and the rules the GPU implements (README "Adding a mechanism").
#include <catch2/catch.hpp>

#include <stdexcept>
#include <string>

#include "hils/gpu/attention.hpp"
#include "key_rules.hpp"

namespace {

using hils::KeyRule;
using hils::gpu::detail::gpu_implements;
using hils::gpu::detail::gpu_key_rule_names;

// The hils preset on a small shape: workspace_bytes runs the host checks only.
hils::MechanismSpec spec_with(KeyRule rule) {
  hils::MechanismSpec spec;  // taylor, entropy, landmark_query, hierarchical, S 64, W 512, K 32
  spec.key_rule = rule;
  return spec;
}
const hils::gpu::Shape kShape{2048, 4, 2, 64, 64};

// workspace_bytes' refusal text for `spec`, or "" when it is accepted.
std::string refusal(const hils::MechanismSpec& spec) {
  try {
    hils::gpu::workspace_bytes(spec, kShape);
    return "";
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
}

}  // namespace

TEST_CASE("gpu library without a device: every key rule of the table is implemented by the GPU or refused by name") {
  const std::string expected = "key_rule: expected one that the GPU implements (" +
                               gpu_key_rule_names() + "), got ";
  for (const auto& entry : hils::kKeyRuleNames) {
    INFO("key_rule " << entry.name);
    CHECK(refusal(spec_with(entry.value)) ==
          (gpu_implements(entry.value) ? "" : expected + entry.name));
  }
}

TEST_CASE("gpu library without a device: a key rule beyond the GPU's list is refused before any launch") {
  // The integer after the table's last value: what a new row of kKeyRuleNames is to a GPU
  // library that has no branch for it (the C API refuses such integers itself, enum_field; the
  // C++ API takes the enum as given and ran it with unwritten summaries before session 21).
  const auto beyond = static_cast<KeyRule>(hils::kKeyRuleNames.size());
  REQUIRE_FALSE(gpu_implements(beyond));
  CHECK(refusal(spec_with(beyond)) ==
        "key_rule: expected one that the GPU implements (" + gpu_key_rule_names() + "), got " +
            std::to_string(hils::kKeyRuleNames.size()));
}

TEST_CASE("gpu library without a device: the GPU's list names rules of the table, each once, exact not among them") {
  for (size_t i = 0; i < hils::gpu::detail::kGpuSummaryKeyRuleCount; ++i) {
    const KeyRule rule = hils::gpu::detail::kGpuSummaryKeyRules[i];
    INFO("kGpuSummaryKeyRules[" << i << "]");
    CHECK(std::string(hils::enum_name(rule)) != "?");
    CHECK(rule != KeyRule::exact);
    for (size_t j = 0; j < i; ++j) CHECK(hils::gpu::detail::kGpuSummaryKeyRules[j] != rule);
  }
}
