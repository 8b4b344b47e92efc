#include "hils/analysis/units.hpp"

#include <algorithm>
#include <atomic>

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

void run_unit_work(const StudyUnit& unit, ResultSink& sink) {
  const StopScope stop_inside_the_reference(&g_stop_signal);
  try {
    unit.work(sink);
  } catch (const Stopped& stopped) {
    throw Interrupted(stopped.value);  // the flag holds the signal number
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

UnitsDone SerialUnitRunner::run(const std::vector<StudyUnit>& units, ResultSink& sink,
                                const Progress& progress) {
  UnitsDone done;
  const auto order = schedule_order(units, sink);
  done.skipped = static_cast<int64_t>(units.size() - order.size());
  for (size_t i : order) {
    throw_if_stop_requested();
    run_unit_work(units[i], sink);
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

const AttentionInputs<double>& LayerCache::get(int64_t layer, int64_t T) {
  if (layer != layer_ || T != T_) {
    inputs_ = {};  // free the previous layer before loading the next
    inputs_ = load_(layer, T);
    layer_ = layer, T_ = T;
  }
  return inputs_;
}

}  // namespace hils::analysis
