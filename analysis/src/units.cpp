#include "hils/analysis/units.hpp"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <thread>

#include "hils/threads.hpp"

namespace hils::analysis {

namespace {
// Set from a signal handler: lock-free, so a plain store (async-signal-safe).
std::atomic<int> g_stop_signal{0};
static_assert(std::atomic<int>::is_always_lock_free);
}  // namespace

void request_stop(int signal_number) noexcept {
  int none = 0;  // the first request is kept
  g_stop_signal.compare_exchange_strong(none, signal_number);
}

int stop_requested() noexcept { return g_stop_signal.load(); }

void clear_stop_request() noexcept { g_stop_signal.store(0); }

void throw_if_stop_requested() {
  if (const int signal = stop_requested()) throw Interrupted(signal);
}

void run_unit_work(const StudyUnit& unit, ResultSink& sink, const std::atomic<int>* stop) {
  const StopScope stop_inside_the_reference(stop ? stop : &g_stop_signal);
  try {
    unit.work(sink);
  } catch (const Stopped& stopped) {
    throw Interrupted(stopped.value);  // the flag holds the signal number
  }
}

UnitResult record_unit(const StudyUnit& unit, const std::atomic<int>* stop) {
  try {
    throw_if_stop_requested();  // stopped: no new unit
    RecordingSink records;
    run_unit_work(unit, records, stop);
    return records;
  } catch (...) {
    return std::current_exception();
  }
}

std::vector<size_t> schedule_order(const std::vector<StudyUnit>& units, const ResultSink& sink) {
  std::vector<size_t> order;
  for (size_t i = 0; i < units.size(); ++i)
    if (!sink.is_complete(units[i].path)) order.push_back(i);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return units[a].cost > units[b].cost; });
  return order;
}

UnitsDone SerialUnitRunner::run_units(const std::vector<StudyUnit>& units, ResultSink& sink,
                                      const Progress& progress) {
  UnitsDone done;
  const auto order = schedule_order(units, sink);
  done.skipped = static_cast<int64_t>(units.size() - order.size());
  const PublishFinishedUnits keep_finished_units(sink);
  for (size_t i : order) {
    throw_if_stop_requested();
    // Recorded, then written whole: a unit stopped or failing half-way writes nothing, so the
    // units before it can be published without it (ResultSink::publish_completed).
    RecordingSink records;
    run_unit_work(units[i], records);
    records.replay(sink);
    sink.mark_complete(units[i].path);
    done.ran.push_back(i);
    if (progress)
      progress(static_cast<int64_t>(done.ran.size()), static_cast<int64_t>(order.size()));
  }
  throw_if_stop_requested();  // a request during the last unit: the caller ends here too
  return done;
}

SerialUnitRunner& serial_runner() {
  static SerialUnitRunner runner;
  return runner;
}

void RecordingSink::mark_complete(const std::string& unit) {
  require(false, "unit " + unit, "marked complete by its runner", "marked by its own work");
}

void RecordingSink::write(const std::string& path, const Matrix<double>& data,
                          const std::string& meaning) {
  records.emplace_back(Dataset{path, meaning, data});
}

void RecordingSink::write(const std::string& path, const std::vector<double>& data,
                          const std::string& meaning) {
  records.emplace_back(Dataset{path, meaning, data});
}

void RecordingSink::write(const std::string& path, const std::vector<int64_t>& data,
                          const std::string& meaning) {
  records.emplace_back(Dataset{path, meaning, data});
}

void RecordingSink::write(const std::string& path, const IndexMatrix& data,
                          const std::string& meaning) {
  records.emplace_back(Dataset{path, meaning, data});
}

void RecordingSink::set_attribute(const std::string& object, const std::string& name,
                                  const std::string& value) {
  records.emplace_back(Attribute{object, name, value});
}

void RecordingSink::set_attribute(const std::string& object, const std::string& name,
                                  double value) {
  records.emplace_back(Attribute{object, name, value});
}

std::optional<Matrix<double>> RecordingSink::read(const std::string&) const {
  return std::nullopt;
}

void RecordingSink::replay(ResultSink& sink) const {
  for (const auto& record : records) {
    if (const auto* d = std::get_if<Dataset>(&record)) {
      std::visit([&](const auto& data) { sink.write(d->path, data, d->meaning); }, d->data);
    } else {
      const auto& a = std::get<Attribute>(record);
      std::visit([&](const auto& value) { sink.set_attribute(a.object, a.name, value); },
                 a.value);
    }
  }
}

LayerCache::LayerCache(LayerLoader load)
    : loads_([load = std::move(load)](const std::pair<int64_t, int64_t>& layer_T) {
        return load(layer_T.first, layer_T.second);
      }) {}

std::shared_ptr<const AttentionInputs<double>> LayerCache::get(int64_t layer, int64_t T) {
  return loads_.get({layer, T});
}

InOrderWriter::InOrderWriter(const std::vector<StudyUnit>& units, std::vector<size_t> order,
                             ResultSink& sink, const Progress& progress, UnitsDone& done)
    : units_(units), order_(std::move(order)), sink_(sink), progress_(progress), done_(done),
      keep_finished_units_(sink) {}

void InOrderWriter::hold(size_t unit, RecordingSink records) {
  held_.emplace(unit, std::move(records));
}

bool InOrderWriter::write_ready() {
  std::vector<std::string> batch;
  size_t end = next_;
  for (; end < order_.size() && held_.count(order_[end]); ++end) {
    held_.at(order_[end]).replay(sink_);
    held_.erase(order_[end]);
    batch.push_back(units_[order_[end]].path);
    // The run's first unit is marked alone, before the units ready with it are written: its
    // completion publishes at once (io::ResultsWriterSink), so a disk that fills while they are
    // written keeps it, as the serial runner keeps it.
    if (end == 0) {
      sink_.mark_complete_all(batch);
      batch.clear();
    }
  }
  if (end == next_) return false;
  if (!batch.empty()) sink_.mark_complete_all(batch);
  done_.ran.insert(done_.ran.end(), order_.begin() + static_cast<std::ptrdiff_t>(next_),
                   order_.begin() + static_cast<std::ptrdiff_t>(end));
  next_ = end;
  if (progress_)
    progress_(static_cast<int64_t>(next_), static_cast<int64_t>(order_.size()));
  return true;
}

ThreadedUnitRunner::ThreadedUnitRunner(int jobs, int threads) : jobs_(jobs), threads_(threads) {
  require(jobs >= 1, "--jobs", "units at once >= 1", std::to_string(jobs));
  require(threads >= 1, "OpenMP threads", ">= 1", std::to_string(threads));
}

namespace {

// The run's stop flag (the reference's StopScope in each worker reads it): the signal number of
// a stop request, or kRunAbandoned once the run ended without a stop (a unit or a write failed).

// What the workers of one ThreadedUnitRunner::run share (under `mutex`, but for `stop`).
struct Workbench {
  explicit Workbench(size_t units) : taken(units, false), take_below(units) {}
  std::atomic<int> stop{0};
  std::mutex mutex;
  std::condition_variable changed;  // a unit finished, or a unit was written, or the run ended
  std::vector<bool> taken;          // by position in schedule order
  size_t first_untaken = 0;         // positions below it are all taken
  size_t take_below;                // positions at or past it are not taken (a unit failed there)
  size_t written = 0;               // positions below it are written
  bool ended = false;               // take no more units (stop, a write failed, or done)
  std::map<std::string, int> reading;  // StudyUnit::input -> units in flight that read it (> 0)
  // Finished units by position: their records, or their error.
  std::map<size_t, UnitResult> finished;
};

// The position to take next, with bench.mutex held and first_untaken < end: the first untaken
// position below `end` whose unit's input no unit in flight reads (it would wait for their
// load), else first_untaken. Positions are taken out of order, so a failed unit leaves untaken
// ones before it: they still run (take_below), to be written before its error is reported.
size_t choose_position(const std::vector<StudyUnit>& units, const std::vector<size_t>& order,
                       size_t end, const Workbench& bench) {
  for (size_t p = bench.first_untaken; p < end; ++p) {
    if (bench.taken[p]) continue;
    const std::string& input = units[order[p]].input;
    if (input.empty() || bench.reading.count(input) == 0) return p;
  }
  return bench.first_untaken;
}

// Marks `position` taken (and its input read), with bench.mutex held.
void take(const StudyUnit& unit, size_t position, Workbench& bench) {
  bench.taken[position] = true;
  while (bench.first_untaken < bench.taken.size() && bench.taken[bench.first_untaken])
    ++bench.first_untaken;
  if (!unit.input.empty()) ++bench.reading[unit.input];
}

// A worker: takes a unit (choose_position, at most `ahead` positions past the first unwritten
// one), records it and hands it back, until none is left or the run ended.
void work_units(const std::vector<StudyUnit>& units, const std::vector<size_t>& order,
                size_t ahead, int threads_per_unit, Workbench& bench) {
  omp_set_num_threads(threads_per_unit);  // this thread's own team (libgomp)
  for (;;) {
    size_t position = 0;
    {
      std::unique_lock<std::mutex> lock(bench.mutex);
      bench.changed.wait(lock, [&] {
        return bench.ended || bench.first_untaken >= bench.take_below ||
               bench.first_untaken < bench.written + ahead;
      });
      if (bench.ended || bench.first_untaken >= bench.take_below) return;
      position = choose_position(units, order, std::min(bench.take_below, bench.written + ahead),
                                 bench);
      take(units[order[position]], position, bench);
    }
    UnitResult result = record_unit(units[order[position]], &bench.stop);
    {
      const std::lock_guard<std::mutex> lock(bench.mutex);
      const std::string& input = units[order[position]].input;
      if (!input.empty() && --bench.reading[input] == 0) bench.reading.erase(input);
      if (std::holds_alternative<std::exception_ptr>(result))  // the units after it are not
        bench.take_below = std::min(bench.take_below, position);  // needed; those before run on
      bench.finished.emplace(position, std::move(result));
    }
    bench.changed.notify_all();
  }
}

// Joins the workers when the run ends however it ends (they reference the unit list).
struct Workers {
  Workbench& bench;
  std::vector<std::thread> threads;
  ~Workers() {
    {
      const std::lock_guard<std::mutex> lock(bench.mutex);
      bench.ended = true;
    }
    bench.changed.notify_all();
    for (auto& thread : threads) thread.join();
  }
};

}  // namespace

UnitsDone ThreadedUnitRunner::run_units(const std::vector<StudyUnit>& units, ResultSink& sink,
                                        const Progress& progress) {
  UnitsDone done;
  InOrderWriter writer(units, schedule_order(units, sink), sink, progress, done);
  const std::vector<size_t>& order = writer.order();
  done.skipped = static_cast<int64_t>(units.size() - order.size());
  const size_t jobs = std::min(static_cast<size_t>(jobs_), order.size());
  const int threads_per_unit = std::max(1, threads_ / std::max<int>(1, static_cast<int>(jobs)));
  Workbench bench(order.size());
  Workers workers{bench, {}};
  for (size_t j = 0; j < jobs; ++j)
    workers.threads.emplace_back(work_units, std::cref(units), std::cref(order), 4 * jobs,
                                 threads_per_unit, std::ref(bench));
  while (!writer.all_written()) {
    std::vector<std::pair<size_t, RecordingSink>> ready;  // the next positions, finished
    std::exception_ptr failure;                           // the first unit not written fails
    {
      std::unique_lock<std::mutex> lock(bench.mutex);
      // A signal cannot wake the condition variable: the stop flag is read every 20 ms.
      bench.changed.wait_for(lock, std::chrono::milliseconds(20),
                             [&] { return bench.finished.count(writer.written()) > 0; });
      for (size_t p = writer.written(); bench.finished.count(p); ++p) {
        auto& result = bench.finished.at(p);
        if (const auto* error = std::get_if<std::exception_ptr>(&result)) {
          failure = *error;
          break;
        }
        ready.emplace_back(p, std::move(std::get<RecordingSink>(result)));
        bench.finished.erase(p);
      }
    }
    if (const int signal = stop_requested()) {
      bench.stop.store(signal);  // the units in flight end at their next safe point
      throw Interrupted(signal);  // nothing is written after a stop
    }
    for (auto& [position, records] : ready) writer.hold(order[position], std::move(records));
    try {
      writer.write_ready();
    } catch (...) {
      bench.stop.store(kRunAbandoned);
      throw;
    }
    {
      const std::lock_guard<std::mutex> lock(bench.mutex);
      bench.written = writer.written();
    }
    bench.changed.notify_all();
    if (failure) {
      bench.stop.store(kRunAbandoned);  // the units after the failed one are not written
      std::rethrow_exception(failure);
    }
  }
  throw_if_stop_requested();  // a request during the last units: the caller ends here too
  return done;
}

}  // namespace hils::analysis
