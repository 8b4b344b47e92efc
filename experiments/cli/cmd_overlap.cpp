// hils overlap: Chunk overlap of adjacent queries' selections (paper §7.2, Fig. 7), per layer, KV group and length.
#include <iostream>
#include <memory>

#include "cli/commands.hpp"
#include "hils/analysis/study_cli.hpp"

namespace hils::cli {

void register_overlap(CLI::App& app) {
  auto args = std::make_shared<studies::StudyArgs>();
  auto* cmd = app.add_subcommand(
      "overlap", "Chunk overlap of adjacent queries' selections (paper §7.2, Fig. 7), per layer, KV group and length.\nExample: hils overlap --out overlap.h5 --lengths 4096 16384 65536");
  studies::add_study_options(cmd, *args);
  cmd->callback([args] {
    const auto path = studies::run_overlap(*args);
    std::cout << "results: " << path.string() << "\n";
    if (args->plot) {
      const auto folder = path.parent_path() / (path.stem().string() + "_plots");
      for (const auto& png : studies::draw_plots(path, folder))
        std::cout << "plot: " << png.string() << "\n";
    }
  });
}

}  // namespace hils::cli
