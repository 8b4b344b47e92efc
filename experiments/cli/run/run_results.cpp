// hils run's results file: created, or resumed with the layers and mechanisms of both runs.
#include "cli/run/run_results.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "cli/cli_util.hpp"
#include "cli/commands.hpp"
#include "config/spec_codec.hpp"
#include "io/hdf5_util.hpp"
#include "parallel/session.hpp"

namespace hils::cli::run_command {

namespace {

// BadInput when a mechanism of the same name was run with a different spec.
nlohmann::json merged_config(const std::string& output, const RunPlan& plan,
                             nlohmann::json config) {
  io::ResultsReader reader(output);
  require_results_of("hils run", output, reader.config());
  for (const auto& spec : plan.mechanisms) {
    if (!reader.has_attribute(spec.name, "spec")) continue;
    auto stored = nlohmann::json::parse(reader.string_attribute(spec.name, "spec"));
    if (stored != config::spec_to_json(spec))
      throw BadInput(fmt::format("{}: mechanism '{}' was run with another spec: {}; give it "
                                 "another name or write a new results file",
                                 output, spec.name,
                                 io::config_differences(stored, config::spec_to_json(spec))));
  }
  nlohmann::json existing = reader.config();
  std::vector<int64_t> layers = existing.value("layers", std::vector<int64_t>{});
  for (int64_t l : plan.layers)
    if (std::find(layers.begin(), layers.end(), l) == layers.end()) layers.push_back(l);
  std::sort(layers.begin(), layers.end());
  nlohmann::json mechanisms = existing.value("mechanisms", nlohmann::json::array());
  for (const auto& spec : config["mechanisms"]) {
    bool known = false;
    for (const auto& m : mechanisms) known = known || m["name"] == spec["name"];
    if (!known) mechanisms.push_back(spec);
  }
  config["layers"] = layers;
  config["mechanisms"] = mechanisms;
  return config;
}

}  // namespace

// flags, plan, provenance -> the open results file (mpi_ranks recorded; a resumed file's config
// replaced by the merged one).
RunResults::RunResults(const RunFlags& flags, const RunPlan& plan, io::Provenance provenance)
    : lock_(flags.output, provenance.command),
      writer_(open(flags, plan, provenance)),
      sink_(writer_) {
  if (resuming_) writer_.set_attribute("", "config", io::json_text(provenance.config));
  writer_.set_attribute("", "mpi_ranks", static_cast<double>(parallel::ranks()));
}

// flags, plan, provenance -> a new writer, or one that resumes flags.output (provenance's config
// merged with the file's).
io::ResultsWriter RunResults::open(const RunFlags& flags, const RunPlan& plan,
                                   io::Provenance& provenance) {
  std::error_code ec;
  resuming_ = flags.resume && std::filesystem::exists(flags.output, ec);
  if (!resuming_) return io::ResultsWriter::create(flags.output, provenance);
  provenance.config = merged_config(flags.output, plan, provenance.config);
  // Layers and mechanisms may grow when resuming; every other setting must match.
  return io::ResultsWriter::resume(flags.output, provenance, {"layers", "mechanisms"});
}

}  // namespace hils::cli::run_command
