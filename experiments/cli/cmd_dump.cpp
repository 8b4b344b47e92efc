// hils dump: not implemented yet (placeholder so that the tool links while it is written).
#include "cli/commands.hpp"

namespace hils::cli {

void register_dump(CLI::App& app) {
  auto* cmd = app.add_subcommand("dump", "(not implemented yet)");
  cmd->callback([] { throw std::runtime_error("hils dump is not implemented yet"); });
}

}  // namespace hils::cli
