// hils dump llama2c | synthetic: real-model or synthetic activations -> activation file.
#include "cli/commands.hpp"
#include "cli/dump/dump.hpp"

namespace hils::cli {

// precision -> storage type.
io::StorageType storage_of(const std::string& precision) {
  if (precision == "float32") return io::StorageType::float32;
  if (precision == "float64") return io::StorageType::float64;
  throw BadInput("--precision: expected float32 or float64, got '" + precision + "'");
}

// app -> `hils dump` with its two subcommands.
void register_dump(CLI::App& app) {
  auto* dump = app.add_subcommand("dump", "write an activation file from a real model or a "
                                          "synthetic source");
  dump->require_subcommand(1);
  dump->fallthrough();
  register_llama2c(*dump);
  register_synthetic(*dump);
}

}  // namespace hils::cli
