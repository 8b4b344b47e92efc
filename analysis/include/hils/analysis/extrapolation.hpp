// The length-extrapolation study (reference/SEMANTICS.md §9): the fidelity metrics as the context
// grows from the training length to many times it, under RoPE, HoPE and NoPE applied to the same
// un-rotated vectors; and a selection-level needle test on a length x depth grid per mechanism.
//
// Results: for each encoding E in {rope, hope, nope}, the fidelity layout under the prefix "E/"
// (units E/T<T>/layer<l>/group<g>, summaries E/summary/...), and the needle grid:
//   needle/E/T<T>/<mech>/success [n_depth]   fraction of KV groups whose selection I(t_last)
//                                            holds the needle's chunk
//   needle/E/T<T>/needle_chunk [n_depth]     the needle's chunk per depth
//   needle/E/<mech>/grid [n_len x n_depth]   the grid (after all units)
//   needle/depths [n_depth], needle/lengths [n_len]
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hils/analysis/fidelity.hpp"

namespace hils::analysis {

struct NamedEncoding {
  std::string name;  // "rope", "hope", "nope"
  PositionalEncoding pe;
};

struct ExtrapolationOptions {
  FidelityOptions fidelity;                 // geometry, prior, mechanisms, queries per unit
  std::vector<NamedEncoding> encodings;
  std::vector<double> depths{0.0, 0.25, 0.5, 0.75, 1.0};  // needle depth in [0, 1] of V(t_last)
  double needle_logit = 6.0;  // sigma q . k_needle of the group's mean query, before rotation
  int64_t needle_layer = 0;
  bool run_metrics = true;
  bool run_needle = true;
};

// The context of one needle unit, positioned once, with the needle moved from slot to slot: the
// needle keys are planted in the raw keys (aimed at each KV group's mean raw query of slot
// `aim_slot`, sigma q_mean . k_needle = logit) and only their rows are rotated again per slot.
// `at(slot)` gives, bit for bit, what positioning the whole needled context would give:
//   apply_positional_encoding(raw with each group's key at `slot` := its needle, geometry, pe,
//                             prior_rule), then fill_prior(..., prior_source)
// (the prior reads only the queries, which the needle leaves alone). Holds one copy of the
// inputs; at() overwrites the previous slot's needle rows with the keys they displaced.
// InvalidArgument as plant_needle and apply_positional_encoding, in that order.
class NeedleContext {
 public:
  NeedleContext(const AttentionInputs<double>& raw, const Geometry& geometry,
                const PositionalEncoding& pe, PriorRule prior_rule, PriorSource prior_source,
                int64_t aim_slot, double scale, double logit);
  // The positioned inputs with every group's needle at `slot` (a valid slot of the geometry).
  const AttentionInputs<double>& at(int64_t slot);

 private:
  Geometry geometry_;
  PositionalEncoding pe_;
  std::vector<Matrix<double>> needles_;    // [1 x d] per KV group: the raw needle key
  std::vector<Matrix<double>> displaced_;  // [1 x d] per KV group: the key the needle covers
  AttentionInputs<double> positioned_;
  int64_t slot_ = -1;                      // where the needles are now, -1 before at()
};

// The needle test of one (encoding, raw layer, T): for each depth and mechanism, the fraction of
// KV groups that select the needle's chunk for the last real-token query. Writes the unit
// "needle/<E>/T<T>" (see the header comment) and marks it complete.
void run_needle_unit(const AttentionInputs<double>& raw, const NamedEncoding& encoding,
                     const ExtrapolationOptions& options, ResultSink& sink);
// The same without marking the unit complete (its runner does that).
void write_needle_unit(const AttentionInputs<double>& raw, const NamedEncoding& encoding,
                       const ExtrapolationOptions& options, ResultSink& sink);

struct ExtrapolationReport {
  int64_t units_run = 0, units_skipped = 0;
  bool kl_ok = true;
  KlCheck worst_kl;
};
// The source's loader must return raw (un-rotated) vectors; every length and encoding.
ExtrapolationReport run_extrapolation_study(const StudySource& raw_source,
                                            const ExtrapolationOptions& options,
                                            ResultSink& sink, const Progress& progress = {});

}  // namespace hils::analysis
