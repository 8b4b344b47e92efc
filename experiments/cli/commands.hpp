// The subcommands of the `hils` tool: one register_<name> per cmd_<name>.cpp, each in the folder
// of its step of the data flow (README, "Layout"):
//   dump/      source -> activations             (hils dump llama2c | synthetic)
//   run/       activations -> reference -> results (hils run)
//   studies/   source -> reference -> results    (hils fidelity, overlap, extrapolate, studies)
//   plot/      results -> plots                  (hils plot)
//   info/, verify/  reading files back           (hils info, hils verify: a kernel's outputs
//                                                 judged by the oracle)
//   cases/     the oracle's hard cases -> verify files without outputs, for a kernel's harness
//                                                (hils cases)
//
// To add a subcommand: write experiments/cli/<folder>/cmd_<name>.cpp defining
//   void hils::cli::register_<name>(CLI::App& app)
// that adds `app.add_subcommand("<name>", ...)` with its options and a callback, declare it below
// (one line) and call it from main.cpp (one line). The CMake globs cli/*/*.cpp.
//
// Exit codes (main.cpp maps exceptions to them, so a callback just throws):
//   0 success
//   1 a verification or check failed (a verdict): throw CheckFailed
//   2 bad input (usage, missing or malformed file, bad config): throw hils::InvalidArgument
//     (or BadInput, or any hils::io error, which derive from it); CLI11 parse errors also give 2
//   3 internal error: any other exception
//   130 / 143 (the shell's 128 + signal): SIGINT (Ctrl-C) or SIGTERM stopped `hils run` or a
//     study at a unit boundary: throw Interrupted, whose line names the results file; main
//     then ends the process by that same signal (so a calling shell script stops too), or
//     under MPI exits with 128 + signal after the ranks have ended together
#pragma once

#include <stdexcept>
#include <string>

#include <CLI/CLI.hpp>

#include "hils/types.hpp"

namespace hils::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitCheckFailed = 1;
inline constexpr int kExitBadInput = 2;
inline constexpr int kExitInternal = 3;

// A verdict: the command ran correctly and found that a check does not hold (exit 1).
class CheckFailed : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Bad input found by the command line layer itself (exit 2).
class BadInput : public hils::InvalidArgument {
 public:
  using hils::InvalidArgument::InvalidArgument;
};

// A run stopped by a signal at a unit boundary (see the exit codes above); what() is the line
// for stderr (interrupted_message(), cli_util.hpp).
class Interrupted : public std::runtime_error {
 public:
  Interrupted(int signal, const std::string& message)
      : std::runtime_error(message), signal_number(signal) {}
  int signal_number;
};

// Options shared by every subcommand, set on the top-level app by main.cpp.
struct GlobalOptions {
  bool quiet = false;  // --quiet: no progress bar, no informational output on stderr
};
GlobalOptions& global_options();

void register_info(CLI::App& app);
void register_dump(CLI::App& app);
void register_run(CLI::App& app);
// hils fidelity, overlap, extrapolate: one command per row of studies::kStudies
// (cli/studies/study_table.hpp), in its order.
void register_study_commands(CLI::App& app);
void register_plot(CLI::App& app);
void register_studies(CLI::App& app);
void register_verify(CLI::App& app);
void register_cases(CLI::App& app);

}  // namespace hils::cli
