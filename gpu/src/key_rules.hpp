// The key rules the GPU implements: ONE list, read by the summarize kernels' dispatch
// (summarize_kernels.cu takes its branch constants from it) and by the host's refusal of any other
// rule (api.cpp validate_shape, so the C and C++ APIs and hils.gpu refuse it before a launch).
// A key rule of hils/spec.hpp that is not here ran with garbage summaries before session 21:
// summarize_kernel wrote no key for it (README "Adding a mechanism").
#pragma once

#include <cstddef>
#include <string>

#include "hils/spec.hpp"

namespace hils::gpu::detail {

// The summary key rules, in the order of summarize_kernel's branches (taylor, mean, landmark_key).
// KeyRule::exact needs no summary: exact_chunk_log_mass scores the chunks instead.
inline constexpr KeyRule kGpuSummaryKeyRules[] = {KeyRule::taylor, KeyRule::mean,
                                                  KeyRule::landmark_key};
inline constexpr std::size_t kGpuSummaryKeyRuleCount =
    sizeof(kGpuSummaryKeyRules) / sizeof(kGpuSummaryKeyRules[0]);

constexpr bool gpu_implements(KeyRule rule) {
  if (rule == KeyRule::exact) return true;
  for (KeyRule summary : kGpuSummaryKeyRules)
    if (summary == rule) return true;
  return false;
}

// "exact, mean, landmark_key or taylor": the implemented rules in kKeyRuleNames' order.
inline std::string gpu_key_rule_names() {
  std::string names;
  std::size_t left = 0;
  for (const auto& entry : kKeyRuleNames) left += gpu_implements(entry.value) ? 1 : 0;
  for (const auto& entry : kKeyRuleNames) {
    if (!gpu_implements(entry.value)) continue;
    --left;
    names += (names.empty() ? "" : left == 0 ? " or " : ", ") + std::string(entry.name);
  }
  return names;
}

}  // namespace hils::gpu::detail
