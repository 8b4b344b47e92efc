// hils fidelity: Chunk-mass fidelity: surrogate scores vs the true chunk mass (SPEC §9), per layer, head and length.
#include <iostream>
#include <memory>

#include "cli/commands.hpp"
#include "hils/analysis/study_cli.hpp"

namespace hils::cli {

void register_fidelity(CLI::App& app) {
  auto args = std::make_shared<studies::StudyArgs>();
  auto* cmd = app.add_subcommand(
      "fidelity", "Chunk-mass fidelity: surrogate scores vs the true chunk mass (SPEC §9), per layer, head and length.\nExample: hils fidelity --out fidelity.h5 --plot");
  studies::add_study_options(cmd, *args);
  cmd->callback([args] {
    const auto path = studies::run_fidelity(*args);
    std::cout << "results: " << path.string() << "\n";
    if (args->plot) {
      const auto folder = path.parent_path() / (path.stem().string() + "_plots");
      for (const auto& png : studies::draw_plots(path, folder))
        std::cout << "plot: " << png.string() << "\n";
    }
  });
}

}  // namespace hils::cli
