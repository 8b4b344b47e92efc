// Where this process runs: alone, or as one rank of `mpirun -n N hils ...`. One Session lives
// in main(); the study commands and `hils run` ask it for their UnitRunner.
//
// Built with MPI (OpenMPI found at configure time) and started by mpirun/srun with N > 1 ranks,
// rank 0 is the coordinator and the only writer of results; ranks 1..N-1 compute units (see
// mpi_runner.hpp). Otherwise, with or without MPI built in, everything runs here, as before.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include "hils/analysis/units.hpp"

namespace hils::parallel {

class MpiUnitRunner;

// Thrown on an MPI worker whose run rank 0 ended because a unit failed (on this or another
// rank): rank 0 reports the failure; this rank ends quietly (exit 0, so that the job's exit
// status is rank 0's, e.g. 2 for bad input).
struct JobEnded : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Session {
 public:
  // Initializes MPI when built in and this process was started by an MPI launcher.
  Session(int& argc, char**& argv);
  ~Session();  // ends the job in order with the other ranks (see fail()), finalizes MPI
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // True on the process that opens, writes and reports the results file.
  bool holds_results() const { return rank_ == 0; }
  // The runner for a study's units: serial unless N > 1 ranks.
  analysis::UnitRunner& runner();
  // The command failed on this rank with `exit_status` and `message` (the error line without
  // "hils: "; a worker prints nothing itself): with N > 1 ranks the destructor ends the whole
  // job, rank 0 answering workers that wait for a run it will not start, a worker telling
  // rank 0 its status and message, which rank 0 reports (MpiUnitRunner::end_job()).
  void fail(int exit_status, std::string message) {
    exit_status_ = exit_status;
    message_ = std::move(message);
  }

  // Ranks of this job on this node that compute units (rank 0 does not): they share its cores.
  int computing_on_node() const { return computing_on_node_; }
  // Whether threads beside the one calling MPI are allowed (MPI_THREAD_FUNNELED).
  bool funneled() const { return funneled_; }
  // --jobs under mpirun (use_jobs): the units each worker computes at once, on `threads`.
  void set_jobs(int jobs, int threads);

  // The one session of this process (nullptr before main created it, e.g. in tests).
  static Session* current();

 private:
  int rank_ = 0, size_ = 1;
  bool mpi_ = false;
  bool funneled_ = false;
  int computing_on_node_ = 1;
  int exit_status_ = 0;
  std::string message_;
  std::unique_ptr<MpiUnitRunner> runner_;
};

// Whether this binary was built with MPI.
bool built_with_mpi();

// The runner of the current session: MPI's with N > 1 ranks, else the threaded one when
// use_jobs chose more than one unit at once, else the serial one.
analysis::UnitRunner& current_runner();

// --jobs: the units this process computes at once (README, "Several units at once"; under
// mpirun each worker rank, "Studies on many machines"). Checks `jobs` (InvalidArgument naming
// --jobs unless 1 <= jobs <= 4 per hardware thread), then sets the runner current_runner()
// gives (or the MPI workers' units at once) and each unit's share of memory (hils/memory.hpp),
// and returns the units at once. nullopt: the default, one unit per OpenMP thread of this
// process (rank_threads()). The OpenMP threads are shared among the units: each unit's team
// has max(1, threads / jobs).
int use_jobs(std::optional<int64_t> jobs);
// The default of --jobs here: one unit per OpenMP thread of this process (rank_threads()).
int default_jobs();
// The OpenMP threads this process uses: OMP_NUM_THREADS, else every core it may run on; under
// mpirun without OMP_NUM_THREADS (or with a value OpenMP ignores: "", "0", "four"), a rank not
// bound to fewer cores than the node has takes its share of them (the node's cores divided
// among its ranks that compute, rank 0 not counted).
int rank_threads();
// Whether this process holds the results (true without a session).
bool holds_results();
// Ranks in this run (1 without a session).
int ranks();

}  // namespace hils::parallel
