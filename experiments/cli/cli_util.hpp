// Small helpers shared by the experiments engineer's subcommands (not part of the register_ API).
#pragma once

#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

namespace hils::cli {

// Informational line on stderr unless --quiet.
void note(const std::string& text);
// The command line as one string, for provenance.
std::string command_line();
void set_command_line(int argc, char** argv);
// A path that must exist as a regular file, or BadInput naming the option and the path.
void require_input_file(const std::filesystem::path& path, const std::string& option,
                        const std::string& hint = "");

}  // namespace hils::cli
