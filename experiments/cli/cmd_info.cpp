// hils info: not implemented yet (placeholder so that the tool links while it is written).
#include "cli/commands.hpp"

namespace hils::cli {

void register_info(CLI::App& app) {
  auto* cmd = app.add_subcommand("info", "(not implemented yet)");
  cmd->callback([] { throw std::runtime_error("hils info is not implemented yet"); });
}

}  // namespace hils::cli
