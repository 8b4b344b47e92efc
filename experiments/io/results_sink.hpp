// The results writer (io::ResultsWriter) seen as an analysis::ResultSink, so that the unit
// runners (analysis/units.hpp: one process or MPI ranks) write `hils run` and the studies alike.
// Marking a unit complete checkpoints the file (a copy of the whole temporary file, whose cost
// grows with it) unless the last checkpoint was so recent that checkpoints would take more than
// 1/kCheckpointSpacing of the run; the units it skips are published by the next checkpoint, by
// publish_completed() when a run ends early, or by the commit.
#pragma once

#include <chrono>
#include <map>

#include "hils/analysis/sink.hpp"
#include "io/results_file.hpp"

namespace hils::io {

class ResultsWriterSink : public analysis::ResultSink {
 public:
  // What read() can give back: nothing (`hils run` reads nothing back, and its outputs are too
  // large to keep), or the doubles this run wrote (kept in memory) and, from `previous`, the
  // file an earlier, interrupted run left (the studies' summaries read their units).
  enum class ReadBack { nothing, written_and_previous };
  // Checkpoints are spaced so that each is followed by at least kCheckpointSpacing times its
  // own duration of other work: at most ~5% of a run goes to them.
  static constexpr double kCheckpointSpacing = 20;
  // checkpoint_spacing: kCheckpointSpacing, or 0 to checkpoint at every completion.
  explicit ResultsWriterSink(ResultsWriter& writer, ReadBack read_back = ReadBack::nothing,
                             const ResultsReader* previous = nullptr,
                             double checkpoint_spacing = kCheckpointSpacing)
      : writer_(writer), read_back_(read_back), previous_(previous),
        checkpoint_spacing_(checkpoint_spacing) {}

  bool is_complete(const std::string& unit) const override { return writer_.is_complete(unit); }
  void mark_complete(const std::string& unit) override;
  void mark_complete_all(const std::vector<std::string>& units) override;  // one checkpoint
  void publish_completed() noexcept override;
  void write(const std::string& path, const Matrix<double>& data,
             const std::string& meaning) override;
  void write(const std::string& path, const std::vector<double>& data,
             const std::string& meaning) override;
  void write(const std::string& path, const std::vector<int64_t>& data,
             const std::string& meaning) override;
  void write(const std::string& path, const IndexMatrix& data,
             const std::string& meaning) override;
  void set_attribute(const std::string& object, const std::string& name,
                     const std::string& value) override;
  void set_attribute(const std::string& object, const std::string& name,
                     double value) override;
  // nullopt unless ReadBack::written_and_previous (see the constructor).
  std::optional<Matrix<double>> read(const std::string& path) const override;

 private:
  ResultsWriter& writer_;
  ReadBack read_back_;
  const ResultsReader* previous_;
  std::map<std::string, Matrix<double>> written_;
  double checkpoint_spacing_;
  // Units marked complete since the last checkpoint; whether anything was written after the
  // last of them (publishing now would also publish part of an unfinished unit).
  size_t unpublished_ = 0;
  bool written_since_mark_ = false;
  double last_checkpoint_seconds_ = 0;  // 0: none yet, the first completion publishes at once
  std::chrono::steady_clock::time_point last_checkpoint_end_{};

  void written() { written_since_mark_ = true; }
  void marked(size_t units);
  void checkpoint();
};

}  // namespace hils::io
