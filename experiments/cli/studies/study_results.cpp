// A study's results file over the HDF5 results writer (experiments/io/), and the small helpers
// of a study run's reporting.
#include "cli/studies/study_results.hpp"

#include <numeric>

#include "cli/cli_util.hpp"
#include "hils/analysis/extrapolation.hpp"
#include "io/activation_file.hpp"
#include "io/hdf5_util.hpp"
#include "io/results_file.hpp"
#include "io/results_sink.hpp"
#include "parallel/session.hpp"

namespace hils::cli::studies {

// The study's results file: locked, the earlier (interrupted) file kept for reading back its
// units, and the writer seen as a sink (io::ResultsWriterSink).
class ResultsFileSink {
 public:
  ResultsFileSink(const std::filesystem::path& path, const io::Provenance& provenance)
      : lock_(path, provenance.command),
        writer_(open(path, provenance)),
        sink_(writer_, io::ResultsWriterSink::ReadBack::written_and_previous, previous_.get()) {}
  analysis::ResultSink& sink() { return sink_; }
  io::ResultsWriter& writer() { return writer_; }
  void commit() { writer_.commit(); }
  size_t units_published() const { return writer_.units_published(); }

 private:
  io::ResultsWriter open(const std::filesystem::path& path, const io::Provenance& provenance) {
    if (std::filesystem::exists(path)) {
      previous_ = std::make_unique<io::ResultsReader>(path);
      require_results_of(results_producer(provenance.config), path, previous_->config());
    }
    return io::ResultsWriter::open(path, provenance);
  }
  io::OutputLock lock_;  // taken before the earlier file is read (see io::OutputLock)
  std::unique_ptr<io::ResultsReader> previous_;
  io::ResultsWriter writer_;
  io::ResultsWriterSink sink_;
};

namespace {

// The layer a study's unit read: its "layer<l>" segment, or the needle layer for a needle unit
// ("needle/rope/T512"); none for the summaries.
std::optional<int64_t> study_unit_layer(const std::string& unit) {
  if (unit.rfind("needle/", 0) == 0 && unit != "needle/summary")
    return analysis::ExtrapolationOptions{}.needle_layer;
  return unit_layer(unit);
}

// The activation file's fingerprints against those the results file recorded for the layers
// of its complete units (a re-dumped file is refused), then recorded. Each layer is read once
// more for it, up front; a bad value is still found by the units that read it.
void check_activation_fingerprints(io::ResultsWriter& writer, const std::filesystem::path& path,
                                   const Resolved& r) {
  const io::ActivationMeta meta = io::read_activation_meta(r.activations);
  std::vector<int64_t> layers(static_cast<size_t>(r.source.n_layers));
  std::iota(layers.begin(), layers.end(), int64_t{0});
  check_and_record_fingerprints(
      writer, path, r.activations, "--activations", layers,
      [&](int64_t l) -> std::optional<std::string> {
        if (l < 0 || l >= meta.n_layers) return std::nullopt;
        return io::layer_fingerprint(r.activations, meta, l);
      },
      study_unit_layer);
}

}  // namespace

// path, r, command -> the results file of `hils <command>` with r's config as provenance, on the
// process that holds the results.
StudyResults::StudyResults(const std::filesystem::path& path, const Resolved& r,
                           const std::string& command) {
  if (!parallel::holds_results()) return;
  const io::Provenance provenance{r.config, 0x5eed,
                                  command_line().empty() ? "hils " + command : command_line()};
  file_ = std::make_unique<ResultsFileSink>(path, provenance);
  if (!r.activations.empty()) check_activation_fingerprints(file_->writer(), path, r);
  file_->sink().set_attribute("", "mpi_ranks", static_cast<double>(parallel::ranks()));
}

StudyResults::~StudyResults() = default;

analysis::ResultSink& StudyResults::sink() { return file_ ? file_->sink() : unused_; }

size_t StudyResults::units_published() const { return file_ ? file_->units_published() : 0; }

void StudyResults::commit() {
  if (file_) file_->commit();
}

// args, command -> the results file's path.
std::filesystem::path out_path(const StudyArgs& a, const std::string& command) {
  if (a.out.empty())
    throw BadInput("--out: a results file path is needed for hils " + command);
  if (!a.activations.empty())
    require_distinct_files(a.activations, "--activations", a.out, "--out");
  return a.out;
}

}  // namespace hils::cli::studies
