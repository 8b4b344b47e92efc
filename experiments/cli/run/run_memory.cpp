// hils run's size check: what the largest unit holds at once, estimated before any work, so that
// a size this machine cannot hold (a long T, a large K, --keep-scores over many chunks) is
// refused naming what sets it and what would fit, instead of ending in an out-of-memory kill.
#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "cli/commands.hpp"
#include "cli/run/run_plan.hpp"
#include "hils/memory.hpp"

namespace hils::cli::run_command {

namespace {

// Bytes a unit holds: `layer` for its inputs whatever the queries, `per_query` for each computed
// query, and the values per query spelled out for the message.
struct UnitBytes {
  double layer = 0, per_query = 0;
  std::string per_query_text;
};

// The number of queries a unit computes: --last-queries, or every slot.
double computed_queries(const RunPlan& plan, const io::ActivationMeta& meta) {
  return static_cast<double>(plan.last_queries > 0 ? plan.last_queries : meta.T);
}

// spec, meta, plan -> the estimate. The layer is held three times (as read, the mechanism's
// copy, its encoded copy) with every optional dataset of the format; the outputs twice (the
// reference's and the results writer's).
UnitBytes unit_bytes(const MechanismSpec& spec, const io::ActivationMeta& meta,
                     const RunPlan& plan) {
  const double T = static_cast<double>(meta.T), Hq = static_cast<double>(meta.Hq),
               Hkv = static_cast<double>(meta.Hkv), d = static_cast<double>(meta.d),
               dv = static_cast<double>(meta.dv), K = static_cast<double>(spec.K);
  const double chunks = std::ceil(T / static_cast<double>(std::max<int64_t>(spec.S, 1)));
  UnitBytes b;
  b.layer = 3 * 8 * T * (3 * Hq * d + 2 * Hkv * d + Hkv * dv + static_cast<double>(meta.d_model));
  double per_head = dv + 1 + K + 2;
  // K + 3 in double: it overflows int64 for a K near its maximum
  b.per_query_text = fmt::format("Hq={} x (dv={} + K+3={:.0f}", meta.Hq, meta.dv, K + 3);
  if (plan.keep_scores) {
    per_head += 2 * chunks;
    b.per_query_text += fmt::format(" + 2 x {} chunk scores of --keep-scores", chunks);
  }
  if (plan.keep_window) {
    per_head += dv + 1;
    b.per_query_text += " + dv+1 of --keep-window";
  }
  b.per_query_text += fmt::format(") + Hkv={} x K={} values", meta.Hkv, spec.K);
  b.per_query = 2 * 8 * (Hq * per_head + Hkv * K);
  return b;
}

// The hint of the error: the layer alone is too large, or the most queries (--last-queries) and
// the largest K that fit with the other sizes as given.
std::string what_fits(const MechanismSpec& spec, const io::ActivationMeta& meta,
                      const RunPlan& plan, const UnitBytes& b, double room,
                      const std::string& input) {
  if (b.layer >= room)
    return fmt::format("one layer of {} alone (T={}, Hq={}, Hkv={}, d={}, dv={}) needs about "
                       "{}: run it on a machine with more memory, or dump a shorter T",
                       input, meta.T, meta.Hq, meta.Hkv, meta.d, meta.dv, bytes_text(b.layer));
  const double queries_fitting = std::floor((room - b.layer) / b.per_query);
  // per_query is linear in K: rest (its value at K = 0) + 16 (Hq + Hkv) K
  MechanismSpec no_k = spec;
  no_k.K = 0;
  const double rest = unit_bytes(no_k, meta, plan).per_query;
  const double queries = computed_queries(plan, meta);
  const double k_fitting = std::floor(((room - b.layer) / queries - rest) /
                                      (16 * static_cast<double>(meta.Hq + meta.Hkv)));
  std::string hint = queries_fitting >= 1
                         ? fmt::format("at most {:.0f} computed queries fit (--last-queries {:.0f})",
                                       queries_fitting, queries_fitting)
                         : "not one computed query fits";
  if (k_fitting >= 0 && k_fitting < static_cast<double>(spec.K))
    hint += fmt::format(", or -K at most {:.0f} with {:.0f} queries", k_fitting, queries);
  if (plan.keep_scores || plan.keep_window)
    hint += ", or fewer kept outputs (--keep-scores, --keep-window)";
  return hint;
}

}  // namespace

// plan, meta, input -> nothing, or BadInput for the first mechanism whose unit (one layer, the
// queries computed) would not fit in 80% of the memory this process may use.
void require_units_fit(const RunPlan& plan, const io::ActivationMeta& meta,
                       const std::string& input) {
  const MemoryLimit memory = memory_limit();
  const double room = 0.8 * memory.bytes;
  const double queries = computed_queries(plan, meta);
  for (const auto& spec : plan.mechanisms) {
    const UnitBytes b = unit_bytes(spec, meta, plan);
    if (b.layer + queries * b.per_query < room) continue;
    throw BadInput(fmt::format(
        "mechanism {} over {}: expected a unit (one layer, {:.0f} queries) whose data fit in 80% "
        "of {}, got about {} ({} per query: {}); {}",
        spec.name, input, queries, memory.text, bytes_text(b.layer + queries * b.per_query),
        bytes_text(b.per_query), b.per_query_text, what_fits(spec, meta, plan, b, room, input)));
  }
}

}  // namespace hils::cli::run_command
