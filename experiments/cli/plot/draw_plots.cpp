// Results -> plots through the plotting script; its list of PNGs read back.
#include "cli/plot/draw_plots.hpp"

#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

#include "cli/cli_util.hpp"
#include "cli/commands.hpp"
#include "util/shared_data.hpp"

namespace hils::cli {

// results, folder -> the PNGs plot_study.py drew into folder (it lists them in a file).
std::vector<std::filesystem::path> draw_plots(const std::filesystem::path& results,
                                              const std::filesystem::path& folder) {
  if (!std::filesystem::exists(results))
    throw BadInput(results.string() + ": no such results file");
  const std::filesystem::path script = plots_dir() / "plot_study.py";
  if (!std::filesystem::exists(script))
    throw BadInput(script.string() + ": plotting script not found (set HILS_PLOTS_DIR)");
  make_output_folder(folder, "plots");
  const auto list = folder / ".plots.txt";
  const std::string command = fmt::format("/usr/bin/python3 '{}' '{}' --out '{}' --list '{}'",
                                          script.string(), results.string(), folder.string(),
                                          list.string());
  const int rc = std::system(command.c_str());
  if (rc != 0) {
    if (WIFEXITED(rc) && WEXITSTATUS(rc) == 2)
      throw BadInput(results.string() + ": not a study results file (see the message above)");
    throw std::runtime_error("plotting failed: " + command);
  }
  std::vector<std::filesystem::path> pngs;
  std::ifstream in(list);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) pngs.emplace_back(line);
  std::filesystem::remove(list);
  return pngs;
}

}  // namespace hils::cli
