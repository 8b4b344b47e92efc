// The `hils` command: the subcommands of experiments/cli/<step>/cmd_*.cpp registered (list and
// folders in commands.hpp); exceptions become exit codes (see commands.hpp).
#include <csignal>
#include <cstdio>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iostream>
#include <new>
#include <optional>

#include <H5Cpp.h>

#include "cli/commands.hpp"
#include "cli/cli_util.hpp"
#include "io/hdf5_util.hpp"
#include "io/results_file.hpp"
#include "parallel/session.hpp"

namespace {

// Exceptions -> exit codes 1 (verdict), 2 (bad input), 3 (internal).
int run_app(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
    return hils::cli::kExitOk;
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);  // prints help or the usage error
    return code == 0 ? hils::cli::kExitOk : hils::cli::kExitBadInput;
  } catch (const hils::parallel::JobEnded&) {
    return hils::cli::kExitOk;  // an MPI worker of a failed run: rank 0 reports the failure
  } catch (const hils::cli::CheckFailed& e) {
    std::cerr << "hils: check failed: " << e.what() << "\n";
    return hils::cli::kExitCheckFailed;
  } catch (const hils::InvalidArgument& e) {
    std::cerr << "hils: bad input: " << e.what() << "\n";
    return hils::cli::kExitBadInput;
  } catch (const std::bad_alloc&) {
    // Nearly always a size from the input or the flags that this machine cannot hold.
    std::cerr << "hils: bad input: out of memory: expected sizes (T, heads, dims, layers, "
                 "queries) whose data fit in this machine's memory; choose smaller ones\n";
    return hils::cli::kExitBadInput;
  } catch (const H5::Exception& e) {
    std::cerr << "hils: internal error (HDF5): " << e.getFuncName() << ": "
              << e.getDetailMsg() << "\n";
    return hils::cli::kExitInternal;
  } catch (const std::exception& e) {
    std::cerr << "hils: internal error: " << e.what() << "\n";
    return hils::cli::kExitInternal;
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
  hils::cli::register_fidelity(app);
  hils::cli::register_overlap(app);
  hils::cli::register_extrapolate(app);
  hils::cli::register_plot(app);
  hils::cli::register_studies(app);
  hils::cli::register_verify(app);
  // Set after the subcommands are added: a subcommand inherits the footer of its parent at
  // creation, and these examples are the top level's (the study commands printed them).
  app.footer(
      "Examples:\n"
      "  hils dump llama2c -o llama.h5                  # stories260K over tinystories_sample.txt\n"
      "  hils dump synthetic -o synth.h5 --generator topics -T 4096 -S 64\n"
      "  hils info synth.h5\n"
      "  hils run synth.h5 -o results.h5 --preset full,nsa,hils -S 64 -W 512 -K 8 --landmarks true\n"
      "  hils info results.h5\n"
      "Exit codes: 0 success, 1 a check failed, 2 bad input, 3 internal error.\n"
      "Run `hils <command> --help` for a command's options and examples.");

  int code = run_app(app, argc, argv);
  // A report cut short (full disk, file-size limit) must not end in exit 0.
  std::cout.flush();
  if (!std::cout && code == hils::cli::kExitOk) {
    std::cerr << "hils: bad input: expected room to write the standard output, found "
              << std::strerror(errno) << "; the output is incomplete\n";
    code = hils::cli::kExitBadInput;
  }
  if (code != hils::cli::kExitOk) session->fail(code);  // ends every rank of an MPI job
  if (hils::io::hdf5_file_abandoned()) {
    // A write failed (full disk) and left HDF5 a file it cannot close; its shutdown at exit
    // would crash on it. Temporary files are gone already (their owners were destroyed).
    session.reset();  // MPI ends first (std::_Exit runs no destructors)
    std::cout.flush();
    std::cerr.flush();
    std::fflush(nullptr);
    std::_Exit(code);
  }
  return code;
}
