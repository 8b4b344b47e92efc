// Results -> plots: the one way `hils` draws a study's figures (hils plot, a study's --plot,
// hils studies), by the plotting script analysis/plots/plot_study.py.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace hils::cli {

// Draws every plot of a results file into `folder` (created; its errors name `folder_option`,
// the option that set it) with /usr/bin/python3 (matplotlib); returns the PNG paths. Throws
// BadInput when the file is not a study result.
std::vector<std::filesystem::path> draw_plots(const std::filesystem::path& results,
                                              const std::filesystem::path& folder,
                                              const std::string& folder_option);

}  // namespace hils::cli
