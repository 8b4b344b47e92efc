// The unit runners (analysis/include/hils/analysis/units.hpp): ThreadedUnitRunner writes what
// SerialUnitRunner writes, in the same order, whatever order its units finish in; the first
// failing unit in schedule order ends the run with the units before it complete and none after;
// a stop request ends it promptly at the units written. Units here are small lambdas that wait
// for one another (Latch), so that a later unit finishes first on every run, not by chance.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>

#include "hils/analysis/units.hpp"
#include "hils/threads.hpp"

using namespace hils;
using namespace hils::analysis;
using Clock = std::chrono::steady_clock;

namespace {

// A MemorySink that also lists every write and mark in the order they came. Runners that mark
// several units complete at once (ResultSink::mark_complete_all, one checkpoint) mark them after
// their writes: compare the writes' order and the marks' order (MemorySink::completed).
class LogSink final : public MemorySink {
 public:
  using MemorySink::write;
  void write(const std::string& path, const std::vector<double>& values,
             const std::string& meaning) override {
    MemorySink::write(path, values, meaning);
    log.push_back("write " + path);
  }
  void mark_complete(const std::string& unit) override {
    MemorySink::mark_complete(unit);
    log.push_back("complete " + unit);
  }
  std::vector<std::string> log;
};

// Units that finished, for units that wait for a later one (bounded: a runner that does not
// run them at once makes the wait time out, not hang).
class Finished {
 public:
  void add(const std::string& unit) {
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      done_.insert(unit);
    }
    changed_.notify_all();
  }
  bool wait_for(const std::string& unit, std::chrono::milliseconds bound) {
    std::unique_lock<std::mutex> lock(mutex_);
    return changed_.wait_for(lock, bound, [&] { return done_.count(unit) > 0; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::set<std::string> done_;
};

// The most units of one input (StudyUnit::input) seen running at once.
class InputsInFlight {
 public:
  void enter(const std::string& input) {
    const std::lock_guard<std::mutex> lock(mutex_);
    most_[input] = std::max(most_[input], ++now_[input]);
  }
  void leave(const std::string& input) {
    const std::lock_guard<std::mutex> lock(mutex_);
    --now_[input];
  }
  int most(const std::string& input) {
    const std::lock_guard<std::mutex> lock(mutex_);
    return most_[input];
  }

 private:
  std::mutex mutex_;
  std::map<std::string, int> now_, most_;
};

// `count` units "u0".. of decreasing cost (schedule order = list order); each writes two
// datasets. A unit of `waits` {i, j} finishes (or fails) only after unit j has.
struct UnitPlan {
  int count = 6;
  std::vector<std::pair<int, int>> waits;
  int fails = -1;  // throws (after its wait) with "unit uN failed"
  std::vector<std::string> inputs;  // StudyUnit::input of u0.. (none if empty)
};

std::vector<StudyUnit> make_units(const UnitPlan& plan, Finished& finished,
                                  InputsInFlight* in_flight = nullptr) {
  std::vector<StudyUnit> units;
  for (int i = 0; i < plan.count; ++i) {
    const std::string path = "u" + std::to_string(i);
    const std::string input = plan.inputs.empty() ? "" : plan.inputs.at(i);
    units.push_back({path, static_cast<double>(plan.count - i),
                     [=, &finished](ResultSink& s) {
                       if (in_flight) in_flight->enter(input);
                       finished.add("started " + path);
                       for (const auto& [unit, after] : plan.waits)
                         if (i == unit)
                           finished.wait_for("u" + std::to_string(after),
                                             std::chrono::milliseconds(3000));
                       if (in_flight) in_flight->leave(input);
                       if (i == plan.fails) {
                         finished.add(path);
                         throw std::runtime_error("unit " + path + " failed");
                       }
                       s.write(path + "/a", std::vector<double>{1.0 * i}, "a");
                       s.write(path + "/b", std::vector<double>{2.0 * i}, "b");
                       finished.add(path);
                     },
                     input});
  }
  return units;
}

std::vector<std::string> writes(const std::vector<std::string>& log) {
  std::vector<std::string> out;
  for (const auto& event : log)
    if (event.rfind("write ", 0) == 0) out.push_back(event);
  return out;
}

std::vector<std::string> serial_log(const UnitPlan& plan) {
  Finished finished;
  UnitPlan no_wait = plan;
  no_wait.waits.clear();
  LogSink sink;
  serial_runner().run(make_units(no_wait, finished), sink, {});
  return sink.log;
}

}  // namespace

TEST_CASE("threaded runner: the serial runner's writes in schedule order, whatever finishes first",
          "[units]") {
  // u0 (first in schedule order) finishes only after u1 (and u3 after u5): a runner writing in
  // completion order would write u1 first.
  for (int jobs : {2, 3, 8}) {  // 8 > the 6 units
    UnitPlan plan;
    plan.waits = {{0, 1}};
    Finished finished;
    LogSink sink;
    std::vector<int64_t> progress_seen;
    const auto units = make_units(plan, finished);
    ThreadedUnitRunner runner(jobs, 2);
    const auto done =
        runner.run(units, sink, [&](int64_t n, int64_t) { progress_seen.push_back(n); });
    INFO("jobs " << jobs);
    CHECK(writes(sink.log) == writes(serial_log(plan)));
    CHECK(done.ran == std::vector<size_t>{0, 1, 2, 3, 4, 5});
    CHECK(sink.completed == std::vector<std::string>{"u0", "u1", "u2", "u3", "u4", "u5"});
    REQUIRE(!progress_seen.empty());
    CHECK(progress_seen.back() == 6);
  }
}

// A MemorySink that lists each mark_complete_all call's units (one publication each).
class BatchSink final : public MemorySink {
 public:
  void mark_complete_all(const std::vector<std::string>& units) override {
    MemorySink::mark_complete_all(units);
    batches.push_back(units);
  }
  std::vector<std::vector<std::string>> batches;
};

TEST_CASE("in-order writer: the run's first unit is published alone, later ready units together",
          "[units]") {
  // With several units in flight the first two often finish together; marked as one batch, a
  // disk that filled while the second was written lost the first too ("nothing was published";
  // test_cli_interrupt's full-disk study, 5 of 12 runs at --jobs 2 on 2 cores).
  std::vector<StudyUnit> units;
  for (const char* path : {"u0", "u1", "u2", "u3"}) units.push_back({path, 1.0, {}, ""});
  BatchSink sink;
  UnitsDone done;
  const Progress no_progress;
  InOrderWriter writer(units, {0, 1, 2, 3}, sink, no_progress, done);
  CHECK_FALSE(writer.write_ready());
  writer.hold(1, RecordingSink{});
  CHECK_FALSE(writer.write_ready());  // u0's turn first
  writer.hold(0, RecordingSink{});
  CHECK(writer.write_ready());
  writer.hold(3, RecordingSink{});
  writer.hold(2, RecordingSink{});
  CHECK(writer.write_ready());
  using Batches = std::vector<std::vector<std::string>>;
  CHECK(sink.batches == Batches{{"u0"}, {"u1"}, {"u2", "u3"}});
  CHECK(done.ran == std::vector<size_t>{0, 1, 2, 3});
  CHECK(writer.all_written());
}

TEST_CASE("threaded runner: complete units are skipped, the rest run in schedule order",
          "[units]") {
  Finished finished;
  LogSink sink;
  sink.mark_complete("u2");
  sink.log.clear();
  const auto done = ThreadedUnitRunner(3, 1).run(make_units({}, finished), sink, {});
  CHECK(done.skipped == 1);
  CHECK(done.ran == std::vector<size_t>{0, 1, 3, 4, 5});
}

TEST_CASE("threaded runner: the first failing unit ends the run as in the serial runner",
          "[units]") {
  // u3 fails; u0 finishes only after it (so u0..u2 reach the writer with the failure) and,
  // with 3 at once, u3 fails only after u4 has finished: u0..u2 are written and complete, u4
  // and u5 not.
  for (int jobs : {2, 3}) {
    UnitPlan plan;
    plan.fails = 3;
    plan.waits = {{0, 3}};
    if (jobs == 3) plan.waits.push_back({3, 4});
    Finished finished;
    LogSink sink;
    std::string error;
    try {
      ThreadedUnitRunner(jobs, 1).run(make_units(plan, finished), sink, {});
    } catch (const std::runtime_error& e) {
      error = e.what();
    }
    INFO("jobs " << jobs);
    CHECK(error == "unit u3 failed");
    if (jobs == 3) CHECK(finished.wait_for("u4", std::chrono::milliseconds(0)));  // dropped
    std::string serial_error;
    LogSink serial;
    try {
      Finished unused;
      serial_runner().run(make_units({6, {}, 3}, unused), serial, {});
    } catch (const std::runtime_error& e) {
      serial_error = e.what();
    }
    CHECK(error == serial_error);
    CHECK(writes(sink.log) == writes(serial.log));
    CHECK(sink.completed == serial.completed);
    CHECK(sink.completed == std::vector<std::string>{"u0", "u1", "u2"});
  }
}

TEST_CASE("threaded runner: a stop request ends the run promptly at the units written",
          "[units]") {
  // u2 asks to stop (as the signal handler does), then runs on, as the reference does, until
  // the flag of its thread's StopScope says stop (hils/threads.hpp); u3.. would take 10 s each
  // unless told so too. u1 finishes just after the request, without a safe point: it must not
  // be written. The run ends within a bound, at whole units that come first in schedule order.
  clear_stop_request();
  std::atomic<bool> requested{false};
  auto reference_like = [](std::chrono::seconds length) {
    const auto end = Clock::now() + length;
    while (Clock::now() < end) {
      const std::atomic<int>* flag = hils::detail::stop_flag();
      if (flag && flag->load() != 0) throw Stopped(flag->load());
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  };
  std::vector<StudyUnit> units;
  for (int i = 0; i < 8; ++i) {
    const std::string path = "u" + std::to_string(i);
    units.push_back({path, 8.0 - i, [i, path, &requested, reference_like](ResultSink& s) {
                       if (i == 1)
                         while (!requested) std::this_thread::sleep_for(std::chrono::milliseconds(1));
                       if (i == 2) {
                         request_stop(SIGINT);
                         requested = true;
                       }
                       if (i >= 2) reference_like(std::chrono::seconds(10));
                       s.write(path + "/a", std::vector<double>{1.0 * i}, "a");
                     }});
  }
  LogSink sink;
  const auto start = Clock::now();
  int signal = 0;
  try {
    ThreadedUnitRunner(3, 1).run(units, sink, {});
  } catch (const Interrupted& e) {
    signal = e.signal_number;
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  clear_stop_request();
  CHECK(requested);
  CHECK(signal == SIGINT);
  CHECK(seconds < 2.0);
  // Whole units, a prefix of the schedule, u1 (finished after the request) not among them.
  REQUIRE(sink.completed.size() <= 1);
  for (size_t i = 0; i < sink.completed.size(); ++i) {
    CHECK(sink.completed[i] == "u" + std::to_string(i));
    CHECK(writes(sink.log).at(i) == "write u" + std::to_string(i) + "/a");
  }
  CHECK(sink.log.size() == 2 * sink.completed.size());  // no write of a unit not complete
}

TEST_CASE("threaded runner: a unit waits while another unit of its input runs, if another can start",
          "[units]") {
  // u0 and u1 read input a (as a layer's two KV groups read one loaded layer): u0 runs until
  // u2 has finished, so a runner taking units in plain schedule order starts u1 beside it (and
  // u1 would wait for u0's load). u3 runs until u0 has finished: no unit is left to take while
  // u0 runs but u1.
  UnitPlan plan;
  plan.count = 4;
  plan.inputs = {"a", "a", "b", "c"};
  plan.waits = {{0, 2}, {3, 0}};
  Finished finished;
  InputsInFlight in_flight;
  LogSink sink;
  const auto done = ThreadedUnitRunner(2, 1).run(make_units(plan, finished, &in_flight), sink, {});
  CHECK(in_flight.most("a") == 1);
  CHECK(writes(sink.log) == writes(serial_log(plan)));  // written in schedule order all the same
  CHECK(done.ran == std::vector<size_t>{0, 1, 2, 3});
}

TEST_CASE("threaded runner: units of one input run at once when nothing else can start",
          "[units]") {
  // Every unit reads input a (hils run on one layer): u0 runs until u1 has started, which must
  // not wait for u0 (the wait would time out after 3 s).
  UnitPlan plan;
  plan.count = 3;
  plan.inputs = {"a", "a", "a"};
  Finished finished;
  auto units = make_units(plan, finished);
  auto u0 = units[0].work;
  bool u1_started = false;
  units[0].work = [&](ResultSink& s) {
    u1_started = finished.wait_for("started u1", std::chrono::milliseconds(3000));
    u0(s);
  };
  LogSink sink;
  ThreadedUnitRunner(2, 1).run(units, sink, {});
  CHECK(u1_started);
  CHECK(writes(sink.log) == writes(serial_log(plan)));
}

TEST_CASE("threaded runner: a failing unit taken before an earlier one still ends the run after it",
          "[units]") {
  // u1 waits for u0's input, so u2 (input b) is taken before u1 and fails while u0 runs: u1
  // must still run and be written, then u2's error ends the run, as in the serial runner.
  UnitPlan plan;
  plan.count = 4;
  plan.inputs = {"a", "a", "b", "c"};
  plan.waits = {{0, 2}};
  plan.fails = 2;
  Finished finished;
  LogSink sink;
  std::string error;
  try {
    ThreadedUnitRunner(2, 1).run(make_units(plan, finished), sink, {});
  } catch (const std::runtime_error& e) {
    error = e.what();
  }
  CHECK(error == "unit u2 failed");
  CHECK(sink.completed == std::vector<std::string>{"u0", "u1"});
  CHECK(writes(sink.log) == std::vector<std::string>{"write u0/a", "write u0/b", "write u1/a",
                                                     "write u1/b"});
}

TEST_CASE("threaded runner: up to 4 x jobs units are taken past the first unwritten one",
          "[units]") {
  // 2 at once: while u0 runs, the other worker may take u1..u7 (8 = 4 x 2 positions from u0),
  // not u8. u0 runs until u7 has finished (a smaller limit times that out after 3 s), then
  // 200 ms more, in which a larger limit (or none) starts u8.
  UnitPlan plan;
  plan.count = 10;
  plan.waits = {{0, 7}};
  Finished finished;
  auto units = make_units(plan, finished);
  bool u8_beside_u0 = true;
  auto u0 = units[0].work;
  units[0].work = [&](ResultSink& s) {
    u0(s);
    u8_beside_u0 = finished.wait_for("started u8", std::chrono::milliseconds(200));
  };
  LogSink sink;
  const auto start = Clock::now();
  ThreadedUnitRunner(2, 1).run(units, sink, {});
  CHECK(std::chrono::duration<double>(Clock::now() - start).count() < 2.0);  // no 3 s wait
  CHECK_FALSE(u8_beside_u0);
  CHECK(writes(sink.log) == writes(serial_log(plan)));
}

TEST_CASE("shared loads: one load per key for the units that use it at once", "[units]") {
  std::atomic<int> loads{0};
  SharedLoads<int, std::vector<int>> cache([&loads](const int& key) {
    ++loads;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    return std::vector<int>(3, key);
  });
  std::vector<std::thread> threads;
  std::vector<int> seen(4, -1);
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] { seen[t] = cache.get(7)->at(0); });
  for (auto& thread : threads) thread.join();
  CHECK(loads == 1);
  CHECK(seen == std::vector<int>(4, 7));
  // Unused values are dropped before the next load; a held one stays.
  const auto held = cache.get(7);
  cache.get(8);
  CHECK(loads == 2);
  cache.get(7);
  CHECK(loads == 2);  // still held above: not loaded again
}
