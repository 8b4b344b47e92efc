// Units shared among MPI ranks: rank 0 coordinates and writes, ranks 1..N-1 compute.
//
// Why a coordinator and not a shared counter (MPI one-sided fetch-and-add): results must reach
// one writer anyway, so the coordinator that receives a unit's results answers the same message
// with the next unit; it needs no one-sided progress guarantees (which OpenMPI gives only with
// shared memory or RDMA hardware) and hands units out largest-first (estimated cost T^2), the
// classic longest-processing-time rule, so that the last units to finish are the small ones.
// Rank 0 computes nothing: it waits in MPI_Iprobe with a 1 ms sleep (near-idle), so start one
// rank more than the cores you want computing.
//
// A worker computes up to --jobs units at once (set_jobs; README, "Studies on many machines"),
// each on a thread of its own (UnitThreads in mpi_runner.cpp), asking rank 0 for a unit as a
// thread frees (one request at a time, the finished unit's records with it); its main thread
// alone calls MPI (MPI_THREAD_FUNNELED). Rank 0 hands a worker out of strict schedule order
// where that saves a layer's load (HandOut in mpi_runner.cpp: the other KV group of a layer the
// worker holds, else a layer no rank holds), within a window of the next 2 x workers x jobs
// units, so the largest units still go first; writing stays in schedule order. A worker that
// asks when nothing is left to hand out while it still computes other units is told so
// (kNoneLeft) and returns them as they finish.
//
// Same file for any N: workers record a unit's writes (analysis::RecordingSink) and send them
// to rank 0, which answers with the next unit first and, when no message waits, replays the
// units whose turn has come into the results sink in analysis::schedule_order (holding early
// arrivals; the hand-out order is the same, so few wait) and marks them complete with one
// checkpoint (ResultSink::mark_complete_all): the datasets are those one process writes. A
// checkpoint copies the whole file; one per unit, taken before answering, kept the workers
// waiting on rank 0 (README, "Measured on 16 cores").
//
// A failing unit on a worker (any exception: bad input found late, out of memory) is sent to
// rank 0, which stops handing out units past it (those before it not yet handed out still go
// out), waits for the workers' units in flight and writes those
// that precede the failed one in schedule order (so the checkpoint holds every unit before it,
// whatever the timing), tells every worker that the job failed (they end quietly: JobEnded),
// then throws "rank R failed on unit U: ..." (the results writer discards its uncommitted
// temporary; the last checkpoint stays). The ranks then finalize MPI together and rank 0 exits
// with the failure's code: no MPI_Abort, whose teardown can leave OpenMPI 4.1's mpirun hung in
// PMIx_server_finalize with every rank already gone (seen here). A failure to write on rank 0
// (a full disk) ends the job the same way.
//
// A stop (SIGINT/SIGTERM: analysis::request_stop, on rank 0 or sent by a worker as a failure of
// kind 'I') ends the run at once at the units rank 0 has written, the boundary for every rank:
// rank 0 answers the parked workers kJobFailed and throws analysis::Interrupted; the workers
// still computing stop at their next safe point (when they got the signal too) or finish their
// unit, and are answered kJobFailed by end_job() when they ask next (README, "Stopping a run").
//
// Failures outside a run end the job in order too (end_job(), from ~Session): every worker
// says goodbye to rank 0 as its command ends, and rank 0 waits for every goodbye before MPI
// is finalized. Rank 0 failing before a run (its up-front validation, a held lock) answers the
// workers waiting in that run with kJobFailed while it waits; a worker failing before a run
// (its copy of the input) says goodbye with its exit status and message, and rank 0's run ends
// with "rank R ended before this run with exit status S (message)". Only rank 0 prints: a
// worker's error that rank 0 shares (a bad flag, the same missing file) is printed once.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "hils/analysis/units.hpp"

namespace hils::parallel {

class MpiUnitRunner final : public analysis::UnitRunner {
 public:
  MpiUnitRunner(int rank, int size) : rank_(rank), size_(size) {}
  bool holds_results() const override { return rank_ == 0; }
  // --jobs: units a worker computes at once, sharing `threads` OpenMP threads (each unit's team
  // has max(1, threads / jobs)); on rank 0 it sizes the hand-out window.
  void set_jobs(int jobs, int threads) {
    jobs_ = std::max(1, jobs);
    threads_ = std::max(1, threads);
  }
  // This rank's command ended with `exit_status` (0: done) and `message` (its error line): a
  // worker tells rank 0; rank 0 waits until every worker has, ending the runs they wait in,
  // and prints each worker's message that is not its own. Then MPI can be finalized.
  void end_job(int exit_status, const std::string& message);

 private:
  analysis::UnitsDone run_units(const std::vector<analysis::StudyUnit>& units,
                                analysis::ResultSink& sink,
                                const analysis::Progress& progress) override;
  analysis::UnitsDone coordinate(const std::vector<analysis::StudyUnit>& units,
                                 analysis::ResultSink& sink, const analysis::Progress& progress);
  void work(const std::vector<analysis::StudyUnit>& units);
  [[noreturn]] void end_with_job();  // a worker told that the run failed: throws JobEnded
  struct Goodbye {
    int exit_status = 0;
    std::string message;
  };
  Goodbye receive_goodbye(int worker);  // rank 0: a worker's last word
  int workers_gone() const;        // rank 0: goodbyes received
  int rank_, size_;
  int jobs_ = 1, threads_ = 1;
  int64_t calls_ = 0;  // run() calls so far: a study may run several unit lists in turn
  std::vector<bool> gone_ = std::vector<bool>(static_cast<size_t>(size_), false);
};

}  // namespace hils::parallel
