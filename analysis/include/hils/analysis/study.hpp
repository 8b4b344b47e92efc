// What the three studies share: where activations come from, the geometry under study, the
// mechanisms compared, and unit paths in the results (one unit = layer x KV group x length).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "hils/analysis/chunk_stats.hpp"
#include "hils/analysis/sink.hpp"
#include "hils/attention.hpp"

namespace hils::analysis {

// One layer's inputs with T slots. For fidelity and overlap they are positioned (carry the
// model's RoPE, if any); for extrapolation they are raw (un-rotated) and the study rotates them.
using LayerLoader = std::function<AttentionInputs<double>(int64_t layer, int64_t T)>;

struct StudySource {
  std::string name;              // e.g. "synthetic" or "stories260K"
  int64_t n_layers = 1;
  std::vector<int64_t> lengths;  // slot counts T to study, ascending
  LayerLoader load;
};

// The sparse-attention geometry under study; it overrides the geometry fields of every spec.
struct StudyGeometry {
  int64_t S = 64, W = 512, K = 32;
  bool landmarks = true;
  GroupRule group_rule = GroupRule::max_normalized;
  double scale = 0.0;  // 0: 1/sqrt(d)
};

// A chunk score under study: a MechanismSpec, or the max-logit score (max_j s(t,j) over T_c,
// selected per group like any score and fused flat, as MiniMax-style max scoring would).
struct StudyMechanism {
  std::string name;
  bool max_logit = false;
  MechanismSpec spec;
};

// Names the studies accept: any preset (reference/SEMANTICS.md §7), "mean" (= nsa), "landmark_key"
// (= lmk), "taylor" (taylor key, no bias, hierarchical), "taylor_entropy" (= hils scores),
// "max_logit", and "<key>+<bias>" for any key and bias rule (hierarchical fusion). The prior rule
// applies to every spec that needs a prior.
StudyMechanism study_mechanism(const std::string& name, PriorRule prior_rule);
// The list: mean, landmark_key (only with landmarks), taylor, taylor_entropy, max_logit,
// and naive_bsa (exact scores: the best any score can do).
std::vector<std::string> default_mechanism_names(bool landmarks);
// The spec with the study's geometry, prior rule kept.
MechanismSpec with_geometry(MechanismSpec spec, const StudyGeometry& geometry);

// The inputs a spec needs: the group's heads with the prior filled from `prior_source`.
struct PriorChoice {
  PriorRule rule = PriorRule::landmark_query;
  PriorSource source = PriorSource::inputs;
};

// "T<T>/layer<l>/group<g>", the unit of resumable work.
std::string unit_path(int64_t T, int64_t layer, int64_t group);
// "T<T>/layer<l>": the input (StudyUnit::input) of the units that read layer l at length T.
std::string layer_input(int64_t T, int64_t layer);

// Called after each unit with (units done, units total), for progress bars.
using Progress = std::function<void(int64_t done, int64_t total)>;

}  // namespace hils::analysis
