// The checks of a study's resolved settings that neither the config reader nor the spec decoder
// can make alone: each names the flag, or the config key and file, that set the value.
#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/commands.hpp"
#include "cli/studies/study_config.hpp"
#include "hils/analysis/chunk_stats.hpp"
#include "hils/memory.hpp"

namespace hils::cli::studies {

namespace {

// The most layers a synthetic source draws. Each layer is one more independent draw of the same
// model (its intervals narrow as 1/sqrt(layers x heads)), so more only lengthen the run: a
// larger sample is a second run with another [source] seed. The limit stops a slip such as
// --n-layers 1000000 from starting a run of days (reference/SEMANTICS.md §9, the studies' inputs).
constexpr int64_t kMaxSyntheticLayers = 128;

// How an error names a value that a flag or a config key can set: "--flag (or key in FILE)".
std::string where_set(const std::string& flag, const std::string& key,
                      const config::ConfigValues& c) {
  return c.file() == "(defaults)" ? flag : flag + " (or " + key + " in " + c.file() + ")";
}

// BadInput unless `value` >= `least`, naming the flag and the config key that can set it.
void require_at_least(int64_t value, int64_t least, const std::string& flag,
                      const std::string& key, const config::ConfigValues& c) {
  if (value >= least) return;
  throw BadInput(fmt::format("{}: expected an integer >= {}, got {}", where_set(flag, key, c),
                             least, value));
}

}  // namespace

// r, c -> nothing, or BadInput for a chunk or window of no slots, a negative K, no queries, no
// layers, or more synthetic layers than kMaxSyntheticLayers.
void require_study_values(const Resolved& r, const config::ConfigValues& c) {
  require_at_least(r.geometry.S, 1, "-S,--chunk", "[geometry] S", c);
  require_at_least(r.geometry.W, 1, "-W,--window", "[geometry] W", c);
  require_at_least(r.geometry.K, 0, "-K,--top-k", "[geometry] K", c);
  require_at_least(r.queries, 1, "--queries", "[study] queries", c);
  require_at_least(r.source.n_layers, 1, "--n-layers", "[source] layers", c);
  if (r.source_kind == "synthetic" && r.source.n_layers > kMaxSyntheticLayers)
    throw BadInput(fmt::format(
        "{}: expected at most {} layers for the synthetic source (each layer is one more "
        "independent draw of the same model; for a larger sample run again with another "
        "[source] seed), got {}",
        where_set("--n-layers", "[source] layers", c), kMaxSyntheticLayers, r.source.n_layers));
}

// r, c, row -> nothing, or BadInput naming -K and the range that fits when one unit's
// outputs (the reference's, for the study's queries of one KV group at the longest length)
// would not fit in 80% of memory_limit() and K is what makes them large. The reference refuses
// such a run too, but only at the first unit, after the inputs were built.
void require_outputs_fit(const Resolved& r, const config::ConfigValues& c, const StudyRow& row) {
  const int64_t T = r.source.lengths.back();
  const int64_t heads = r.Hq / std::max<int64_t>(r.Hkv, 1);  // a unit is one KV group
  const int64_t rows = std::min(row.samples_queries() ? r.queries : r.tail_queries, T);
  MechanismSpec spec;
  spec.S = r.geometry.S, spec.W = r.geometry.W, spec.K = r.geometry.K;
  RunOptions options;
  options.keep_surrogate_scores = row.samples_queries();  // fidelity keeps s_hat for its metrics
  const double room = 0.8 * memory_limit().bytes;
  if (outputs_bytes(spec, T, heads, r.dv, options, rows, sizeof(double)) < room) return;
  spec.K = 0;
  const double rest = outputs_bytes(spec, T, heads, r.dv, options, rows, sizeof(double));
  if (rest >= room) return;  // not K: the reference's own check names what is too large
  // The outputs grow by rows x heads doubles per unit of K; the largest K below the room:
  const double per_k = static_cast<double>(rows * heads) * sizeof(double);
  const double largest = std::ceil((room - rest) / per_k) - 1;
  throw BadInput(fmt::format(
      "{}: expected an integer in [0, {:.0f}], got {} (one unit's outputs, {} queries x {} heads "
      "x (dv + K + 3{}) values at T = {}, must fit in 80% of {}; K >= the {} chunks of T already "
      "selects every chunk)",
      where_set("-K,--top-k", "[geometry] K", c), largest, r.geometry.K, rows, heads,
      options.keep_surrogate_scores ? " + the chunk scores" : "", T, memory_limit().text,
      T / r.geometry.S));
}

// lengths, where -> nothing, or BadInput showing every length given.
void require_ascending_lengths(const std::vector<int64_t>& lengths, const std::string& where) {
  if (lengths.empty())
    throw BadInput(where + ": expected at least one length, got []");  // was a crash (back())
  for (size_t i = 0; i < lengths.size(); ++i)
    if (lengths[i] < 1 || (i > 0 && lengths[i] <= lengths[i - 1]))
      throw BadInput(fmt::format("{}: expected positive, strictly ascending lengths, got {}",
                                 where, nlohmann::json(lengths).dump()));
}

// lengths, geometry, where -> nothing, or BadInput for the first length whose last real token
// has no retrieval candidate: the condition the study drivers check unit by unit.
void require_retrieval_candidates(const std::vector<int64_t>& lengths,
                                  const analysis::StudyGeometry& g, const std::string& where) {
  for (int64_t T : lengths)
    if (analysis::tail_queries(Geometry(T, g.S, g.W, g.landmarks), 1).empty())
      throw BadInput(fmt::format("{}: expected lengths with a retrieval candidate (T > W + S = "
                                 "{} at S={}, W={}), got {}",
                                 where, g.W + g.S, g.S, g.W, T));
}

// names, rule, where -> nothing, or BadInput naming where the unknown name was set.
void require_mechanism_names(const std::vector<std::string>& names, PriorRule rule,
                             const std::string& where) {
  for (const auto& name : names) {
    try {
      analysis::study_mechanism(name, rule);
    } catch (const InvalidArgument& e) {
      throw BadInput(where + ": " + e.what());
    }
  }
}

}  // namespace hils::cli::studies
