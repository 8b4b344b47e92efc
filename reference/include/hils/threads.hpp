// The size of the OpenMP teams the reference and the studies run their units on, and how a
// caller stops a long call early.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <stdexcept>
#include <string>

namespace hils {

// The OpenMP team for `units` independent units -> its size: OMP_NUM_THREADS (or OpenMP's
// default), at most `units` and at most 4 per hardware thread of this machine. Results never
// depend on it; the cap is there because OMP_NUM_THREADS=100000 made libgomp overflow the
// stack creating the team (SIGSEGV).
int thread_team_size(int64_t units);

// Stopping a long call early (a command's Ctrl-C or SIGTERM, experiments/cli): while a StopScope
// is alive on a thread, every stage the reference runs from that thread reads `flag` before each
// of its units of parallel work (a query block of one head or KV group, a head) and, once the
// flag is nonzero, skips the units left and throws Stopped when the loop ends. The caller owns
// the flag (set it from a signal handler: one lock-free store); nothing is returned from a
// stopped call. Without a scope (or with a null flag) nothing is read and results are as ever.
// Scopes nest; each restores the flag of the one outside it.
class StopScope {
 public:
  explicit StopScope(const std::atomic<int>* flag) noexcept;
  ~StopScope();
  StopScope(const StopScope&) = delete;
  StopScope& operator=(const StopScope&) = delete;

 private:
  const std::atomic<int>* outer_;
};

// Thrown by a stage stopped by its StopScope's flag; `value` is the flag's value then.
struct Stopped : std::runtime_error {
  explicit Stopped(int flag_value)
      : std::runtime_error("stopped (stop flag " + std::to_string(flag_value) + ")"),
        value(flag_value) {}
  int value;
};

namespace detail {
// The flag of the innermost StopScope alive on this thread, or null.
const std::atomic<int>* stop_flag() noexcept;

// Runs `body(unit)` for unit in [0, units) on OpenMP threads. Units must write disjoint
// outputs; their results then do not depend on the number of threads.
// An exception in a unit is rethrown on the calling thread after the loop. The one place the
// stages check the calling thread's StopScope (hils/threads.hpp): before each unit, so a stop
// skips the units left (calling `skipped(unit)` for each), then Stopped after the loop; the
// worker threads run each unit under the same flag, so stages called inside a unit check it too.
// Units are handed out in ascending order (schedule(dynamic, 1)): a unit may wait for one of a
// lower index (fused_backward.cpp), which is then running, done or skipped.
template <class Body, class Skipped>
void parallel_units(int64_t units, const Body& body, const Skipped& skipped) {
  const std::atomic<int>* stop = stop_flag();
  std::exception_ptr failure;
#pragma omp parallel for schedule(dynamic, 1) num_threads(thread_team_size(units))
  for (int64_t unit = 0; unit < units; ++unit) {
    if (stop != nullptr && stop->load(std::memory_order_relaxed) != 0) {
      skipped(unit);
      continue;
    }
    try {
      const StopScope same_flag(stop);
      body(unit);
    } catch (...) {
#pragma omp critical(hils_parallel_units_failure)
      if (!failure) failure = std::current_exception();
    }
  }
  if (failure) std::rethrow_exception(failure);
  if (stop != nullptr) {
    if (const int value = stop->load()) throw Stopped(value);
  }
}

template <class Body>
void parallel_units(int64_t units, const Body& body) {
  parallel_units(units, body, [](int64_t) {});
}
}  // namespace detail

}  // namespace hils
