// Where a study's results go: the results file (locked, resumed when it exists), written only by
// the process that holds the results (alone, or MPI rank 0); and the run around a study driver:
// progress bar, timing, the closing line.
#pragma once

#include <chrono>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

#include "cli/cli_util.hpp"
#include "cli/commands.hpp"
#include "cli/studies/study_config.hpp"
#include "hils/analysis/units.hpp"
#include "io/hdf5_util.hpp"
#include "parallel/session.hpp"
#include "util/progress.hpp"

namespace hils::cli::studies {

class ResultsFileSink;

// The results file where this process holds the results; on MPI worker ranks a sink that is
// never written (their units' results travel to rank 0, experiments/parallel/).
class StudyResults {
 public:
  StudyResults(const std::filesystem::path& path, const Resolved& r, const std::string& command);
  ~StudyResults();
  analysis::ResultSink& sink();
  void commit();
  // Complete units the published file keeps (0 on an MPI worker, which holds none).
  size_t units_published() const;

 private:
  std::unique_ptr<ResultsFileSink> file_;
  analysis::RecordingSink unused_;
};

// args.out, or BadInput when there is none (or it is the --activations input).
std::filesystem::path out_path(const StudyArgs& args, const std::string& command);

// Runs `driver(sink, progress)` (a study driver of analysis/, returning a report with units_run
// and units_skipped) into the results file at `path`, with a progress bar, and says
// "<command>: N units run, M resumed, X s -> path". Returns the driver's report. std::logic_error
// (exit 3) when the driver ran its units through another runner than the session's
// (parallel::current_runner(), its options' `runner`): --jobs and MPI would not share them.
template <class Driver>
auto run_into_results(const Resolved& r, const std::filesystem::path& path,
                      const std::string& command, Driver driver) {
  StudyResults results(path, r, command);
  std::unique_ptr<ProgressBar> bar;
  int64_t shown = 0;  // runners report several units at once when they publish them together
  auto progress = [&bar, &shown, command](int64_t done, int64_t total) {
    if (!bar) bar = std::make_unique<ProgressBar>(command, total, "units", global_options().quiet);
    bar->advance(done - shown);
    shown = done;
  };
  const auto start = std::chrono::steady_clock::now();
  const int64_t runs_before = parallel::current_runner().runs();
  // SIGINT/SIGTERM stop the units at a unit boundary; the same command resumes the file
  // (StudyResults opens an existing file to resume it).
  const auto report =
      run_stoppable([&] { return driver(results.sink(), analysis::Progress(progress)); },
                    path.string(), [&] { return results.units_published(); },
                    "run the same command again");
  if (parallel::current_runner().runs() == runs_before)
    throw std::logic_error(command + ": the study's driver ran no units through the session's "
                           "runner (its options.runner = &parallel::current_runner()), so "
                           "--jobs and MPI would not share them");
  results.commit();
  bar.reset();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  note(fmt::format("{}: {} units run, {} resumed, {:.1f} s -> {}", command, report.units_run,
                  report.units_skipped, s, path.string()));
  return report;
}

}  // namespace hils::cli::studies
