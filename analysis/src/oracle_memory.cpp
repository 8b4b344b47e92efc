// The oracle's memory estimate (oracle.hpp, "Memory"): what make_context, add_score_conditioning,
// add_own_fusions (oracle.cpp) and one verify() hold at once, from the problem's sizes alone.
#include <algorithm>
#include <cstdio>
#include <string>

#include "hils/analysis/oracle.hpp"
#include "hils/memory.hpp"

namespace hils::oracle {

namespace {

double product(std::initializer_list<int64_t> sizes) {
  double p = 1;
  for (int64_t n : sizes) p *= static_cast<double>(n);
  return p;
}

}  // namespace

double oracle_bytes(const MechanismSpec& spec, const ProblemShape& s, double* scores) {
  const double rows = static_cast<double>(s.queries);
  // Every input value: q (and q~), k, v, the prior; held in double and in float (12 bytes).
  const double inputs = product({s.Hq, s.T, s.d}) * (s.q_retrieval ? 2 : 1) +
                        product({s.Hkv, s.T, s.d + s.dv}) + product({s.Hq, s.prior_rows, s.d});
  RunOptions run;  // what make_context keeps of each run
  run.keep_surrogate_scores = spec.selects();
  run.keep_window = true;
  const double runs = outputs_bytes(spec, s.T, s.Hq, s.dv, run, s.queries, 8) +
                      outputs_bytes(spec, s.T, s.Hq, s.dv, run, s.queries, 4);
  const double chunks = static_cast<double>(spec.S > 0 ? s.T / spec.S : 0);
  const double heads_o = static_cast<double>(s.Hq) * rows * static_cast<double>(s.dv);
  double held = 12 * inputs + runs, temporaries = 16 * heads_o;  // o of both runs widened
  double chunk_scores = spec.selects() ? static_cast<double>(s.Hq) * rows * chunks * 12 : 0;
  if (spec.selects()) {
    const double fused = 12 * static_cast<double>(s.Hq) * rows *
                         static_cast<double>(s.dv + spec.K + 3);  // o, lse, K + 2 weights
    const double per_group = 8 * static_cast<double>(s.Hkv) * rows * chunks;
    held += per_group + fused;  // the score conditioning; the own selection's fusions
    chunk_scores += per_group;
    // compare_selection's r in double and float, or compare_fused's fusions and widened o.
    temporaries = std::max(2 * per_group, fused + 16 * heads_o);
  }
  if (s.gradients)  // both backward passes' gradients and upstream do, and one widened gradient
    temporaries = std::max(temporaries, 12 * inputs + 12 * product({s.Hq, s.T, s.dv}) +
                                            8 * product({s.Hq, s.T, s.d}));
  if (scores) *scores = chunk_scores;
  return held + temporaries;
}

void require_oracle_fits(const MechanismSpec& spec, const ProblemShape& shape, double caller_bytes,
                         const std::string& field, const std::string& queries_knob) {
  double scores = 0;
  const double bytes = oracle_bytes(spec, shape, &scores) + caller_bytes;
  const MemoryLimit memory = memory_limit();
  if (bytes < 0.8 * memory.bytes) return;
  char sizes[200];
  std::snprintf(sizes, sizeof sizes, "T = %lld slots, %lld query heads, %lld KV heads, d = %lld, "
                "%lld query rows%s", static_cast<long long>(shape.T),
                static_cast<long long>(shape.Hq), static_cast<long long>(shape.Hkv),
                static_cast<long long>(shape.d), static_cast<long long>(shape.queries),
                shape.gradients ? ", gradients" : "");
  const std::string what =
      scores > 0.25 * bytes
          ? " (" + bytes_text(scores) + " of it the chunk scores of every query row, [rows x " +
                std::to_string(spec.S > 0 ? shape.T / spec.S : 0) + " chunks], which grow as rows x T)"
          : "";
  require(false, field,
          "a problem whose oracle (the reference in double and float, and what it compares) fits "
          "in 80% of " + memory.text + "; judge fewer query rows (" + queries_knob +
              "), a shorter T or fewer heads at once",
          std::string(sizes) + ": about " + bytes_text(bytes) + what);
}

}  // namespace hils::oracle
