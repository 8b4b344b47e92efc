// The size of the OpenMP teams the reference and the studies run their units on, and how a
// caller stops a long call early.
#pragma once

#include <atomic>
#include <cstdint>
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
}  // namespace detail

}  // namespace hils
