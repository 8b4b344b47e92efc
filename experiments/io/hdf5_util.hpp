// HDF5 helpers shared by the activation and results files: opening with clear errors, checked
// reads of datasets and attributes, typed writes, and the temporary-name-then-rename dance.
#pragma once

#include <cerrno>
#include <csignal>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <memory>
#include <string>
#include <vector>

#include <H5Cpp.h>
#include <nlohmann/json.hpp>

namespace hils::io {

// Opens an existing HDF5 file; FileError for a missing path, a folder, a non-HDF5 file, or one
// the library cannot open (truncated, corrupt). Silences HDF5's own error printing.
H5::H5File open_hdf5(const std::filesystem::path& path, bool writable = false);

// Whether a '/'-separated path exists below `location` (every component checked in turn).
bool has_object(const H5::Group& location, const std::string& path);
// The type of the object that the link `name` below `location` leads to; nullopt for a link
// that cannot be followed (a dangling soft or external link, a soft-link loop), where
// Group::childObjType throws as if the file were corrupt.
std::optional<H5O_type_t> linked_object_type(const H5::Group& location, const std::string& name);
// Creates missing groups along a '/'-separated path and returns the last one.
H5::Group ensure_group(H5::Group location, const std::string& path);

// Dataset `name` below `location`; FileError naming it when missing or not a dataset.
H5::DataSet open_dataset(const std::filesystem::path& file, const H5::Group& location,
                         const std::string& name);
std::vector<hsize_t> dataset_dims(const H5::DataSet& dataset);
// FileError unless the dataset's rank and extents match; -1 in `expected` accepts any extent.
void require_dims(const std::filesystem::path& file, const std::string& name,
                  const H5::DataSet& dataset, const std::vector<int64_t>& expected,
                  const std::string& what);
// FileError unless the dataset holds IEEE floats (float16, float32 or float64) / integers.
void require_float(const std::filesystem::path& file, const std::string& name,
                   const H5::DataSet& dataset);
void require_integer(const std::filesystem::path& file, const std::string& name,
                     const H5::DataSet& dataset);
// Whole dataset converted to double / int64 (row-major); floats are checked for NaN and Inf
// unless `finite_only` is false (results may hold -inf for "not a candidate").
std::vector<double> read_doubles(const std::filesystem::path& file, const std::string& name,
                                 const H5::DataSet& dataset, bool finite_only = true);
std::vector<int64_t> read_int64s(const H5::DataSet& dataset);
std::string read_text(const std::filesystem::path& file, const std::string& name,
                      const H5::DataSet& dataset);

// Attributes with existence and type checks (FileError names object and attribute).
bool has_attribute(const H5::H5Object& object, const std::string& name);
std::string read_string_attribute(const std::filesystem::path& file, const H5::H5Object& object,
                                  const std::string& object_name, const std::string& name);
int64_t read_int_attribute(const std::filesystem::path& file, const H5::H5Object& object,
                           const std::string& object_name, const std::string& name);
double read_double_attribute(const std::filesystem::path& file, const H5::H5Object& object,
                             const std::string& object_name, const std::string& name);
// A JSON document as the text of an attribute: bytes that are not UTF-8 (a path or a name
// from a non-UTF-8 file system) become U+FFFD instead of nlohmann's exception.
std::string json_text(const nlohmann::json& document);
// `text` with every byte sequence that is not UTF-8 replaced by U+FFFD: a string read from a
// file (a damaged or Latin-1 attribute) or quoted by a parser, before it goes into a report that
// callers read as UTF-8 text (Python's subprocess text=True fails on the raw bytes).
std::string utf8_text(const std::string& text);
// Writes (replacing an attribute of the same name).
void write_attribute(H5::H5Object& object, const std::string& name, const std::string& value);
void write_attribute(H5::H5Object& object, const std::string& name, int64_t value);
void write_attribute(H5::H5Object& object, const std::string& name, double value);

// Typed dataset writes; dims multiply to data size (row-major).
H5::DataSet write_doubles(H5::Group& location, const std::string& name, const double* data,
                          const std::vector<hsize_t>& dims, bool as_float32);
H5::DataSet write_int32s(H5::Group& location, const std::string& name, const int32_t* data,
                         const std::vector<hsize_t>& dims);
H5::DataSet write_int64s(H5::Group& location, const std::string& name, const int64_t* data,
                         const std::vector<hsize_t>& dims);
H5::DataSet write_uint8s(H5::Group& location, const std::string& name, const uint8_t* data,
                         const std::vector<hsize_t>& dims);
H5::DataSet write_text(H5::Group& location, const std::string& name, const std::string& text);

// FileError unless `final_path` names a file (not empty, not a folder) in an existing, writable
// folder: what every output needs, checked before any work is done.
void require_writable_folder(const std::filesystem::path& final_path);

// An HDF5 failure while writing `output` (a full disk, a file-size limit, an I/O error) as
// FileError naming the file and the system's reason; `saved_errno` is errno at the failure.
[[noreturn]] void fail_write(const std::filesystem::path& output, const H5::Exception& error,
                             int saved_errno);
// Runs `write()`, turning an HDF5 failure into fail_write's FileError.
template <class Write>
decltype(auto) guard_write(const std::filesystem::path& output, Write&& write) {
  try {
    return write();
  } catch (const H5::Exception& error) {
    const int saved_errno = errno;
    fail_write(output, error, saved_errno);
  }
}
// Closes `file` (flushing it) and resets the pointer. When HDF5 cannot close it (a full disk),
// the half-closed file object is leaked on purpose, as any later H5Fclose of it (H5File's
// destructor) crashes HDF5 1.10, and FileError follows.
void close_file(const std::filesystem::path& output, std::unique_ptr<H5::H5File>& file);
// Whether close_file had to leak a file: then HDF5's own shutdown at exit would crash on it,
// so a program should end with std::_Exit after flushing its streams (hils's main does).
bool hdf5_file_abandoned();

// The file an output path names -> `path`, or where the symlink(s) at its last component lead:
// an output is written through a symlink (to the file it points to, temporary file beside that
// file) instead of replacing the link by a regular file and leaving the target stale.
std::filesystem::path output_target(const std::filesystem::path& path);

// While one lives (around the unit loops of `hils run` and the studies, on every MPI rank), the
// first SIGINT or SIGTERM only asks the runners to stop at the next unit boundary
// (analysis::request_stop: the handler sets one atomic flag and returns, no I/O), so the command
// can end by saying what its results file keeps. A second one, or any outside a scope, ends
// the process at once: the temporary files are removed, the published file (the last
// checkpoint) is kept, and the process dies by the signal. A signal the caller ignores (nohup,
// a script's background job) stays ignored. Scopes do not nest.
class UnitStopScope {
 public:
  UnitStopScope();
  ~UnitStopScope();
  UnitStopScope(const UnitStopScope&) = delete;
  UnitStopScope& operator=(const UnitStopScope&) = delete;
};

// While one lives (around hils's wait for the plotting script), a signal that ends the process
// at once (as UnitStopScope says: the temporary files removed) first sends SIGINT to the child
// `pid`, which ends by it (removing a PNG it is writing) instead of drawing on, orphaned, after
// hils has ended (`kill <hils pid>`: the signal reaches hils alone). Not nested.
class ChildProcessScope {
 public:
  explicit ChildProcessScope(int pid);
  ~ChildProcessScope();
  ChildProcessScope(const ChildProcessScope&) = delete;
  ChildProcessScope& operator=(const ChildProcessScope&) = delete;
};

// While one lives (around the reading of an input file by `hils verify` and `hils info`), a
// crash of the HDF5 library on the file's metadata (SIGSEGV or SIGBUS: libhdf5 1.10 copies past
// its buffers on some corrupt files, e.g. a global heap object whose size is damaged) ends the
// process with exit status 2 and one line naming the file, not "Segmentation fault". Only
// around reads, where nothing is being written, so there is nothing to clean up. Not nested.
class CorruptInputGuard {
 public:
  explicit CorruptInputGuard(const std::filesystem::path& file);
  ~CorruptInputGuard();
  CorruptInputGuard(const CorruptInputGuard&) = delete;
  CorruptInputGuard& operator=(const CorruptInputGuard&) = delete;

 private:
  struct sigaction outer_segv_ {}, outer_bus_ {};
};

// A temporary file beside `final_path` (".<name>.tmp-<pid>-<n>") that is removed on destruction
// unless published. Creating it checks that the folder exists and is writable (FileError).
class TempFile {
 public:
  explicit TempFile(const std::filesystem::path& final_path);
  ~TempFile();
  TempFile(TempFile&& other) noexcept;
  TempFile& operator=(TempFile&& other) noexcept;
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;

  const std::filesystem::path& path() const { return temp_; }
  const std::filesystem::path& final_path() const { return final_; }
  // Atomically renames the temporary file over the final name.
  void publish();
  // Copies the temporary file to a second temporary and renames that over the final name,
  // keeping the first for further writes.
  void publish_copy() const;

 private:
  std::filesystem::path final_, temp_;
  bool active_ = false;
};

// Excludes other writers of one output file, across processes: an flock on a lock file beside
// it (".<name>.lock", removed on release). A second writer gets FileError naming the holder
// (pid, host and command written into the lock file). Re-entrant within one process, so a
// command may hold the lock while it reads the old file and the writer it then opens takes it
// again. The lock file is re-checked after locking so that a holder removing it cannot let two
// writers in.
class OutputLock {
 public:
  OutputLock(const std::filesystem::path& final_path, const std::string& holder);
  ~OutputLock();
  OutputLock(OutputLock&& other) noexcept;
  OutputLock& operator=(OutputLock&&) = delete;
  OutputLock(const OutputLock&) = delete;
  OutputLock& operator=(const OutputLock&) = delete;

 private:
  std::string key_;  // absolute lock path; empty once moved from
};

}  // namespace hils::io
