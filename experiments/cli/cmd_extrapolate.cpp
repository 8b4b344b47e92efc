// hils extrapolate: Length extrapolation under RoPE, HoPE and NoPE, and the needle grid.
#include <iostream>
#include <memory>

#include "cli/commands.hpp"
#include "hils/analysis/study_cli.hpp"

namespace hils::cli {

void register_extrapolate(CLI::App& app) {
  auto args = std::make_shared<studies::StudyArgs>();
  auto* cmd = app.add_subcommand(
      "extrapolate", "Length extrapolation under RoPE, HoPE and NoPE, and the needle grid.\nExample: hils extrapolate --out extrapolation.h5");
  studies::add_study_options(cmd, *args);
  cmd->callback([args] {
    const auto path = studies::run_extrapolation(*args);
    std::cout << "results: " << path.string() << "\n";
    if (args->plot) {
      const auto folder = path.parent_path() / (path.stem().string() + "_plots");
      for (const auto& png : studies::draw_plots(path, folder))
        std::cout << "plot: " << png.string() << "\n";
    }
  });
}

}  // namespace hils::cli
