// Results files (HDF5, format documented in data/results_format.md).
//
// Every file carries, as root attributes: format, format_version, config (the full
// configuration as a JSON string), hils_version, git_commit, seed, created (UTC ISO-8601) and
// command. Every dataset carries a `meaning` attribute. Groups hold units of work (e.g.
// /layer0/head3 or /hils/layer2); a unit marked complete is skipped by a resumed run.
//
// Atomicity: the writer works on a temporary copy in the target folder and commit() renames it
// over the final name; checkpoint() does the same mid-run and keeps writing. Destroying a writer
// that was not committed removes the temporary file and leaves any earlier file untouched.
//
//   io::Provenance prov{config_json, seed, "hils run ..."};
//   auto w = io::ResultsWriter::create("out.h5", prov);      // or ResultsWriter::resume(...)
//   if (!w.is_complete("layer0")) {
//     w.write_matrix("layer0/head0/o", o, "attention output, [Tq x dv]");
//     w.mark_complete("layer0");
//   }
//   w.commit();
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "hils/types.hpp"

namespace hils::io {

inline constexpr const char* kResultsFormat = "hils-results";
inline constexpr int64_t kResultsFormatVersion = 1;

// What produced a results file; version, git commit and time are filled in by the writer.
struct Provenance {
  nlohmann::json config = nlohmann::json::object();
  uint64_t seed = 0;
  std::string command;  // the command line, for humans
};

// The project version and the git commit the binary was configured at.
std::string project_version();
std::string git_commit();
// Now, as UTC ISO-8601 ("2026-11-21T20:43:00Z").
std::string utc_now();
// A stored configuration (`was`) against this run's (`now`), as an error shows it: the first
// three values that differ, "geometry.K (32 in the file, 4 in this run), ...", objects compared
// key by key and anything else whole (a key on one side only is "absent" on the other).
std::string config_differences(const nlohmann::json& was, const nlohmann::json& now);

class ResultsWriter {
 public:
  // A new file at `path` (replacing an existing one at commit). Throws FileError when the
  // folder does not exist or is not writable.
  static ResultsWriter create(const std::filesystem::path& path, const Provenance& provenance);
  // Continue an existing results file: its units stay, new ones are added. Throws FileError if
  // the file is not a results file, or if its config differs from provenance.config in any key
  // other than those listed in `ignore_keys` (so a resumed run cannot mix two experiments).
  static ResultsWriter resume(const std::filesystem::path& path, const Provenance& provenance,
                              const std::vector<std::string>& ignore_keys = {});
  // Resume if the file exists, else create.
  static ResultsWriter open(const std::filesystem::path& path, const Provenance& provenance,
                            const std::vector<std::string>& ignore_keys = {});

  ResultsWriter(ResultsWriter&&) noexcept;
  ResultsWriter& operator=(ResultsWriter&&) noexcept;
  ~ResultsWriter();

  // Datasets at a '/'-separated path (parent groups are created); each with its meaning.
  // Replacing an existing dataset is an error (units are written once).
  void write_matrix(const std::string& path, const Matrix<double>& data,
                    const std::string& meaning);
  void write_vector(const std::string& path, const Vector<double>& data,
                    const std::string& meaning);
  void write_vector(const std::string& path, const std::vector<double>& data,
                    const std::string& meaning);
  void write_indices(const std::string& path, const IndexMatrix& data,
                     const std::string& meaning);  // int32 [rows x cols]
  void write_indices(const std::string& path, const std::vector<int64_t>& data,
                     const std::string& meaning);  // int64 [n]
  void write_text(const std::string& path, const std::string& text, const std::string& meaning);

  // Attributes on a group or dataset ("" or "/" is the root); the object must exist (groups
  // are created on demand).
  void set_attribute(const std::string& object, const std::string& name, const std::string& v);
  void set_attribute(const std::string& object, const std::string& name, double v);
  void set_attribute(const std::string& object, const std::string& name, int64_t v);

  bool exists(const std::string& path) const;
  // Units (group paths) marked complete, in the order they were marked.
  std::vector<std::string> complete_units() const;
  bool is_complete(const std::string& unit) const;
  // The complete units the file under the final name holds for this writer: a resumed file's,
  // then those of its last checkpoint or commit. 0 until a created file is first published
  // (a file of that name until then is another run's, untouched).
  size_t units_published() const;
  void mark_complete(const std::string& unit);

  // Publish what is written so far under the final name and keep writing.
  void checkpoint();
  // Publish and close; the writer is unusable afterwards.
  void commit();

  const std::filesystem::path& path() const;

 private:
  struct State;
  explicit ResultsWriter(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

// Read access for tests, resumed runs and tools (plots read the files from Python).
class ResultsReader {
 public:
  // Throws FileError for a missing file, a non-HDF5 or truncated file, or a file whose
  // `format` attribute is not hils-results.
  explicit ResultsReader(const std::filesystem::path& path);
  ~ResultsReader();
  ResultsReader(ResultsReader&&) noexcept;

  bool exists(const std::string& path) const;
  Matrix<double> matrix(const std::string& path) const;  // rank 1 reads as [n x 1]
  IndexMatrix index_matrix(const std::string& path) const;
  std::string text(const std::string& path) const;
  bool has_attribute(const std::string& object, const std::string& name) const;
  std::string string_attribute(const std::string& object, const std::string& name) const;
  double double_attribute(const std::string& object, const std::string& name) const;
  int64_t int_attribute(const std::string& object, const std::string& name) const;
  nlohmann::json config() const;
  // Names of the members of a group, sorted.
  std::vector<std::string> members(const std::string& group) const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace hils::io
