// Results -> plots through the plotting script; its list of PNGs read back.
#include "cli/plot/draw_plots.hpp"

#include <spawn.h>
#include <sys/wait.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

#include "cli/cli_util.hpp"
#include "cli/commands.hpp"
#include "io/hdf5_util.hpp"
#include "util/shared_data.hpp"

extern "C" char** environ;

namespace hils::cli {

namespace {

// argv -> the child's wait status; run without a shell, so that no path is ever parsed as a
// command (a results path holding a quote or `$(...)` is only a name). A signal that ends hils
// meanwhile ends the child too (io::ChildProcessScope).
int run_without_shell(std::vector<std::string> args) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int err = posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ);
  if (err != 0)
    throw BadInput(std::string(argv[0]) + ": expected a Python 3 interpreter for the plots, "
                   "could not start it (" + std::strerror(err) + ")");
  io::ChildProcessScope ends_with_us(pid);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) throw std::runtime_error("waiting for the plotting script failed");
  return status;
}

}  // namespace

// results, folder -> the PNGs plot_study.py drew into folder (it lists them in a file).
std::vector<std::filesystem::path> draw_plots(const std::filesystem::path& results,
                                              const std::filesystem::path& folder,
                                              const std::string& folder_option) {
  if (!std::filesystem::exists(results))
    throw BadInput(results.string() + ": no such results file");
  if (std::filesystem::is_directory(results))  // h5py's words were an errno dump
    throw BadInput(results.string() + ": expected a results file, found a folder");
  const std::filesystem::path script = plots_dir() / "plot_study.py";
  if (!std::filesystem::exists(script))
    throw BadInput(script.string() + ": plotting script not found (set HILS_PLOTS_DIR)");
  make_output_folder(folder, folder_option);
  // The script's list of the PNGs it drew: removed however hils ends (a signal too).
  const io::TempFile temp_list(folder / "plots.txt");
  const auto& list = temp_list.path();
  const int rc = run_without_shell({"/usr/bin/python3", script.string(), results.string(),
                                     "--out", folder.string(), "--list", list.string()});
  // The script's statuses: 2 = not a study results file of this version, 3 = the plots could
  // not be written (full disk, read-only folder), 4 = a module it imports is missing; each
  // named on stderr by the script.
  if (WIFSIGNALED(rc)) {
    if (WTERMSIG(rc) == SIGINT) std::raise(SIGINT);  // Ctrl-C: end as the script did
    throw std::runtime_error(fmt::format("plotting script killed by signal {}", WTERMSIG(rc)));
  }
  if (rc != 0) {
    if (WIFEXITED(rc) && WEXITSTATUS(rc) == 2)
      throw BadInput(results.string() + ": not a study results file (see the message above)");
    if (WIFEXITED(rc) && WEXITSTATUS(rc) == 3)
      throw BadInput(folder.string() + ": expected a writable plot folder with room (see the "
                     "message above); no partial PNG was kept");
    if (WIFEXITED(rc) && WEXITSTATUS(rc) == 4)
      throw BadInput("/usr/bin/python3: expected the modules the plotting script imports (see "
                     "the message above); " + results.string() + " is complete: `hils plot` "
                     "draws it once they are installed");
    throw std::runtime_error(fmt::format("plotting failed (exit {}): {}", WEXITSTATUS(rc),
                                         script.string()));
  }
  std::vector<std::filesystem::path> pngs;
  std::ifstream in(list);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) pngs.emplace_back(line);
  return pngs;
}

}  // namespace hils::cli
