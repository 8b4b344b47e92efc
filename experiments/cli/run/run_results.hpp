// hils run's results file, on the process that holds the results (alone, or MPI rank 0):
// locked, then created, or resumed with its configuration merged with this run's.
#pragma once

#include "cli/run/run_plan.hpp"
#include "hils/analysis/sink.hpp"
#include "io/hdf5_util.hpp"
#include "io/results_file.hpp"
#include "io/results_sink.hpp"

namespace hils::cli::run_command {

class RunResults {
 public:
  RunResults(const RunFlags& flags, const RunPlan& plan, io::Provenance provenance);
  analysis::ResultSink& sink() { return sink_; }
  io::ResultsWriter& writer() { return writer_; }
  void commit() { writer_.commit(); }
  // Complete units the published file keeps (this run's and a resumed one's).
  size_t units_published() const { return writer_.units_published(); }

 private:
  io::ResultsWriter open(const RunFlags& flags, const RunPlan& plan, io::Provenance& provenance);
  // Held from before the old file is read until the new one is published: a second writer of
  // this file (say another --resume) is refused instead of losing this run's units or its own.
  io::OutputLock lock_;
  bool resuming_ = false;
  io::ResultsWriter writer_;
  io::ResultsWriterSink sink_;
};

}  // namespace hils::cli::run_command
