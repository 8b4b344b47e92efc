// hils extrapolate: Length extrapolation under RoPE, HoPE and NoPE, and the needle grid.
#include "cli/commands.hpp"
#include "cli/studies/study_cli.hpp"

namespace hils::cli {

void register_extrapolate(CLI::App& app) {
  studies::register_study(
      app, "extrapolate",
      "Length extrapolation under RoPE, HoPE and NoPE, and the needle grid.\n"
      "Example (seconds): hils extrapolate --out extrapolation.h5 --lengths 1024 2048 --n-layers 1 --queries 8\n"
      "The defaults (lengths 1024 to 65536, 2 layers) take ~16 s on 2 cores.",
      studies::run_extrapolation);
}

}  // namespace hils::cli
