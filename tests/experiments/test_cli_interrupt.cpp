// Runs stopped midway. Ctrl-C (SIGINT) and SIGTERM during `hils run` and a study: the run
// stops at a unit boundary, says on one line what its results file keeps and how to continue,
// ends by the signal (the shell's $? is 130 / 143), leaves no temporary or lock file, and the
// file resumes to the datasets of an uninterrupted run (MPI: tests/experiments/test_mpi.sh,
// case interrupt). A full disk (a file-size limit) after a checkpoint says the same.
//
// Each test signals hils once its results file exists: the file is published only at a
// checkpoint, after a unit is complete, so the signal lands after the first unit whatever the
// timing; the units after it are slower, so it lands before the last. A long unit stops inside
// the reference (hils::StopScope, analysis::run_unit_work).
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <fstream>
#include <iterator>
#include <limits>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "hils/analysis/units.hpp"
#include "io/activation_file.hpp"
#include "io/hdf5_util.hpp"
#include "io/results_file.hpp"
#include "support.hpp"

using hils::test::count_lock_files;
using hils::test::count_temp_files;
using hils::test::file_bytes;
using hils::test::quoted;
using hils::test::require_same_results;
using hils::test::run_hils;
using hils::test::run_shell;
using hils::test::TempDir;
namespace fs = std::filesystem;

namespace {

// "a b c" -> {"a", "b", "c"} (arguments without spaces or quotes).
std::vector<std::string> words(const std::string& line) {
  std::vector<std::string> out;
  std::istringstream in(line);
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

struct Stopped {
  bool signalled = false;  // false: hils ended before `watched` appeared
  int status = 0;          // waitpid's status
  std::string err;         // its stderr
  double seconds_after_signal = 0;  // from the signal to the end of hils
};

// Runs `hils <line>` in `folder` (stderr to a file, `env` "NAME=value" added to its environment
// when given); once `watched` exists, waits `delay` and sends it `signal`. Returns how it ended.
Stopped signal_once_published(const fs::path& folder, const std::string& line,
                              const fs::path& watched, int signal,
                              std::chrono::milliseconds delay = std::chrono::milliseconds(0),
                              const char* env = nullptr) {
  const fs::path err = folder / "stderr.txt";
  const auto args = words(line);
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (::chdir(folder.c_str()) != 0) ::_exit(127);
    const int fd = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || ::dup2(fd, STDERR_FILENO) < 0) ::_exit(127);
    if (env != nullptr && ::putenv(const_cast<char*>(env)) != 0) ::_exit(127);
    std::vector<char*> argv{const_cast<char*>(HILS_EXE)};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(HILS_EXE, argv.data());
    ::_exit(127);
  }
  Stopped stopped;
  std::chrono::steady_clock::time_point sent;
  while (!stopped.signalled && ::waitpid(pid, &stopped.status, WNOHANG) == 0) {
    if (fs::exists(watched)) {
      std::this_thread::sleep_for(delay);
      sent = std::chrono::steady_clock::now();
      ::kill(pid, signal);
      stopped.signalled = true;
    } else {
      ::usleep(200);
    }
  }
  if (stopped.signalled) {
    ::waitpid(pid, &stopped.status, 0);
    stopped.seconds_after_signal =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - sent).count();
  }
  stopped.err = file_bytes(err);
  return stopped;
}

// The units a results file holds complete.
size_t complete_units(const fs::path& results) {
  hils::io::ResultsReader reader(results);
  return nlohmann::json::parse(reader.string_attribute("/", "complete_units")).size();
}

// `hils <args>` run in `folder`.
hils::test::CommandResult hils_in(const fs::path& folder, const std::string& args) {
  return run_shell("cd " + quoted(folder) + " && '" + HILS_EXE + "' " + args + " 2>&1");
}

// hils_in under a file-size limit of `kib` KiB (a full disk: writes past it fail with EFBIG).
hils::test::CommandResult hils_in_limited(const fs::path& folder, const std::string& args,
                                          int kib) {
  return run_shell("cd " + quoted(folder) + " && prlimit --fsize=" + std::to_string(1024 * kib) +
                   " '" + HILS_EXE + "' " + args + " 2>&1");
}

// Whether a process whose command line holds `word` runs (a scan of /proc/<pid>/cmdline).
bool process_with_argument(const std::string& word) {
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string line = file_bytes(entry.path() / "cmdline");
    std::replace(line.begin(), line.end(), '\0', ' ');
    if (line.find(word) != std::string::npos) return true;
  }
  return false;
}

// Whether two results files hold the same datasets and attributes, provenance aside.
// hils run's activations: one layer, units quick then slow (swa's window, then full attention).
const std::string kDump = "-q dump synthetic -T 8192 -S 64 --Hq 2 --Hkv 1 -d 32 --seed 3 -o acts.h5";
const std::string kRun =
    "-q run acts.h5 -o out.h5 -p swa,full,nsa -W 256 -K 4 --landmarks true";

}  // namespace

TEST_CASE("Ctrl-C during hils run stops at a unit boundary, says so, and --resume finishes it",
          "[cli][interrupt]") {
  // Was: killed by the signal with no word on what the file kept.
  TempDir dir("interrupt_run");
  REQUIRE(hils_in(dir.path(), kDump).exit_code == 0);
  const std::string whole = "-q run acts.h5 -o whole.h5" + kRun.substr(kRun.find(" -p"));
  REQUIRE(hils_in(dir.path(), whole).exit_code == 0);

  const auto stopped = signal_once_published(dir.path(), kRun, dir / "out.h5", SIGINT);
  INFO(stopped.err);
  REQUIRE(stopped.signalled);
  CHECK((WIFSIGNALED(stopped.status) && WTERMSIG(stopped.status) == SIGINT));  // $? = 130
  const size_t kept = complete_units(dir / "out.h5");
  CHECK(kept >= 1);
  CHECK(kept < 3);
  CHECK(stopped.err == fmt::format("hils: interrupted by SIGINT (Ctrl-C): out.h5 keeps {} "
                                   "complete unit{} (work on unfinished units is dropped); run the "
                                   "same command with --resume to continue from them\n",
                                   kept, kept == 1 ? "" : "s"));
  CHECK(count_temp_files(dir.path()) == 0);
  CHECK(count_lock_files(dir.path()) == 0);

  const auto resumed = hils_in(dir.path(), kRun + " --resume");
  INFO(resumed.output);
  REQUIRE(resumed.exit_code == 0);
  CHECK_THAT(resumed.output, Catch::Contains(fmt::format("{} unit(s) computed, {} already complete",
                                                         3 - kept, kept)));
  require_same_results(dir / "whole.h5", dir / "out.h5");
  // hils --help lists it with the exit codes (was: 0-3 only).
  CHECK_THAT(run_hils("--help").output,
             Catch::Contains("the process ends by that signal:\n130 or 143 in the shell"));
  // Its help says so too (was: "continue an existing results file ...", no word on what a
  // run without it does to the file).
  CHECK_THAT(run_hils("run --help").output,
             Catch::Contains("(one stopped by Ctrl-C or a full disk), skipping its complete "
                             "units; without it an existing file is replaced"));
}

TEST_CASE("SIGTERM inside a long hils run unit stops the reference at its next query block",
          "[cli][interrupt]") {
  // Was: the unit (one mechanism on one layer) ran to its end, its only safe point before the
  // reference ran. Here full attention at T = 65536 on one thread, ~5.5e11 flops: ~50 s on this
  // machine, >10 s on any one core, where a query block (64 queries) is ~1/1000 of it. The
  // signal goes 0.3 s after swa's unit is published, inside full's run_mechanism.
  TempDir dir("interrupt_inside_unit");
  REQUIRE(hils_in(dir.path(), "-q dump synthetic -T 65536 -S 64 --Hq 2 --Hkv 1 -d 32 --seed 3 "
                              "-o acts.h5").exit_code == 0);
  const auto stopped =
      signal_once_published(dir.path(),
                            "-q run acts.h5 -o out.h5 -p swa,full -W 256 --landmarks true",
                            dir / "out.h5", SIGTERM, std::chrono::milliseconds(300),
                            "OMP_NUM_THREADS=1");
  INFO(stopped.err);
  REQUIRE(stopped.signalled);
  CHECK((WIFSIGNALED(stopped.status) && WTERMSIG(stopped.status) == SIGTERM));  // $? = 143
  CHECK(stopped.seconds_after_signal < 5.0);  // the unit's end would be tens of seconds away
  CHECK(complete_units(dir / "out.h5") == 1);
  CHECK(stopped.err == "hils: interrupted by SIGTERM: out.h5 keeps 1 complete unit (work on "
                       "unfinished units is dropped); run the same command with --resume to "
                       "continue from them\n");
  CHECK(count_temp_files(dir.path()) == 0);
  CHECK(count_lock_files(dir.path()) == 0);

  // Another configuration into that file, without --resume, stopped inside its first unit
  // (full attention again, 0.5 s after it locked the file): nothing of this run was published.
  // Was: "out.h5 keeps 0 complete units ...; run the same command with --resume to continue
  // from them", while out.h5 kept the earlier run's unit, which --resume then refused to mix.
  const std::string before = file_bytes(dir / "out.h5");
  const auto other = signal_once_published(
      dir.path(), "-q run acts.h5 -o out.h5 -p full -W 128 --landmarks true", dir / ".out.h5.lock",
      SIGTERM, std::chrono::milliseconds(500), "OMP_NUM_THREADS=1");
  INFO(other.err);
  REQUIRE(other.signalled);
  CHECK((WIFSIGNALED(other.status) && WTERMSIG(other.status) == SIGTERM));
  CHECK(other.err == "hils: interrupted by SIGTERM: no unit was complete, so nothing was "
                     "published to out.h5 (a file of that name is as it was); run the same "
                     "command again to start over\n");
  CHECK(file_bytes(dir / "out.h5") == before);
  CHECK(count_temp_files(dir.path()) == 0);
  CHECK(count_lock_files(dir.path()) == 0);
}

TEST_CASE("in a unit loop the first SIGINT only asks to stop, a second ends the process at once",
          "[cli][interrupt]") {
  // In a child: a temporary file and a UnitStopScope (as around hils's unit loops), then two
  // SIGINTs. The first must leave the process running with the stop requested (exit 42 would
  // say so), the second end it by SIGINT with the temporary file removed.
  TempDir dir("interrupt_twice");
  const fs::path final_path = dir / "r.h5";
  const pid_t pid = ::fork();
  if (pid == 0) {
    hils::io::TempFile temp(final_path);
    hils::io::UnitStopScope scope;
    std::raise(SIGINT);
    if (hils::analysis::stop_requested() != SIGINT) ::_exit(41);  // the flag was not set
    std::raise(SIGINT);
    ::_exit(42);  // the second signal was not fatal
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  INFO("exit status " << (WIFEXITED(status) ? WEXITSTATUS(status) : -1));
  CHECK((WIFSIGNALED(status) && WTERMSIG(status) == SIGINT));
  CHECK(count_temp_files(dir.path()) == 0);
  CHECK(!fs::exists(final_path));
  // Outside a scope the first SIGINT ends the process, as before.
  const pid_t plain = ::fork();
  if (plain == 0) {
    hils::io::TempFile temp(final_path);
    { hils::io::UnitStopScope ended; }  // hils's handlers in place of Catch2's, then no scope
    std::raise(SIGINT);
    ::_exit(43);
  }
  REQUIRE(::waitpid(plain, &status, 0) == plain);
  CHECK((WIFSIGNALED(status) && WTERMSIG(status) == SIGINT));
  CHECK(count_temp_files(dir.path()) == 0);
}

TEST_CASE("SIGTERM during a study stops at a unit boundary and the same command resumes it",
          "[cli][interrupt]") {
  TempDir dir("interrupt_study");
  // 3 lengths x 4 layers x 2 KV groups = 24 units, the longest length's first (largest first):
  // ~1.3 s of work after the first checkpoint, so that the signal lands before the last unit
  // even when this machine is busy (with 8 units, ~0.1 s, a loaded run once finished first).
  constexpr size_t kUnits = 24;
  const std::string args = " --lengths 2048 4096 8192 --n-layers 4 --queries 64 --W 256";
  const auto whole = hils_in(dir.path(), "-q fidelity --out whole.h5" + args);
  INFO(whole.output);
  REQUIRE(whole.exit_code == 0);

  const auto stopped =
      signal_once_published(dir.path(), "-q fidelity --out f.h5" + args, dir / "f.h5", SIGTERM);
  INFO(stopped.err);
  REQUIRE(stopped.signalled);
  CHECK((WIFSIGNALED(stopped.status) && WTERMSIG(stopped.status) == SIGTERM));  // $? = 143
  const size_t kept = complete_units(dir / "f.h5");
  CHECK(kept >= 1);
  CHECK(kept < kUnits);
  CHECK(stopped.err == fmt::format("hils: interrupted by SIGTERM: f.h5 keeps {} complete unit{} "
                                   "(work on unfinished units is dropped); run the same command "
                                   "again to continue from them\n",
                                   kept, kept == 1 ? "" : "s"));
  CHECK(count_temp_files(dir.path()) == 0);
  CHECK(count_lock_files(dir.path()) == 0);

  const auto resumed = hils_in(dir.path(), "fidelity --out f.h5" + args);
  INFO(resumed.output);
  REQUIRE(resumed.exit_code == 0);
  CHECK_THAT(resumed.output,
             Catch::Contains(fmt::format("{} units run, {} resumed", kUnits - kept, kept)));
  require_same_results(dir / "whole.h5", dir / "f.h5");
  // Once more: nothing left to run, and the KL line says so (was "over 0 pairs: max |gap - KL|
  // = 0, min gap = inf").
  const auto again = hils_in(dir.path(), "fidelity --out f.h5" + args);
  INFO(again.output);
  CHECK(again.exit_code == 0);
  CHECK_THAT(again.output, Catch::Contains(fmt::format("0 units run, {} resumed", kUnits)));
  CHECK_THAT(again.output, Catch::Contains("Taylor gap = KL check: no unit ran now"));
  CHECK_THAT(again.output, !Catch::Contains("inf"));
}

TEST_CASE("SIGTERM to hils plot alone ends its plotting script too and leaves no list or half PNG",
          "[cli][interrupt]") {
  // `kill <hils pid>` (the signal reaches hils alone, not its child) ended hils, while the
  // plotting script drew on, orphaned, and left its .plots.txt (the list hils reads back and
  // removes) in the folder after hils had ended.
  TempDir dir("interrupt_plot");
  REQUIRE(hils_in(dir.path(), "-q fidelity --out f.h5 --lengths 1024 --n-layers 1").exit_code == 0);
  const std::string folder = (dir / "figures").string();  // absolute: in the script's argv
  const auto stopped = signal_once_published(dir.path(), "plot f.h5 --out " + folder, folder,
                                             SIGTERM, std::chrono::milliseconds(100));
  INFO(stopped.err);
  REQUIRE(stopped.signalled);
  CHECK((WIFSIGNALED(stopped.status) && WTERMSIG(stopped.status) == SIGTERM));
  for (int wait = 0; wait < 600 && process_with_argument(folder); ++wait)  // up to 30 s
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK_FALSE(process_with_argument(folder));
  for (const auto& entry : fs::directory_iterator(dir / "figures"))
    CHECK(entry.path().filename().string().rfind('.', 0) != 0);  // no list, no temporary PNG
}

TEST_CASE("a full disk after the first checkpoint says what the file keeps and how to continue",
          "[cli][interrupt][faults]") {
  // Was: "...; nothing was published (an earlier file of that name is untouched)", while the
  // run's own first checkpoint was published (and resumable), with no word on continuing; and
  // a checkpoint copy cut short by a full device said "Input/output error" (libstdc++'s word
  // for a short copy; seen on a tmpfs, which this test cannot mount).
  TempDir dir("full_disk_midway");
  REQUIRE(hils_in(dir.path(), kDump).exit_code == 0);
  const std::string args = kRun.substr(kRun.find(" -p"));
  REQUIRE(hils_in(dir.path(), "-q run acts.h5 -o whole.h5" + args).exit_code == 0);
  // swa's unit makes a 5.2 MB file and full's doubles it: 8000 KiB lets the first checkpoint
  // through, not the second unit's writes.
  const auto full = hils_in_limited(dir.path(), kRun, 8000);
  INFO(full.output);
  CHECK(full.exit_code == 2);
  CHECK_THAT(full.output,
             Catch::Contains("out.h5: expected room to write the output, found File too large; "
                             "this write was not published (the file of that name, as last "
                             "published, is untouched); out.h5 keeps 1 complete unit (work on "
                             "unfinished units is dropped); make room and run the same command "
                             "with --resume to continue from them"));
  CHECK(complete_units(dir / "out.h5") == 1);
  CHECK(count_temp_files(dir.path()) == 0);
  CHECK(count_lock_files(dir.path()) == 0);
  REQUIRE(hils_in(dir.path(), kRun + " --resume").exit_code == 0);
  require_same_results(dir / "whole.h5", dir / "out.h5");
  // The same limit on a run of another configuration into that file, without --resume: its
  // first unit's write fails, nothing of it is published. Was: "out.h5 keeps 3 complete units
  // ...; make room and run the same command with --resume", the units being the earlier run's
  // (read from the file on disk), which --resume then refused to mix.
  const std::string before = file_bytes(dir / "out.h5");
  const auto other = hils_in_limited(dir.path(), "-q run acts.h5 -o out.h5 -p swa -W 128 "
                                     "--landmarks true", 1000);
  INFO(other.output);
  CHECK(other.exit_code == 2);
  CHECK_THAT(other.output, Catch::Contains("out.h5: expected room to write the output, found File "
                                           "too large; this write was not published (the file "
                                           "of that name, as last published, is untouched)"));
  CHECK_THAT(other.output, !Catch::Contains("keeps"));
  CHECK_THAT(other.output, !Catch::Contains("--resume"));
  CHECK(file_bytes(dir / "out.h5") == before);
  CHECK(count_temp_files(dir.path()) == 0);

  // A study: the same command continues (its units are a few tens of KiB each).
  const std::string study = "-q fidelity --lengths 512 1024 --n-layers 2 --queries 8 --W 128";
  REQUIRE(hils_in(dir.path(), study + " --out whole_study.h5").exit_code == 0);
  const auto cut = hils_in_limited(dir.path(), study + " --out study.h5", 150);
  INFO(cut.output);
  CHECK(cut.exit_code == 2);
  const size_t kept = complete_units(dir / "study.h5");
  CHECK(kept >= 1);
  CHECK_THAT(cut.output, Catch::Contains(fmt::format(
                             "study.h5 keeps {} complete unit{} (work on unfinished units is "
                             "dropped); make room and run the same command again to continue "
                             "from them",
                             kept, kept == 1 ? "" : "s")));
  REQUIRE(hils_in(dir.path(), study + " --out study.h5").exit_code == 0);
  require_same_results(dir / "whole_study.h5", dir / "study.h5");
  CHECK(count_temp_files(dir.path()) == 0);
}

TEST_CASE("a bad layer found by a study's unit says to correct the input and not to make room",
          "[cli][interrupt][faults]") {
  // A study reads each layer as its units start, so an Inf in layer 1 of an activation file is
  // found after layer 0's units are published. Was: "...; f.h5 keeps 2 complete units (...);
  // make room and run the same command again to continue from them" (the advice of a full disk,
  // and the same command failed the same way).
  TempDir dir("study_bad_layer");
  REQUIRE(hils_in(dir.path(), "-q dump synthetic -T 300 -S 16 --landmarks false -o one.h5")
              .exit_code == 0);
  hils::io::ActivationFile file = hils::io::read_activation_file(dir / "one.h5");
  file.meta.n_layers = 2;
  file.layers.push_back(file.layers.front());
  hils::io::write_activation_file(dir / "acts.h5", file, hils::io::StorageType::float64);
  {
    H5::H5File h5((dir / "acts.h5").string(), H5F_ACC_RDWR);
    H5::DataSet v = h5.openDataSet("layer1/v");
    std::vector<double> values(static_cast<size_t>(v.getSpace().getSimpleExtentNpoints()));
    v.read(values.data(), H5::PredType::NATIVE_DOUBLE);
    values[5] = std::numeric_limits<double>::infinity();
    v.write(values.data(), H5::PredType::NATIVE_DOUBLE);
  }
  const std::string study = "-q fidelity --activations acts.h5 --lengths 256 --queries 4 "
                            "-W 32 -K 4 --jobs 1 --out f.h5";
  const auto r = hils_in(dir.path(), study);
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("acts.h5: layer1/v: expected finite values, found inf at "
                                       "[0, 0, 5]"));
  CHECK_THAT(r.output, Catch::Contains("f.h5 keeps 2 complete units (work on unfinished units is "
                                       "dropped); correct the input and run the same command "
                                       "again to continue from them"));
  CHECK_THAT(r.output, !Catch::Contains("make room"));
  CHECK(complete_units(dir / "f.h5") == 2);
  CHECK(count_temp_files(dir.path()) == 0);
}
