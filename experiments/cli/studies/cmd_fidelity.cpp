// hils fidelity: Chunk-mass fidelity: surrogate scores vs the true chunk mass
// (reference/SEMANTICS.md §9), per layer, head and length.
#include "cli/commands.hpp"
#include "cli/studies/study_cli.hpp"

namespace hils::cli {

void register_fidelity(CLI::App& app) {
  studies::register_study(
      app, "fidelity",
      "Chunk-mass fidelity: surrogate scores vs the true chunk mass (reference/SEMANTICS.md §9), per layer, head and length.\nExample: hils fidelity --out fidelity.h5 --plot",
      studies::run_fidelity);
}

}  // namespace hils::cli
