// HDF5 helpers shared by the activation and results files: opening with clear errors, checked
// reads of datasets and attributes, typed writes, and the temporary-name-then-rename dance.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <H5Cpp.h>

namespace hils::io {

// Opens an existing HDF5 file; FileError for a missing path, a folder, a non-HDF5 file, or one
// the library cannot open (truncated, corrupt). Silences HDF5's own error printing.
H5::H5File open_hdf5(const std::filesystem::path& path, bool writable = false);

// Whether a '/'-separated path exists below `location` (every component checked in turn).
bool has_object(const H5::Group& location, const std::string& path);
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
// FileError unless the dataset holds IEEE floats (float32 or float64) / integers.
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

}  // namespace hils::io
