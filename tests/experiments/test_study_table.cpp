// Every row of the study table (experiments/cli/studies/study_table.hpp, README "Adding a study")
// taken through what a study must do: its command runs from its own config table, resumes, gives
// the same file with --jobs and (built with MPI) under mpirun, refuses the flags it has no use
// for, is plotted by `hils plot`, and the documents name it. A study added to the table without
// one of these fails here, naming it.
#include <catch2/catch.hpp>

#include <fstream>
#include <string>

#include "cli/studies/study_table.hpp"
#include "support.hpp"

using hils::cli::studies::kStudies;
using hils::test::file_bytes;
using hils::test::quoted;
using hils::test::require_refused;
using hils::test::require_same_results;
using hils::test::run_hils;
using hils::test::run_shell;
using hils::test::TempDir;

namespace {

// The line of `text` that holds `marker` ("" when none).
std::string line_with(const std::string& text, const std::string& marker) {
  const auto at = text.find(marker);
  if (at == std::string::npos) return "";
  const auto begin = text.rfind('\n', at) + 1;  // npos + 1 = 0 on the first line
  return text.substr(begin, text.find('\n', at) - begin);
}

// The paragraph of `text` that starts with `marker`, to the next blank line ("" when none).
std::string paragraph_from(const std::string& text, const std::string& marker) {
  const auto at = text.find(marker);
  return at == std::string::npos ? "" : text.substr(at, text.find("\n\n", at) - at);
}

// config.study of a results file (read with h5py, as hils plot reads it).
std::string config_study(const std::filesystem::path& results) {
  return run_shell("/usr/bin/python3 -c \"import h5py, json, sys; "
                   "print(json.loads(h5py.File(sys.argv[1], 'r').attrs['config'])['study'], "
                   "end='')\" " + quoted(results)).output;
}

}  // namespace

TEST_CASE("study table: every study runs from its config table, resumes, runs with --jobs, "
          "refuses what it has no use for, is plotted and documented", "[cli][study]") {
  const std::string source = HILS_SOURCE_DIR;
  const std::string formats = file_bytes(source + "/data/results_format.md");
  const std::string layouts = line_with(formats, "## Study layouts");
  const std::string names = paragraph_from(formats, "The root attribute `config` names the study");
  const std::string semantics = file_bytes(source + "/reference/SEMANTICS.md");
  const std::string readme_row = line_with(file_bytes(source + "/README.md"),
                                           "| source → reference → results |");
  REQUIRE_FALSE(layouts.empty());
  REQUIRE_FALSE(names.empty());
  for (const auto& row : kStudies) {
    const std::string command(row.command), study(row.study);
    INFO("study " << study << " (hils " << command << ")");
    TempDir dir("study_table_" + study);
    // Its lengths from its own table of the study config (config::study_schema), a small geometry.
    std::ofstream(dir / "c.toml") << "[" << study << "]\nlengths = [256, 512]\n";
    const std::string args = command + " -c " + quoted(dir / "c.toml") +
                             " --n-layers 1 --S 32 --W 128" +
                             (row.samples_queries() ? " --queries 4 --mechanisms mean,taylor_entropy"
                                                    : "");
    const auto one = run_hils("-q " + args + " --out " + quoted(dir / "one.h5"));
    INFO(one.output);
    REQUIRE(one.exit_code == 0);
    CHECK(config_study(dir / "one.h5") == study);
    const auto jobs = run_hils("-q " + args + " --out " + quoted(dir / "jobs.h5") + " --jobs 3");
    INFO(jobs.output);
    REQUIRE(jobs.exit_code == 0);
    require_same_results(dir / "one.h5", dir / "jobs.h5");
#ifdef HILS_MPIEXEC
    // 3 ranks (rank 0 writes, two workers compute; tests/experiments/test_mpi.sh runs them so):
    // the one-process file, e.g. not for a study whose summaries read anything but the sink.
    const auto mpi = run_shell("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 '"
                               HILS_MPIEXEC "' --oversubscribe -n 3 '" HILS_EXE "' -q " + args +
                               " --out " + quoted(dir / "mpi.h5") + " 2>&1");
    INFO(mpi.output);
    REQUIRE(mpi.exit_code == 0);
    require_same_results(dir / "one.h5", dir / "mpi.h5");
#endif
    // The same command on its complete file computes nothing and leaves its results as they are.
    const auto resumed = run_hils(args + " --out " + quoted(dir / "jobs.h5"));
    INFO(resumed.output);
    CHECK(resumed.exit_code == 0);
    CHECK_THAT(resumed.output, Catch::Contains(command + ": 0 units run, "));
    require_same_results(dir / "one.h5", dir / "jobs.h5");
    if (!row.samples_queries()) {
      require_refused(command + " --out " + quoted(dir / "x.h5") + " --lengths 1024 --queries 3",
                      "--queries: hils " + command + " " + std::string(row.why_no_queries),
                      dir / "x.h5");
      require_refused(command + " --out " + quoted(dir / "x.h5") + " --lengths 1024 --mechanisms mean",
                      "--mechanisms: hils " + command + " " + std::string(row.why_no_mechanisms),
                      dir / "x.h5");
    }
    // analysis/plots/plot_study.py draws it (its DRAW entry).
    const auto plot = run_hils("plot " + quoted(dir / "one.h5") + " --out " + quoted(dir / "plots"));
    INFO(plot.output);
    CHECK(plot.exit_code == 0);
    CHECK_THAT(plot.output, Catch::Contains("plot: "));
    // The documents: data/results_format.md's study layouts, reference/SEMANTICS.md §9, the
    // README's layout table.
    CHECK_THAT(layouts, Catch::Contains(command + "`"));
    CHECK_THAT(names, Catch::Contains("\"" + study + "\"`"));
    CHECK_THAT(semantics, Catch::Contains("(`hils " + command + "`"));
    CHECK_THAT(readme_row, Catch::Contains(" " + command + " \\|"));
  }
}
