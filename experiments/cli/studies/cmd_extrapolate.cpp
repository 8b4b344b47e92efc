// hils extrapolate: Length extrapolation under RoPE, HoPE and NoPE, and the needle grid.
#include "cli/commands.hpp"
#include "cli/studies/study_cli.hpp"

namespace hils::cli {

void register_extrapolate(CLI::App& app) {
  studies::register_study(
      app, "extrapolate",
      "Length extrapolation under RoPE, HoPE and NoPE, and the needle grid.\nExample: hils extrapolate --out extrapolation.h5",
      studies::run_extrapolation);
}

}  // namespace hils::cli
