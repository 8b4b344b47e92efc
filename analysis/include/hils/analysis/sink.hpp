// Where a study writes its results: an interface so that the study drivers in this library need
// no file format. The `hils` tool adapts the HDF5 results writer to it; tests use MemorySink.
//
// A unit of work (e.g. "T4096/layer2/group1") is written once and then marked complete; a
// resumed run asks is_complete() and reads the finished units' numbers back with read().
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "hils/types.hpp"

namespace hils::analysis {

class ResultSink {
 public:
  virtual ~ResultSink() = default;
  virtual bool is_complete(const std::string& unit) const = 0;
  // Marks a unit complete. A file publishes it (atomically) now, or with the next units when
  // publishing has become costly (io::ResultsWriterSink: publishing copies the whole file).
  virtual void mark_complete(const std::string& unit) = 0;
  // Marks several units complete, in order, and publishes once: the MPI coordinator writes
  // the units that arrived while it was busy with one checkpoint, whose cost (a copy of the
  // whole file, experiments/io/results_file.hpp) grows with the file.
  virtual void mark_complete_all(const std::vector<std::string>& units) {
    for (const auto& unit : units) mark_complete(unit);
  }
  // Publishes the units marked complete and not yet published, provided nothing was written
  // after the last of them (no part of an unfinished unit goes with them). The unit runners
  // call it when a run ends early (a stop, a failing unit), so that every finished unit is
  // kept. Never throws (a failure leaves the last publication as it is).
  virtual void publish_completed() noexcept {}
  virtual void write(const std::string& path, const Matrix<double>& data,
                     const std::string& meaning) = 0;
  virtual void write(const std::string& path, const std::vector<double>& data,
                     const std::string& meaning) = 0;
  virtual void write(const std::string& path, const std::vector<int64_t>& data,
                     const std::string& meaning) = 0;
  virtual void write(const std::string& path, const IndexMatrix& data,
                     const std::string& meaning) = 0;
  virtual void set_attribute(const std::string& object, const std::string& name,
                             const std::string& value) = 0;
  virtual void set_attribute(const std::string& object, const std::string& name,
                             double value) = 0;
  // A dataset written by this or an earlier (resumed) run, as [rows x cols] (vectors as
  // [n x 1]); nullopt when absent.
  virtual std::optional<Matrix<double>> read(const std::string& path) const = 0;
};

// Everything in memory, for tests and for callers that want the numbers without a file.
class MemorySink : public ResultSink {
 public:
  bool is_complete(const std::string& unit) const override;
  void mark_complete(const std::string& unit) override;
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
  std::optional<Matrix<double>> read(const std::string& path) const override;

  std::map<std::string, Matrix<double>> data;      // every dataset, as doubles
  std::map<std::string, std::string> meanings;
  std::map<std::string, std::string> attributes;   // "object@name" -> value as text
  std::vector<std::string> completed;              // units in the order marked
  int64_t writes = 0;                              // datasets written (resume tests count)
};

}  // namespace hils::analysis
