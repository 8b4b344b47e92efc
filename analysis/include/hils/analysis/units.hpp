// How units of work run. A study driver (or `hils run`) lists its units (path, a cost estimate
// and the work); a UnitRunner runs them and delivers each unit's writes to the results sink in
// SCHEDULE order (schedule_order: largest cost first, ties in list order), each followed by
// mark_complete(unit). The results file therefore does not depend on the runner: SerialUnitRunner (here) runs them one after another; the MPI runner
// (experiments/parallel/mpi_runner.hpp) shares them among ranks and writes on rank 0 only.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
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
// runs a unit's work through this. `stop`: the flag the reference reads instead of request_stop's
// (ThreadedUnitRunner's run flag, which also ends the units in flight once the run failed).
void run_unit_work(const StudyUnit& unit, ResultSink& sink,
                   const std::atomic<int>* stop = nullptr);

struct StudyUnit {
  std::string path;   // what is marked complete, e.g. unit_path(T, layer, group)
  double cost = 1.0;  // relative cost estimate (largest-first scheduling), e.g. T^2
  // Writes the unit's results into the sink; does NOT mark it complete (the runner does).
  std::function<void(ResultSink&)> work;
  // The loaded input it reads (LayerCache: layer and T), shared with the other units naming the
  // same one; empty: none. A unit that starts while another unit of its input loads it waits for
  // that load, so ThreadedUnitRunner starts another unit where it can (README, "Several units at
  // once").
  std::string input;
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
  UnitsDone run(const std::vector<StudyUnit>& units, ResultSink& sink, const Progress& progress) {
    ++runs_;
    return run_units(units, sink, progress);
  }
  // How many unit lists run was given: the study commands check that a study's driver ran its
  // units through the runner of the session (experiments/cli/studies/study_results.hpp).
  int64_t runs() const { return runs_; }
  // True where the results live (the only process, or MPI rank 0): summaries are written here.
  virtual bool holds_results() const = 0;

 private:
  virtual UnitsDone run_units(const std::vector<StudyUnit>& units, ResultSink& sink,
                              const Progress& progress) = 0;
  int64_t runs_ = 0;  // run is called by the process's main thread only
};

// One unit after another in this process.
class SerialUnitRunner final : public UnitRunner {
 public:
  bool holds_results() const override { return true; }

 private:
  UnitsDone run_units(const std::vector<StudyUnit>& units, ResultSink& sink,
                      const Progress& progress) override;
};
SerialUnitRunner& serial_runner();

// `jobs` units at once in this process, each on its own std::thread with an OpenMP team of
// max(1, threads / units at once) (libgomp gives every std::thread its own team; `threads`: the
// OpenMP threads to share, OMP_NUM_THREADS; a unit is mostly serial, so
// several units at once use the cores better than one unit's team: README, "Several units at
// once"). The workers take units in schedule_order and record them (RecordingSink); the calling
// thread writes them in schedule_order through an InOrderWriter, as the MPI coordinator does,
// so the results file is the serial runner's. The first failing unit in schedule order ends the
// run with its error once every unit before it is written (the ones after it are dropped); a
// stop request ends the run at the units written (units in flight stop at their next safe
// point and are dropped). At most 4 x jobs units are taken and not yet written: held results
// wait for a slow unit before them, and this bounds their memory (2 x jobs held workers idle
// behind a layer's second unit, which now ends late: README, "Measured on 16 cores"). A worker takes the first unit
// of those whose input (StudyUnit::input) no unit in flight reads, else the first unit: units of
// one input would otherwise start together and all but one wait for its load (a layer's two KV
// groups: the second thread idled while the first drew the layer).
class ThreadedUnitRunner final : public UnitRunner {
 public:
  ThreadedUnitRunner(int jobs, int threads);
  bool holds_results() const override { return true; }
  int jobs() const { return jobs_; }

 private:
  UnitsDone run_units(const std::vector<StudyUnit>& units, ResultSink& sink,
                      const Progress& progress) override;
  int jobs_, threads_;
};

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

// One unit computed on a worker thread (ThreadedUnitRunner's, the MPI worker's): its records
// (run_unit_work into a RecordingSink, replayed when its turn to be written comes), or the error
// it ended with; a stop requested before it starts is that error (Interrupted).
using UnitResult = std::variant<RecordingSink, std::exception_ptr>;
UnitResult record_unit(const StudyUnit& unit, const std::atomic<int>* stop);
// A run's stop flag (what `stop` above points to) once the run ended without a stop request (a
// unit or a write failed): the units in flight end at their next safe point and are dropped.
inline constexpr int kRunAbandoned = -1;

// Publishes the sink's finished units (ResultSink::publish_completed) when the unit loop it
// guards ends, normally or by an exception (a stop, a failing unit): a results file spaces its
// checkpoints, so units marked complete since the last one would otherwise wait for the commit
// (and be lost with a run that ends before it).
class PublishFinishedUnits {
 public:
  explicit PublishFinishedUnits(ResultSink& sink) : sink_(sink) {}
  ~PublishFinishedUnits() { sink_.publish_completed(); }
  PublishFinishedUnits(const PublishFinishedUnits&) = delete;
  PublishFinishedUnits& operator=(const PublishFinishedUnits&) = delete;

 private:
  ResultSink& sink_;
};

// Units finished in any order (on MPI workers, on threads) -> written into the sink in schedule
// order, each marked complete, as SerialUnitRunner writes them: the results file does not depend
// on the runner. The MPI coordinator and ThreadedUnitRunner share it.
class InOrderWriter {
 public:
  // order: schedule_order(units, sink); done: where the units written are listed (done.ran).
  InOrderWriter(const std::vector<StudyUnit>& units, std::vector<size_t> order, ResultSink& sink,
                const Progress& progress, UnitsDone& done);
  // Holds a finished unit (its index into units) and its records until its turn.
  void hold(size_t unit, RecordingSink records);
  // Writes every held unit whose turn has come, in schedule order, and marks them complete
  // together (ResultSink::mark_complete_all: one checkpoint, whose cost grows with the file),
  // but for the run's first unit, marked alone as soon as it is written; then reports progress. False when no unit was ready. A write failure propagates (nothing
  // more should be written then).
  bool write_ready();
  size_t written() const { return next_; }
  bool all_written() const { return next_ == order_.size(); }
  const std::vector<size_t>& order() const { return order_; }

 private:
  const std::vector<StudyUnit>& units_;
  std::vector<size_t> order_;
  ResultSink& sink_;
  const Progress& progress_;
  UnitsDone& done_;
  size_t next_ = 0;                          // order_[next_] is the next unit to write
  std::map<size_t, RecordingSink> held_;     // finished, waiting for their turn
  PublishFinishedUnits keep_finished_units_;  // publishes the units written when the loop ends
};

// A value loaded once per key and shared while in use, safe to call from several threads (units
// running at once): get(key) returns the value held for key, or loads it (one thread loads, the
// others asking for the same key wait for it). Before a load, every value no caller holds any
// more is dropped: one at a time with one runner thread (consecutive units of a layer share
// it), at most one per unit in flight with several.
template <class Key, class Value>
class SharedLoads {
 public:
  using Ptr = std::shared_ptr<const Value>;
  explicit SharedLoads(std::function<Value(const Key&)> load) : load_(std::move(load)) {}

  Ptr get(const Key& key) {
    std::promise<Ptr> loading;
    std::shared_future<Ptr> value;
    bool load_here = false;
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      const auto found = held_.find(key);
      if (found != held_.end()) {
        value = found->second;  // loaded, or being loaded by another thread: get() waits
      } else {
        drop_unused();  // free the previous layer before loading the next
        value = held_[key] = loading.get_future().share();
        load_here = true;
      }
    }
    if (load_here) {
      try {
        loading.set_value(std::make_shared<const Value>(load_(key)));
      } catch (...) {
        loading.set_exception(std::current_exception());
        const std::lock_guard<std::mutex> lock(mutex_);
        held_.erase(key);  // a later call tries again
      }
    }
    return value.get();
  }

 private:
  // Values loaded that nobody holds but this cache (the future's own copy).
  void drop_unused() {
    for (auto it = held_.begin(); it != held_.end();) {
      const bool ready = it->second.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
      bool unused = false;
      if (ready) {
        try {
          unused = it->second.get().use_count() == 1;
        } catch (...) {
          unused = true;
        }
      }
      it = unused ? held_.erase(it) : std::next(it);
    }
  }
  std::function<Value(const Key&)> load_;
  std::mutex mutex_;
  std::map<Key, std::shared_future<Ptr>> held_;
};

// The layer a unit reads, loaded once for consecutive units of the same (layer, T): units of
// one layer are listed (and, largest first, handed out) next to each other. One layer is held
// per unit in flight (SharedLoads), never all of them; the units hold it while they run.
class LayerCache {
 public:
  explicit LayerCache(LayerLoader load);
  std::shared_ptr<const AttentionInputs<double>> get(int64_t layer, int64_t T);

 private:
  SharedLoads<std::pair<int64_t, int64_t>, AttentionInputs<double>> loads_;
};

}  // namespace hils::analysis
