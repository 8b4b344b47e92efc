#include "parallel/mpi_runner.hpp"

#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <chrono>
#include <map>
#include <numeric>
#include <iostream>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>

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
  failure.order = static_cast<size_t>(
      std::find(pending.begin(), pending.end(), static_cast<size_t>(unit)) - pending.begin());
  failure.message = "rank " + std::to_string(worker) + " failed on unit " +
                    (unit < units.size() ? units[unit].path : "?") + ": " +
                    std::string(bytes.begin() + sizeof unit + 1, bytes.end());
  return failure;
}

}  // namespace

analysis::UnitsDone MpiUnitRunner::run(const std::vector<StudyUnit>& units,
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
  const std::vector<size_t>& hand_out = pending;
  done.skipped = static_cast<int64_t>(units.size() - pending.size());
  size_t next_out = 0;
  // Workers that asked for a unit when none was left to give (or that failed). They are
  // answered only when the run is decided, all together: released before, a worker would go
  // on to the command's next step while this run may still fail, and could then wait forever
  // for a rank 0 that has ended.
  std::vector<int> parked;
  // The first failure (in schedule order) ends the run, but only after the other workers have
  // returned the units they hold: those precede or follow the failed unit in schedule order,
  // and the ones before it are written, so the checkpoint left holds every unit before the
  // failed one, whatever the timing (and no computed work is lost).
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
      parked.push_back(worker);
      if (arrived_failure.interrupted && !failure && !write_failure)
        stop(arrived_failure.interrupted);
      if (arrived_failure.interrupted) continue;  // a failure ends the run already
      if (!failure || arrived_failure.order < failure->order) failure = std::move(arrived_failure);
      continue;
    }
    if (!failure && !write_failure && analysis::stop_requested()) {
      parked.push_back(worker);  // its unit is dropped: nothing is written after a stop
      stop(analysis::stop_requested());
    }
    if (!bytes.empty() && !write_failure) {
      uint64_t unit = 0;
      auto records = decode_unit(bytes, unit);
      writer.hold(static_cast<size_t>(unit), std::move(records));  // written when idle
    }
    if (!failure && !write_failure && next_out < hand_out.size()) {
      const auto assign = static_cast<int64_t>(hand_out[next_out++]);
      MPI_Send(&assign, 1, MPI_INT64_T, worker, tag(kAssign, calls_), MPI_COMM_WORLD);
    } else {
      parked.push_back(worker);
    }
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
  std::vector<char> finished;  // empty: the first request carries no unit
  for (;;) {
    send_bytes(finished, tag(kReady, calls_));
    int64_t assign = kNoMoreUnits;
    MPI_Recv(&assign, 1, MPI_INT64_T, 0, tag(kAssign, calls_), MPI_COMM_WORLD,
             MPI_STATUS_IGNORE);
    if (assign == kNoMoreUnits) return;
    if (assign == kJobFailed) end_with_job();
    const auto i = static_cast<size_t>(assign);
    RecordingSink records;
    try {
      analysis::throw_if_stop_requested();  // stopped: no new unit
      analysis::run_unit_work(units.at(i), records);
    } catch (const std::exception& e) {
      std::vector<char> failure(sizeof(uint64_t));
      const uint64_t unit = i;
      std::memcpy(failure.data(), &unit, sizeof unit);
      const auto* interrupted = dynamic_cast<const analysis::Interrupted*>(&e);
      failure.push_back(interrupted ? kInterrupted
                        : dynamic_cast<const InvalidArgument*>(&e) ? kBadInput
                                                                   : kOtherFailure);
      const std::string message =
          interrupted ? std::to_string(interrupted->signal_number) : std::string(e.what());
      failure.insert(failure.end(), message.begin(), message.end());
      send_bytes(failure, tag(kFailure, calls_));
      // Rank 0 reports it and answers when the other workers are stopped too.
      MPI_Recv(&assign, 1, MPI_INT64_T, 0, tag(kAssign, calls_), MPI_COMM_WORLD,
               MPI_STATUS_IGNORE);
      end_with_job();
    }
    finished = encode_unit(i, records);
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
