// hils info FILE: what an activation or results file holds (validating it on the way).
#include <iostream>
#include <memory>

#include "cli/commands.hpp"
#include "cli/info/info_report.hpp"
#include "io/activation_file.hpp"
#include "io/file_error.hpp"
#include "io/hdf5_util.hpp"
#include "io/results_file.hpp"

namespace hils::cli {

namespace {

struct InfoOptions {
  std::string file;
  bool json = false;
  bool no_check = false;
};

// o -> the report of o.file on stdout (JSON with --json).
void report_info(const InfoOptions& o) {
  H5::H5File file = io::open_hdf5(o.file);
  std::string format = io::read_string_attribute(o.file, file, "/", "format");
  nlohmann::json report;
  if (format == io::kActivationFormat)
    report = info::activation_info(o.file, !o.no_check);
  else if (format == io::kResultsFormat)
    report = info::results_info(o.file);
  else
    io::fail(o.file, "/ attribute format", "hils-activations or hils-results",
             "\"" + format + "\"");
  nlohmann::json datasets = nlohmann::json::array();
  info::list_datasets(file.openGroup("/"), "", datasets);
  if (o.json) {
    report["datasets"] = datasets;
    // A path or command line that is not UTF-8 is shown with U+FFFD, not an exception.
    std::cout << report.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  } else {
    info::print_text(report, datasets);
  }
}

// report_info, a file whose metadata the HDF5 library fails on or crashes on (a corrupt file)
// reported as bad input naming it (io::CorruptInputGuard), not an internal error or a crash.
void run_info(const InfoOptions& o) {
  const io::CorruptInputGuard guard(o.file);
  try {
    report_info(o);
  } catch (const H5::Exception& e) {
    io::fail(o.file, "", "a complete HDF5 file",
             "one the HDF5 library cannot read (corrupt: " + e.getFuncName() + ": " +
                 e.getDetailMsg() + ")");
  }
}

}  // namespace

// app -> `hils info` with its options.
void register_info(CLI::App& app) {
  auto options = std::make_shared<InfoOptions>();
  auto* cmd = app.add_subcommand("info", "describe an activation or results file (and validate "
                                         "it)");
  cmd->add_option("file", options->file, "HDF5 file written by hils or the Python dumper")
      ->required();
  cmd->add_flag("--json", options->json, "print a JSON document instead of text");
  cmd->add_flag("--no-check", options->no_check,
                "activation files: skip reading every layer (attributes and layout only)");
  cmd->footer("Examples (files from `hils --help`'s examples):\n  hils info synth.h5\n  hils info results.h5 --json");
  cmd->callback([options] { run_info(*options); });
}

}  // namespace hils::cli
