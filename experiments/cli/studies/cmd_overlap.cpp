// hils overlap: Chunk overlap of adjacent queries' selections (paper §7.2, Fig. 7), per layer, KV group and length.
#include "cli/commands.hpp"
#include "cli/studies/study_cli.hpp"

namespace hils::cli {

void register_overlap(CLI::App& app) {
  studies::register_study(
      app, "overlap",
      "Chunk overlap of adjacent queries' selections (paper §7.2, Fig. 7), per layer, KV group and length.\nExample: hils overlap --out overlap.h5 --lengths 4096 16384 65536",
      studies::run_overlap);
}

}  // namespace hils::cli
