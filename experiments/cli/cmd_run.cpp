// hils run: not implemented yet (placeholder so that the tool links while it is written).
#include "cli/commands.hpp"

namespace hils::cli {

void register_run(CLI::App& app) {
  auto* cmd = app.add_subcommand("run", "(not implemented yet)");
  cmd->callback([] { throw std::runtime_error("hils run is not implemented yet"); });
}

}  // namespace hils::cli
