// hils plot: the plots of a study results file, drawn from the file alone (matplotlib).
#include <iostream>
#include <memory>

#include "cli/commands.hpp"
#include "cli/plot/draw_plots.hpp"
#include "cli/spec_flags.hpp"

namespace hils::cli {

void register_plot(CLI::App& app) {
  auto results = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  auto* cmd = app.add_subcommand(
      "plot", "Draw the plots of a fidelity, overlap or extrapolation results file (PNG).\n"
              "Example: hils plot overlap.h5 --out plots/     # overlap.h5 from `hils overlap --out overlap.h5`");
  cmd->add_option("results", *results, "results file of hils fidelity/overlap/extrapolate")
      ->required();
  add_output_option(cmd, out.get(), "folder for the PNGs (default: <results>_plots)");
  cmd->callback([results, out] {
    const std::filesystem::path path = *results;
    const std::filesystem::path folder =
        out->empty() ? path.parent_path() / (path.stem().string() + "_plots")
                     : std::filesystem::path(*out);
    for (const auto& png : draw_plots(path, folder))
      std::cout << "plot: " << png.string() << "\n";
  });
}

}  // namespace hils::cli
