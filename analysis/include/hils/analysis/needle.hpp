// A needle: a key planted so that one chosen query gives it a chosen logit (reference/SEMANTICS.md
// §9). The one planter of the project; its callers choose where the needle goes and which query
// it is aimed at:
// - the `needle` generator of experiments/sources/synthetic.hpp: at a depth over the real tokens,
//   aimed at the first query head of each KV group (that head sees exactly the logit);
// - the extrapolation study (extrapolation.hpp): in the middle of a chunk at a depth over the
//   last query's candidates, aimed at the KV group's mean query (every head of the group sees it).
#pragma once

#include <cstdint>
#include <string>

#include "hils/types.hpp"

namespace hils::analysis {

// Key `slot` of KV head g := (logit / (scale ||aim||^2)) aim, so that scale * aim . k = logit.
// InvalidArgument naming `field` when `aim` is zero.
void plant_needle(std::vector<Matrix<double>>& k, int64_t g, int64_t slot,
                  const RowVector<double>& aim, double scale, double logit,
                  const std::string& field);

}  // namespace hils::analysis
