#include "parallel/mpi_runner.hpp"

#include <mpi.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <variant>

#include "parallel/record_codec.hpp"
#include "parallel/session.hpp"

namespace hils::parallel {

namespace {

using analysis::RecordingSink;
using analysis::StudyUnit;

// Message kinds. Worker -> rank 0: "give me a unit", carrying the finished unit's records when
// there is one.
constexpr int kReady = 1;
// Rank 0 -> worker: the index of the next unit, or kNoMoreUnits / kJobFailed: this run() call is
// over (sent only once every unit is written or the run failed, see coordinate()).
constexpr int kAssign = 2;
// Worker -> rank 0: [uint64 unit index][char kBadInput or kOtherFailure] then the message.
constexpr int kFailure = 3;
// Worker -> rank 0, once, as the worker's command ends (done, failed, or told that the run
// failed): [int exit status] then its error message (none when done). Outside every run's tags (tag() stays below 32000; MPI
// guarantees tags up to 32767).
constexpr int kGoodbye = 32000;

// The tag of a kind in the `call`-th run() (every rank makes the same calls): a worker that
// already went on to the next call must not be taken for one still in this call.
int tag(int kind, int64_t call) { return kind + 4 * static_cast<int>(call % 8000); }
// The kAssign tag that answers a worker's kReady or kFailure message of the same run() call.
int answer_tag(int request_tag) { return request_tag - request_tag % 4 + kAssign; }
constexpr int64_t kNoMoreUnits = -1, kJobFailed = -2;
// Rank 0 -> a worker that still computes other units (--jobs > 1): no unit for this request,
// none will come; return the ones in flight (the last return is answered with the verdict).
constexpr int64_t kNoneLeft = -3;
// kInterrupted: the worker was asked to stop (a signal, analysis::Interrupted); the message is
// the signal's number.
constexpr char kBadInput = 'B', kOtherFailure = 'E', kInterrupted = 'I';
constexpr int kBadInputExit = 2;  // hils's exit status for bad input (README, "Exit codes")

std::vector<char> receive_bytes(const MPI_Status& probed) {
  int count = 0;
  MPI_Get_count(&probed, MPI_CHAR, &count);
  std::vector<char> bytes(static_cast<size_t>(count));
  MPI_Recv(bytes.data(), count, MPI_CHAR, probed.MPI_SOURCE, probed.MPI_TAG, MPI_COMM_WORLD,
           MPI_STATUS_IGNORE);
  return bytes;
}

void send_bytes(const std::vector<char>& bytes, int message_tag) {
  MPI_Send(bytes.data(), static_cast<int>(bytes.size()), MPI_CHAR, 0, message_tag,
           MPI_COMM_WORLD);
}

// A worker's failure as rank 0 reports it; `order` is the unit's place in schedule order.
struct Failure {
  size_t order = 0;
  size_t unit = 0;  // its index in the unit list
  bool bad_input = false;
  int interrupted = 0;  // the signal that stopped the worker: not a failure, a stop
  std::string message;
};

Failure decode_failure(const std::vector<char>& bytes, int worker,
                       const std::vector<StudyUnit>& units, const std::vector<size_t>& pending) {
  uint64_t unit = 0;
  std::memcpy(&unit, bytes.data(), sizeof unit);
  Failure failure;
  failure.bad_input = bytes.at(sizeof unit) == kBadInput;
  if (bytes.at(sizeof unit) == kInterrupted)
    failure.interrupted = std::stoi(std::string(bytes.begin() + sizeof unit + 1, bytes.end()));
  failure.unit = static_cast<size_t>(unit);
  failure.order = static_cast<size_t>(
      std::find(pending.begin(), pending.end(), static_cast<size_t>(unit)) - pending.begin());
  failure.message = "rank " + std::to_string(worker) + " failed on unit " +
                    (unit < units.size() ? units[unit].path : "?") + ": " +
                    std::string(bytes.begin() + sizeof unit + 1, bytes.end());
  return failure;
}


// Which unit rank 0 gives a worker that asks: the largest-first order, but layer-aware as one
// process takes (ThreadedUnitRunner), across ranks. Within a window of 2 x (workers x --jobs)
// positions past the first one not handed out, the first unit of, in this preference:
//   0. an input the worker holds and no unit of its in flight reads (its layer is loaded: the
//      other KV group of the layer it just finished; no load at all);
//   1. an input no worker holds (one load, as one process would; units with no input too);
//   2. an input the worker's units in flight read (it waits for that load, in its process);
//   3. an input another worker holds (loaded again here: the cost one unit per rank had).
// Outside the window, or with every candidate worse, the first unit not handed out, so the
// largest units still go first (the window spans units of about equal cost: a layer's KV
// groups and neighbouring layers). What a worker holds is modelled on its LayerCache
// (analysis::SharedLoads): a new load drops every input no unit in flight reads.
class HandOut {
 public:
  HandOut(const std::vector<StudyUnit>& units, const std::vector<size_t>& order, int workers,
          size_t window)
      : units_(units), order_(order), window_(std::max<size_t>(1, window)),
        taken_(order.size(), false), limit_(order.size()),
        workers_(static_cast<size_t>(workers) + 1) {}
  // The unit (index into units) to give `worker`, marked handed out; nullopt: none left below
  // the limit.
  std::optional<size_t> next_for(int worker) {
    if (first_untaken_ >= limit_) return std::nullopt;
    const size_t end = std::min(limit_, first_untaken_ + window_);
    size_t best = first_untaken_;
    int best_rank = 4;
    for (size_t p = first_untaken_; p < end && best_rank > 0; ++p) {
      if (taken_[p]) continue;
      const int rank = preference(worker, units_[order_[p]].input);
      if (rank < best_rank) best = p, best_rank = rank;
    }
    take(worker, best);
    return order_[best];
  }
  // `worker` returned `unit` (finished or failed).
  void returned(int worker, size_t unit) {
    Worker& w = workers_.at(static_cast<size_t>(worker));
    const std::string& input = units_[unit].input;
    if (!input.empty() && --w.reading[input] == 0) w.reading.erase(input);
    --w.in_flight;
  }
  // Units at or past `position` are no longer handed out (a unit failed there; 0: all stop).
  // Those before it still are, to be written before the failure is reported.
  void limit_below(size_t position) { limit_ = std::min(limit_, position); }
  size_t in_flight(int worker) const { return workers_.at(static_cast<size_t>(worker)).in_flight; }

 private:
  struct Worker {
    std::map<std::string, int> reading;  // inputs of its units in flight -> how many
    std::set<std::string> held;          // inputs its LayerCache holds (modelled)
    size_t in_flight = 0;
  };
  int preference(int worker, const std::string& input) const {
    if (input.empty()) return 1;
    const Worker& w = workers_[static_cast<size_t>(worker)];
    const bool held = w.held.count(input) > 0, read = w.reading.count(input) > 0;
    if (held && !read) return 0;
    const auto holders = holders_.find(input);
    if (holders == holders_.end()) return 1;
    return held ? 2 : 3;
  }
  void take(int worker, size_t position) {
    taken_[position] = true;
    while (first_untaken_ < taken_.size() && taken_[first_untaken_]) ++first_untaken_;
    Worker& w = workers_.at(static_cast<size_t>(worker));
    ++w.in_flight;
    const std::string& input = units_[order_[position]].input;
    if (input.empty()) return;
    if (!w.held.count(input)) {  // a load: the cache drops what no unit in flight reads
      for (auto it = w.held.begin(); it != w.held.end();) {
        if (w.reading.count(*it)) {
          ++it;
          continue;
        }
        if (--holders_[*it] == 0) holders_.erase(*it);
        it = w.held.erase(it);
      }
      w.held.insert(input);
      ++holders_[input];
    }
    ++w.reading[input];
  }
  const std::vector<StudyUnit>& units_;
  const std::vector<size_t>& order_;
  size_t window_;
  std::vector<bool> taken_;  // by position in order_
  size_t first_untaken_ = 0;
  size_t limit_;
  std::vector<Worker> workers_;        // by rank (0 unused)
  std::map<std::string, int> holders_;  // input -> workers holding it
};

// A worker rank's units in flight (--jobs N): N threads, each running the units rank 0 assigns
// with an OpenMP team of its own (as ThreadedUnitRunner's threads; units of one layer share its
// load through the study's LayerCache), their results queued for the rank's main thread, the
// only one that calls MPI (MPI_THREAD_FUNNELED).
class UnitThreads {
 public:
  struct Finished {
    size_t unit = 0;
    analysis::UnitResult result;
  };
  UnitThreads(const std::vector<StudyUnit>& units, int jobs, int threads_per_unit)
      : units_(units) {
    for (int j = 0; j < jobs; ++j)
      threads_.emplace_back([this, threads_per_unit] { serve(threads_per_unit); });
  }
  // The units in flight stop at their next safe point (the reference's) and are dropped.
  ~UnitThreads() {
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      ended_ = true;
      int none = 0;
      stop_.compare_exchange_strong(none, analysis::kRunAbandoned);
    }
    changed_.notify_all();
    for (auto& thread : threads_) thread.join();
  }
  UnitThreads(const UnitThreads&) = delete;
  UnitThreads& operator=(const UnitThreads&) = delete;

  void start(size_t unit) {
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      assigned_.push_back(unit);
      ++in_flight_;
    }
    changed_.notify_all();
  }
  size_t in_flight() const {
    const std::lock_guard<std::mutex> lock(mutex_);
    return in_flight_;
  }
  // A finished unit; with `wait`, waits for one (a unit must be in flight), else nullopt when
  // none has finished. A stop request (a signal to this rank) is passed on to the units in
  // flight, which end at their next safe point (a signal cannot wake the wait: polled).
  std::optional<Finished> take_finished(bool wait) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (wait && in_flight_ == 0)
      throw std::logic_error("MPI worker: waits for a unit with none in flight");
    while (wait && finished_.empty()) {
      changed_.wait_for(lock, std::chrono::milliseconds(20));
      if (const int signal = analysis::stop_requested()) {
        int none = 0;
        stop_.compare_exchange_strong(none, signal);
      }
    }
    if (finished_.empty()) return std::nullopt;
    Finished done = std::move(finished_.front());
    finished_.pop_front();
    --in_flight_;
    return done;
  }

 private:
  void serve(int threads_per_unit) {
    omp_set_num_threads(threads_per_unit);  // this thread's own team (libgomp)
    for (;;) {
      size_t unit = 0;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        changed_.wait(lock, [&] { return ended_ || !assigned_.empty(); });
        if (ended_) return;
        unit = assigned_.front();
        assigned_.pop_front();
      }
      Finished done{unit, analysis::record_unit(units_.at(unit), &stop_)};
      {
        const std::lock_guard<std::mutex> lock(mutex_);
        finished_.push_back(std::move(done));
      }
      changed_.notify_all();
    }
  }
  const std::vector<StudyUnit>& units_;
  std::atomic<int> stop_{0};  // what the units' reference reads: a signal, or kRunAbandoned
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<size_t> assigned_;
  std::deque<Finished> finished_;
  size_t in_flight_ = 0;  // assigned and not yet taken back
  bool ended_ = false;
  std::vector<std::thread> threads_;
};

// The message that returns a unit to rank 0: kReady with its records, or kFailure.
std::pair<int, std::vector<char>> return_message(UnitThreads::Finished& finished) {
  if (auto* records = std::get_if<RecordingSink>(&finished.result))
    return {kReady, encode_unit(finished.unit, *records)};
  std::vector<char> failure(sizeof(uint64_t));
  const uint64_t unit = finished.unit;
  std::memcpy(failure.data(), &unit, sizeof unit);
  std::string message;
  char kind = kOtherFailure;
  try {
    std::rethrow_exception(std::get<std::exception_ptr>(finished.result));
  } catch (const analysis::Interrupted& interrupted) {
    kind = kInterrupted;
    message = std::to_string(interrupted.signal_number);
  } catch (const InvalidArgument& e) {
    kind = kBadInput;
    message = e.what();
  } catch (const std::exception& e) {
    message = e.what();
  } catch (...) {
    message = "unknown error";
  }
  failure.push_back(kind);
  failure.insert(failure.end(), message.begin(), message.end());
  return {kFailure, std::move(failure)};
}

}  // namespace

analysis::UnitsDone MpiUnitRunner::run_units(const std::vector<StudyUnit>& units,
                                             analysis::ResultSink& sink,
                                             const analysis::Progress& progress) {
  ++calls_;
  if (rank_ == 0) return coordinate(units, sink, progress);
  work(units);
  return {};
}

analysis::UnitsDone MpiUnitRunner::coordinate(const std::vector<StudyUnit>& units,
                                              analysis::ResultSink& sink,
                                              const analysis::Progress& progress) {
  analysis::UnitsDone done;
  // Handed out and written in the same order as one process runs them.
  // The units that arrive are held by `writer` until their turn to be written.
  analysis::InOrderWriter writer(units, analysis::schedule_order(units, sink), sink, progress,
                                 done);
  const std::vector<size_t>& pending = writer.order();
  done.skipped = static_cast<int64_t>(units.size() - pending.size());
  HandOut hand_out(units, pending, size_ - 1,
                   2 * static_cast<size_t>(size_ - 1) * static_cast<size_t>(jobs_));
  // Workers that asked for a unit when none was left to give them (or that failed) and compute
  // none. They are
  // answered only when the run is decided, all together: released before, a worker would go
  // on to the command's next step while this run may still fail, and could then wait forever
  // for a rank 0 that has ended.
  std::vector<int> parked;
  // The first failure (in schedule order) ends the run, but only after the other workers have
  // returned the units they hold: those precede or follow the failed unit in schedule order,
  // and the ones before it are written (those not yet handed out are handed out first), so the
  // checkpoint left holds every unit before the failed one, whatever the timing (and no
  // computed work is lost).
  std::optional<Failure> failure;
  std::exception_ptr write_failure;  // rank 0's own (say a full disk): nothing more is written
  // Writes every arrived unit whose turn has come, in schedule order (as one process would),
  // and publishes them with one checkpoint. Called when no message waits: a checkpoint copies
  // the whole file, and rank 0 writing and publishing each unit as it came, before answering,
  // kept the workers waiting on it (README, "Measured on 16 cores").
  auto write_arrived = [&] {
    try {
      return writer.write_ready();
    } catch (...) {
      write_failure = std::current_exception();
      hand_out.limit_below(0);
      return false;
    }
  };
  // A stop (SIGINT/SIGTERM here or on a worker): the run ends at once at the units written so
  // far (rank 0 is the only writer, so that is the boundary for every rank); the workers still
  // computing are answered kJobFailed when they ask next, by end_job().
  auto stop = [&](int signal) {
    for (int worker : parked)
      MPI_Send(&kJobFailed, 1, MPI_INT64_T, worker, tag(kAssign, calls_), MPI_COMM_WORLD);
    throw analysis::Interrupted(signal);
  };
  // A worker asked (returning a unit or not): its next unit; kNoneLeft while it still computes
  // others (--jobs > 1); else it is parked until the verdict.
  auto answer = [&](int worker) {
    if (const auto unit = hand_out.next_for(worker)) {
      const auto assign = static_cast<int64_t>(*unit);
      MPI_Send(&assign, 1, MPI_INT64_T, worker, tag(kAssign, calls_), MPI_COMM_WORLD);
    } else if (hand_out.in_flight(worker) > 0) {
      MPI_Send(&kNoneLeft, 1, MPI_INT64_T, worker, tag(kAssign, calls_), MPI_COMM_WORLD);
    } else {
      parked.push_back(worker);
    }
  };
  while (static_cast<int>(parked.size()) + workers_gone() < size_ - 1) {
    if (!failure && !write_failure && analysis::stop_requested()) stop(analysis::stop_requested());
    int flag = 0;
    MPI_Status status;
    MPI_Iprobe(MPI_ANY_SOURCE, kGoodbye, MPI_COMM_WORLD, &flag, &status);
    if (flag) {
      // A worker whose command ended before it joined this run (it failed outside any run,
      // say on its copy of the input): it will never ask for a unit.
      const int worker = status.MPI_SOURCE;
      const Goodbye goodbye = receive_goodbye(status.MPI_SOURCE);
      Failure gone;  // order 0: reported before any unit's failure
      gone.bad_input = goodbye.exit_status == kBadInputExit;
      gone.message = "rank " + std::to_string(worker) + " ended before this run" +
                     (goodbye.exit_status
                          ? " with exit status " + std::to_string(goodbye.exit_status) + " (" +
                                goodbye.message + ")"
                          : " (the ranks disagree on the units to run)");
      if (!failure || failure->order > 0) failure = std::move(gone);
      hand_out.limit_below(0);
      continue;
    }
    MPI_Iprobe(MPI_ANY_SOURCE, tag(kFailure, calls_), MPI_COMM_WORLD, &flag, &status);
    if (!flag) MPI_Iprobe(MPI_ANY_SOURCE, tag(kReady, calls_), MPI_COMM_WORLD, &flag, &status);
    if (!flag) {
      if (write_failure || !write_arrived())
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      continue;
    }
    const auto bytes = receive_bytes(status);
    const int worker = status.MPI_SOURCE;
    if (status.MPI_TAG == tag(kFailure, calls_)) {
      Failure arrived_failure = decode_failure(bytes, worker, units, pending);
      if (arrived_failure.interrupted) {
        parked.push_back(worker);  // its other units in flight are dropped with the run
        if (!failure && !write_failure) stop(arrived_failure.interrupted);
        continue;  // a failure ends the run already
      }
      hand_out.returned(worker, arrived_failure.unit);
      if (!failure || arrived_failure.order < failure->order) failure = std::move(arrived_failure);
      hand_out.limit_below(failure->order);
      answer(worker);
      continue;
    }
    if (!failure && !write_failure && analysis::stop_requested()) {
      parked.push_back(worker);  // its unit is dropped: nothing is written after a stop
      stop(analysis::stop_requested());
    }
    if (!bytes.empty()) {
      uint64_t unit = 0;
      auto records = decode_unit(bytes, unit);
      hand_out.returned(worker, static_cast<size_t>(unit));
      if (!write_failure) writer.hold(static_cast<size_t>(unit), std::move(records));
    }
    answer(worker);
  }
  if (!write_failure) write_arrived();  // the last units (all returned): before the verdict
  const bool failed = failure || write_failure;
  const int64_t verdict = failed ? kJobFailed : kNoMoreUnits;
  for (int worker : parked)
    MPI_Send(&verdict, 1, MPI_INT64_T, worker, tag(kAssign, calls_), MPI_COMM_WORLD);
  if (write_failure) std::rethrow_exception(write_failure);
  if (failure) {
    // Bad input stays bad input (exit code 2), as in one process.
    if (failure->bad_input) throw InvalidArgument(failure->message);
    throw std::runtime_error(failure->message);
  }
  if (!writer.all_written())
    throw std::logic_error("MPI coordinator: " + std::to_string(pending.size() - writer.written()) +
                           " units were handed out but never returned");
  return done;
}

void MpiUnitRunner::work(const std::vector<StudyUnit>& units) {
  UnitThreads threads(units, jobs_, std::max(1, threads_ / jobs_));
  bool none_left = false;  // rank 0 has no unit for this worker any more
  for (;;) {
    // Return a finished unit (that request also asks for the next), else ask for a unit for a
    // free thread; with no thread free, or none left to ask for, wait for a unit to finish.
    const bool busy = none_left || threads.in_flight() == static_cast<size_t>(jobs_);
    auto finished = threads.take_finished(busy);
    auto [kind, message] =
        finished ? return_message(*finished) : std::pair<int, std::vector<char>>{kReady, {}};
    send_bytes(message, tag(kind, calls_));
    int64_t assign = kNoMoreUnits;
    MPI_Recv(&assign, 1, MPI_INT64_T, 0, tag(kAssign, calls_), MPI_COMM_WORLD,
             MPI_STATUS_IGNORE);
    // Rank 0 answers kNoMoreUnits only once this worker computes none (UnitThreads idle).
    if (assign == kNoMoreUnits) return;
    if (assign == kJobFailed) end_with_job();  // ~UnitThreads stops the units in flight
    if (assign == kNoneLeft) {
      none_left = true;
      continue;
    }
    threads.start(static_cast<size_t>(assign));
  }
}

MpiUnitRunner::Goodbye MpiUnitRunner::receive_goodbye(int worker) {
  MPI_Status probed;
  MPI_Probe(worker, kGoodbye, MPI_COMM_WORLD, &probed);
  const std::vector<char> bytes = receive_bytes(probed);
  Goodbye goodbye;
  std::memcpy(&goodbye.exit_status, bytes.data(), sizeof goodbye.exit_status);
  goodbye.message.assign(bytes.begin() + sizeof goodbye.exit_status, bytes.end());
  gone_.at(static_cast<size_t>(worker)) = true;
  return goodbye;
}

int MpiUnitRunner::workers_gone() const {
  return static_cast<int>(std::count(gone_.begin(), gone_.end(), true));
}

void MpiUnitRunner::end_job(int exit_status, const std::string& message) {
  if (rank_ != 0) {
    std::vector<char> goodbye(sizeof exit_status);
    std::memcpy(goodbye.data(), &exit_status, sizeof exit_status);
    goodbye.insert(goodbye.end(), message.begin(), message.end());
    send_bytes(goodbye, kGoodbye);
    return;
  }
  // Rank 0 speaks for the job: a worker's error is printed once, unless it is rank 0's own
  // (the same flags, config and inputs fail the same way on every rank).
  std::set<std::string> said = {message};
  while (workers_gone() < size_ - 1) {
    int flag = 0;
    MPI_Status status;
    MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, &status);
    if (!flag) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      continue;
    }
    if (status.MPI_TAG == kGoodbye) {
      const Goodbye goodbye = receive_goodbye(status.MPI_SOURCE);
      if (goodbye.exit_status != 0 && said.insert(goodbye.message).second)
        std::cerr << "hils: rank " + std::to_string(status.MPI_SOURCE) + ": " +
                         goodbye.message + "\n";
      continue;
    }
    // A worker waiting in a run this rank never started (it failed before, e.g. validating
    // the input up front): that run is over before it began.
    receive_bytes(status);
    MPI_Send(&kJobFailed, 1, MPI_INT64_T, status.MPI_SOURCE, answer_tag(status.MPI_TAG),
             MPI_COMM_WORLD);
  }
}

void MpiUnitRunner::end_with_job() {
  throw JobEnded("the run failed; rank 0 reports why");
}

}  // namespace hils::parallel
