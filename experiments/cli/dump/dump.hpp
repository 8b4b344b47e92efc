// hils dump: a source -> an activation file (data/activation_format.md). One file per source:
// dump_llama2c.cpp (a llama2.c model over a text), dump_synthetic.cpp (the seeded generators of
// experiments/sources/synthetic.hpp); cmd_dump.cpp adds the command.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "io/activation_file.hpp"

namespace hils::cli {

// `hils dump llama2c` and `hils dump synthetic`, added to the `dump` command.
void register_llama2c(CLI::App& dump);
void register_synthetic(CLI::App& dump);

// --precision float32 | float64 -> the storage type, or BadInput naming the flag.
io::StorageType storage_of(const std::string& precision);

}  // namespace hils::cli
