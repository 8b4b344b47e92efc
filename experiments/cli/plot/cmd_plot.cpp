// hils plot: the plots of a study results file, drawn from the file alone (matplotlib).
#include <iostream>
#include <memory>

#include "cli/commands.hpp"
#include "cli/plot/draw_plots.hpp"
#include "cli/spec_flags.hpp"
#include "cli/studies/study_table.hpp"

namespace hils::cli {

namespace {

// "a, b or c" of the studies of kStudies (sep ", " and " or "), or "a/b/c" of their commands.
std::string studies_listed(bool commands) {
  std::string list;
  const auto& rows = studies::kStudies;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (i > 0) list += commands ? "/" : i + 1 == rows.size() ? " or " : ", ";
    list += commands ? rows[i].command : rows[i].study;
  }
  return list;
}

}  // namespace

void register_plot(CLI::App& app) {
  auto results = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  auto* cmd = app.add_subcommand(
      "plot", "Draw the plots of a " + studies_listed(false) + " results file (PNG).\n"
              "Example: hils plot overlap.h5 --out plots/     # overlap.h5 from `hils overlap --out overlap.h5`");
  cmd->add_option("results", *results, "results file of hils " + studies_listed(true))
      ->required();
  auto* out_option =
      add_output_option(cmd, out.get(), "folder for the PNGs (default: <results>_plots)");
  cmd->callback([results, out, out_option] {
    const std::filesystem::path path = *results;
    const bool given = out_option->count() > 0;  // --out "" (an unset variable) is no default
    const std::filesystem::path folder =
        given ? std::filesystem::path(*out) : path.parent_path() / (path.stem().string() + "_plots");
    for (const auto& png : draw_plots(path, folder, given ? "--out" : "plots"))
      std::cout << "plot: " << png.string() << "\n";
  });
}

}  // namespace hils::cli
