// The `hils` command: the subcommands of experiments/cli/<step>/cmd_*.cpp registered (list and
// folders in commands.hpp); exceptions become exit codes (see commands.hpp).
#include <csignal>
#include <cstdio>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <iostream>
#include <new>
#include <optional>
#include <string>
#include <system_error>

#include <H5Cpp.h>

#include "cli/commands.hpp"
#include "cli/cli_util.hpp"
#include "io/hdf5_util.hpp"
#include "io/results_file.hpp"
#include "parallel/session.hpp"

namespace {

// How a command ended: its exit code and the line for stderr ("" when there is none, or when
// CLI11 printed it already), without the leading "hils: ".
struct Outcome {
  int code = hils::cli::kExitOk;
  std::string message;
  int signal = 0;  // the signal that stopped a run (hils::cli::Interrupted), else 0
};

// The error of a report cut short: nothing the command computed is lost, but stdout is.
std::string stdout_error(const std::string& reason) {
  return "bad input: expected room to write the standard output, found " + reason +
         "; the output is incomplete";
}

// A failed write of the report (fmt::print throws std::system_error with the write's errno);
// not a filesystem_error, which names a path and has its own causes.
bool is_write_error(const std::system_error& e) {
  if (dynamic_cast<const std::filesystem::filesystem_error*>(&e)) return false;
  const int code = e.code().value();
  return e.code().category() == std::generic_category() &&
         (code == ENOSPC || code == EFBIG || code == EDQUOT || code == EIO);
}

// argv -> "WORDS: expected a command, one of A, B (hils ... --help)" when the first word that
// is not a flag names no command of `app` (or of the command it names), else "". CLI11 said
// "A subcommand is required" for `hils fidelty`, as if none had been typed.
std::string unknown_command(CLI::App& app, int argc, char** argv) {
  CLI::App* at = &app;
  std::string typed, help = "hils";
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    if (word.empty() || word[0] == '-') continue;  // the flags before a command take no value
    const auto commands = at->get_subcommands([](CLI::App*) { return true; });
    if (commands.empty()) return "";
    typed += (typed.empty() ? "" : " ") + word;
    std::string names;
    CLI::App* next = nullptr;
    for (CLI::App* command : commands) {
      names += (names.empty() ? "" : ", ") + command->get_name();
      if (command->get_name() == word) next = command;
    }
    if (!next)
      return typed + ": expected a command, one of " + names + " (" + help + " --help)";
    at = next, help += " " + word;
  }
  return "";
}

// Exceptions -> exit codes 1 (verdict), 2 (bad input), 3 (internal). `speaks`: false on an MPI
// worker, which leaves help and usage errors to rank 0 (the same argv gives the same ones).
Outcome run_app(CLI::App& app, int argc, char** argv, bool speaks) {
  try {
    app.parse(argc, argv);
    return {};
  } catch (const CLI::ParseError& e) {
    if (const auto unknown = unknown_command(app, argc, argv);
        !unknown.empty() && dynamic_cast<const CLI::RequiredError*>(&e))
      return {hils::cli::kExitBadInput, "bad input: " + unknown};
    int code = speaks ? app.exit(e) : e.get_exit_code();  // app.exit prints help or the error
    return {code == 0 ? hils::cli::kExitOk : hils::cli::kExitBadInput, ""};
  } catch (const hils::parallel::JobEnded&) {
    return {};  // an MPI worker of a failed run: rank 0 reports the failure
  } catch (const hils::cli::Interrupted& e) {
    return {128 + e.signal_number, e.what(), e.signal_number};
  } catch (const hils::cli::CheckFailed& e) {
    return {hils::cli::kExitCheckFailed, std::string("check failed: ") + e.what()};
  } catch (const hils::InvalidArgument& e) {
    return {hils::cli::kExitBadInput, std::string("bad input: ") + e.what()};
  } catch (const std::bad_alloc&) {
    // Nearly always a size from the input or the flags that this machine cannot hold.
    return {hils::cli::kExitBadInput,
            "bad input: out of memory: expected sizes (T, heads, dims, layers, queries) whose "
            "data fit in this machine's memory; choose smaller ones"};
  } catch (const std::system_error& e) {
    // fmt::print's "cannot write to file": the report on stdout met a full disk or ulimit -f.
    if (is_write_error(e))
      return {hils::cli::kExitBadInput, stdout_error(e.code().message())};
    return {hils::cli::kExitInternal, std::string("internal error: ") + e.what()};
  } catch (const H5::Exception& e) {
    return {hils::cli::kExitInternal,
            "internal error (HDF5): " + e.getFuncName() + ": " + e.getDetailMsg()};
  } catch (const std::exception& e) {
    return {hils::cli::kExitInternal, std::string("internal error: ") + e.what()};
  }
}

}  // namespace

int main(int argc, char** argv) {
  // One rank of `mpirun -n N hils ...` when started so (experiments/parallel/session.hpp).
  // (optional only so that it can be ended before std::_Exit below)
  std::optional<hils::parallel::Session> session(std::in_place, argc, argv);
  if (!session->holds_results()) hils::cli::global_options().quiet = true;
  // HDF5 prints its own error stack by default; our readers report errors themselves.
  H5::Exception::dontPrint();
  // Past a file-size limit (ulimit -f) a write then fails with EFBIG and is reported like a
  // full disk, instead of the process being killed with its temporary file left behind.
  std::signal(SIGXFSZ, SIG_IGN);
  hils::cli::set_command_line(argc, argv);
  CLI::App app{"hils: activations in, attention mechanisms run, results out (HiLS-Attention "
               "reference simulator)"};
  app.set_version_flag("--version", "hils " + hils::io::project_version() + " (commit " +
                                        hils::io::git_commit() + ")",
                       "print the version and the git commit it was built from, then exit");
  app.require_subcommand(1);
  // Global flags (--quiet) may also follow the subcommand.
  app.fallthrough();
  app.add_flag("-q,--quiet", hils::cli::global_options().quiet,
               "no progress bar and no informational messages (for scripts)");
  hils::cli::register_info(app);
  hils::cli::register_dump(app);
  hils::cli::register_run(app);
  hils::cli::register_study_commands(app);
  hils::cli::register_plot(app);
  hils::cli::register_studies(app);
  hils::cli::register_verify(app);
  hils::cli::register_cases(app);
  hils::cli::check_integer_options(app);  // after every option exists
  // Set after the subcommands are added: a subcommand inherits the footer of its parent at
  // creation, and these examples are the top level's (the study commands printed them).
  app.footer(
      "Examples:\n"
      "  hils dump llama2c -o llama.h5                  # stories260K over tinystories_sample.txt\n"
      "  hils dump synthetic -o synth.h5 --generator topics -T 4096 -S 64\n"
      "  hils info synth.h5\n"
      "  hils run synth.h5 -o results.h5 --preset full,nsa,hils -S 64 -W 512 -K 8 --landmarks true\n"
      "  hils info results.h5\n"
      "Exit codes: 0 success, 1 a check failed, 2 bad input, 3 internal error. Stopped by\n"
      "Ctrl-C or SIGTERM (hils run, the studies: the results file keeps its complete units; the\n"
      "same command, hils run's with --resume, continues), the process ends by that signal:\n"
      "130 or 143 in the shell (under mpirun: README, \"Stopping a run\").\n"
      "Run `hils <command> --help` for a command's options and examples.");

  // Only rank 0 of an MPI job speaks: a worker's message goes to rank 0, which prints it unless
  // it is rank 0's own (flags, config and inputs are the same on every rank).
  const bool speaks = session->holds_results();
  auto [code, message, signal] = run_app(app, argc, argv, speaks);
  // A report cut short (full disk, file-size limit) must not end in exit 0.
  std::cout.flush();
  if (!std::cout && code == hils::cli::kExitOk) {
    message = stdout_error(std::strerror(errno));
    code = hils::cli::kExitBadInput;
  }
  if (speaks && !message.empty()) std::cerr << "hils: " + message + "\n";  // one write
  if (code != hils::cli::kExitOk) session->fail(code, message);  // ends every rank of an MPI job
  if (hils::io::hdf5_file_abandoned()) {
    // A write failed (full disk) and left HDF5 a file it cannot close; its shutdown at exit
    // would crash on it. Temporary files are gone already (their owners were destroyed).
    session.reset();  // MPI ends first (std::_Exit runs no destructors)
    std::cout.flush();
    std::cerr.flush();
    std::fflush(nullptr);
    std::_Exit(code);
  }
  if (signal != 0 && hils::parallel::ranks() == 1) {
    // Stopped by SIGINT/SIGTERM, its files closed and its line printed: end by that signal, as
    // a program that does not catch it would, so that the shell's loop or `make` calling hils
    // stops too (the shell's $? is 128 + signal). Under MPI the ranks end by exit(128 + signal)
    // after MPI_Finalize instead: a rank killed by a signal makes mpirun report a crash.
    session.reset();
    std::cout.flush();
    std::cerr.flush();
    std::signal(signal, SIG_DFL);
    std::raise(signal);
  }
  return code;
}
