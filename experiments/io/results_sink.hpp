// The results writer (io::ResultsWriter) seen as an analysis::ResultSink, so that the unit
// runners (analysis/units.hpp: one process or MPI ranks) write `hils run` and the studies alike.
// Marking a unit complete checkpoints the file: every finished unit survives an interruption.
#pragma once

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
  explicit ResultsWriterSink(ResultsWriter& writer, ReadBack read_back = ReadBack::nothing,
                             const ResultsReader* previous = nullptr)
      : writer_(writer), read_back_(read_back), previous_(previous) {}

  bool is_complete(const std::string& unit) const override { return writer_.is_complete(unit); }
  void mark_complete(const std::string& unit) override;
  void mark_complete_all(const std::vector<std::string>& units) override;  // one checkpoint
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
};

}  // namespace hils::io
