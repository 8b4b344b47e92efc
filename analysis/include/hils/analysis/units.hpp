// How units of work run. A study driver (or `hils run`) lists its units (path, a cost estimate
// and the work); a UnitRunner runs them and delivers each unit's writes to the results sink in
// SCHEDULE order (schedule_order: largest cost first, ties in list order), each followed by
// mark_complete(unit). The results file therefore does not depend on the runner: SerialUnitRunner (here) runs them one after another; the MPI runner
// (experiments/parallel/mpi_runner.hpp) shares them among ranks and writes on rank 0 only.
#pragma once

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

#include "hils/analysis/sink.hpp"
#include "hils/analysis/study.hpp"

namespace hils::analysis {

// Asking a run to stop (Ctrl-C, SIGTERM): the `hils` command's signal handler calls
// request_stop() and nothing else (experiments/io/hdf5_util.hpp, UnitStopScope); the runners
// check stop_requested() before each unit and the units at safe points inside
// (throw_if_stop_requested(); and the reference before each query block, run_unit_work below),
// so a run ends at a unit boundary: every unit marked complete is
// whole, the unit in progress is dropped (a unit marks nothing complete itself).
// request_stop and stop_requested are async-signal-safe (one lock-free atomic each).
void request_stop(int signal_number) noexcept;
// The signal number of the first request, 0 when none.
int stop_requested() noexcept;
// Forgets the request (tests; a process that runs again in-process).
void clear_stop_request() noexcept;

// Thrown by a runner or a unit's safe point once a stop is requested.
struct Interrupted : std::runtime_error {
  explicit Interrupted(int signal)
      : std::runtime_error("interrupted by signal " + std::to_string(signal)),
        signal_number(signal) {}
  int signal_number;
};
// A safe point: throws Interrupted when a stop is requested.
void throw_if_stop_requested();

struct StudyUnit;
// Runs unit.work(sink) with the reference's own stop check on (hils::StopScope on the flag
// request_stop sets, hils/threads.hpp): a stop requested while the reference runs ends it at
// its next query block, as Interrupted, instead of at the end of a long stage. Every runner
// runs a unit's work through this.
void run_unit_work(const StudyUnit& unit, ResultSink& sink);

struct StudyUnit {
  std::string path;   // what is marked complete, e.g. unit_path(T, layer, group)
  double cost = 1.0;  // relative cost estimate (largest-first scheduling), e.g. T^2
  // Writes the unit's results into the sink; does NOT mark it complete (the runner does).
  std::function<void(ResultSink&)> work;
};

// What a runner did, known where the results are held (empty elsewhere).
struct UnitsDone {
  std::vector<size_t> ran;  // indices into the unit list, run by this call
  int64_t skipped = 0;      // already complete
};

// The indices of the units not complete in `sink`, largest cost first, equal costs in list
// order (units of one layer stay together). Largest first keeps the last units to finish
// small, so ranks run out of work together; writing in this same order keeps the MPI
// coordinator's queue of finished-but-unwritten units short.
std::vector<size_t> schedule_order(const std::vector<StudyUnit>& units, const ResultSink& sink);

class UnitRunner {
 public:
  virtual ~UnitRunner() = default;
  // Runs every unit of `units` not yet complete in `sink` and, where this process holds the
  // results, writes them to `sink` in schedule_order, marking each complete. Every process of a
  // run passes the same list. Throws on the first failing unit; the units written before it
  // stay complete. Throws Interrupted when a stop is requested (checked before each unit and
  // once after the last): nothing is written after the request.
  virtual UnitsDone run(const std::vector<StudyUnit>& units, ResultSink& sink,
                        const Progress& progress) = 0;
  // True where the results live (the only process, or MPI rank 0): summaries are written here.
  virtual bool holds_results() const = 0;
};

// One unit after another in this process.
class SerialUnitRunner final : public UnitRunner {
 public:
  UnitsDone run(const std::vector<StudyUnit>& units, ResultSink& sink,
                const Progress& progress) override;
  bool holds_results() const override { return true; }
};
SerialUnitRunner& serial_runner();

// A sink that records every write and attribute in order, to be replayed into another sink
// (the MPI runner records a unit on a worker and replays it on rank 0).
class RecordingSink final : public ResultSink {
 public:
  struct Dataset {
    std::string path, meaning;
    std::variant<Matrix<double>, std::vector<double>, std::vector<int64_t>, IndexMatrix> data;
  };
  struct Attribute {
    std::string object, name;
    std::variant<std::string, double> value;
  };
  using Record = std::variant<Dataset, Attribute>;

  bool is_complete(const std::string&) const override { return false; }
  void mark_complete(const std::string& unit) override;
  void write(const std::string& path, const Matrix<double>& data,
             const std::string& meaning) override;
  void write(const std::string& path, const std::vector<double>& data,
             const std::string& meaning) override;
  void write(const std::string& path, const std::vector<int64_t>& data,
             const std::string& meaning) override;
  void write(const std::string& path, const IndexMatrix& data,
             const std::string& meaning) override;
  void set_attribute(const std::string& object, const std::string& name,
                     const std::string& value) override;
  void set_attribute(const std::string& object, const std::string& name,
                     double value) override;
  // Units record their own writes only; reading earlier units' results is for summaries.
  std::optional<Matrix<double>> read(const std::string& path) const override;

  // Writes the records, in order, into `sink`.
  void replay(ResultSink& sink) const;

  std::vector<Record> records;
};

// The layer a unit reads, loaded once for consecutive units of the same (layer, T): units of
// one layer are listed (and, largest first, handed out) next to each other. One layer at a time
// is held, never all of them.
class LayerCache {
 public:
  explicit LayerCache(LayerLoader load) : load_(std::move(load)) {}
  const AttentionInputs<double>& get(int64_t layer, int64_t T);

 private:
  LayerLoader load_;
  int64_t layer_ = -1, T_ = -1;
  AttentionInputs<double> inputs_;
};

}  // namespace hils::analysis
