#include "io/hdf5_util.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <sstream>

#include <fmt/format.h>

#include "io/file_error.hpp"
#include "hils/analysis/units.hpp"
#include "hils/memory.hpp"

namespace hils::io {

namespace {
std::string failure_text(const std::filesystem::path& file, const std::string& object,
                         const std::string& expected, const std::string& found) {
  std::string where = file.string();
  if (!object.empty()) where += ": " + object;
  return fmt::format("{}: expected {}, found {}", where, expected, found);
}
}  // namespace

void fail(const std::filesystem::path& file, const std::string& object,
          const std::string& expected, const std::string& found) {
  throw FileError(failure_text(file, object, expected, found));
}

void fail_writing(const std::filesystem::path& file, const std::string& object,
                  const std::string& expected, const std::string& found) {
  throw WriteError(failure_text(file, object, expected, found));
}

namespace {

// "a/b/c" -> {"a", "b", "c"}, ignoring empty components.
std::vector<std::string> split_path(const std::string& path) {
  std::vector<std::string> parts;
  std::stringstream stream(path);
  std::string part;
  while (std::getline(stream, part, '/'))
    if (!part.empty()) parts.push_back(part);
  return parts;
}

std::string dims_text(const std::vector<hsize_t>& dims) {
  std::string text = "[";
  for (size_t i = 0; i < dims.size(); ++i) text += (i ? ", " : "") + std::to_string(dims[i]);
  return text + "]";
}

std::string expected_dims_text(const std::vector<int64_t>& dims) {
  std::string text = "[";
  for (size_t i = 0; i < dims.size(); ++i)
    text += (i ? ", " : "") + (dims[i] < 0 ? std::string("*") : std::to_string(dims[i]));
  return text + "]";
}

std::string type_text(const H5::DataType& type) {
  switch (type.getClass()) {
    case H5T_INTEGER: return fmt::format("{}-bit integers", 8 * type.getSize());
    case H5T_FLOAT: return fmt::format("{}-bit floats", 8 * type.getSize());
    case H5T_STRING: return "strings";
    case H5T_COMPOUND: return "a compound type";
    // A mask written with h5py from a numpy bool array (landmarks, a query mask): "a non-numeric
    // type" did not say that bool was the trouble.
    case H5T_ENUM: return "an enum type (h5py stores numpy bool arrays as one)";
    default: return "a non-numeric type";
  }
}

H5::StrType utf8_string_type() {
  H5::StrType type(H5::PredType::C_S1, H5T_VARIABLE);
  type.setCset(H5T_CSET_UTF8);
  return type;
}

// The memory type to read a stored string type into: itself when fixed-length, else a
// variable-length string in its own character set (HDF5 converts none into another: an ASCII
// one, the C API's default and h5py's string_dtype("ascii"), read as UTF-8 fails).
H5::StrType memory_string_type(const H5::StrType& stored) {
  if (!stored.isVariableStr()) return stored;
  H5::StrType type(H5::PredType::C_S1, H5T_VARIABLE);
  type.setCset(stored.getCset());
  return type;
}

}  // namespace

namespace {

// Whether another process holds the flock that HDF5 (1.10+) takes on a file it opens: shared
// for readers, exclusive for a writer. H5Fopen then fails with a message about locking that
// would otherwise be reported as a corrupt file.
bool locked_by_another_writer(const std::filesystem::path& path, bool writable) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool locked = ::flock(fd, (writable ? LOCK_EX : LOCK_SH) | LOCK_NB) != 0 &&
                      errno == EWOULDBLOCK;
  ::close(fd);  // releases the probe's lock, if it got one
  return locked;
}

}  // namespace

H5::H5File open_hdf5(const std::filesystem::path& path, bool writable) {
  H5::Exception::dontPrint();
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) fail(path, "", "an existing file", "no such file");
  if (std::filesystem::is_directory(path, ec)) fail(path, "", "a file", "a folder");
  // A FIFO or device would block HDF5's signature read (a hang) or read garbage.
  if (!std::filesystem::is_regular_file(path, ec))
    fail(path, "", "a regular file", "a FIFO, socket or device");
  if (::access(path.c_str(), writable ? R_OK | W_OK : R_OK) != 0)
    fail(path, "", writable ? "a file this user can read and write" : "a file this user can read",
         std::strerror(errno));
  bool is_hdf5 = false;
  try {
    is_hdf5 = H5::H5File::isHdf5(path.string().c_str());
  } catch (const H5::Exception&) {
    is_hdf5 = false;
  }
  if (!is_hdf5) fail(path, "", "an HDF5 file", "a file without the HDF5 signature");
  try {
    return H5::H5File(path.string(), writable ? H5F_ACC_RDWR : H5F_ACC_RDONLY);
  } catch (const H5::Exception& e) {
    if (locked_by_another_writer(path, writable))
      fail(path, "", "a file no other program is writing",
           "it locked by another process that has it open for writing (HDF5's file lock); "
           "run again once that program has closed it");
    fail(path, "", "a complete HDF5 file",
         "one the HDF5 library cannot open (truncated or corrupt: " + e.getDetailMsg() + ")");
  }
}

bool has_object(const H5::Group& location, const std::string& path) {
  std::string prefix;
  for (const auto& part : split_path(path)) {
    prefix += (prefix.empty() ? "" : "/") + part;
    if (H5Lexists(location.getId(), prefix.c_str(), H5P_DEFAULT) <= 0) return false;
  }
  return true;
}

H5::Group ensure_group(H5::Group location, const std::string& path) {
  std::string prefix;
  for (const auto& part : split_path(path)) {
    prefix += (prefix.empty() ? "" : "/") + part;
    if (H5Lexists(location.getId(), prefix.c_str(), H5P_DEFAULT) <= 0)
      location.createGroup(prefix).close();
  }
  return prefix.empty() ? location : location.openGroup(prefix);
}

namespace {

// location, name -> "layer0/q": the object's path from the file's root, for messages.
std::string path_in(const H5::Group& location, const std::string& name) {
  char group[512] = "";
  if (H5Iget_name(location.getId(), group, sizeof group) <= 1) return name;  // the root
  return std::string(group + 1) + "/" + name;
}

}  // namespace

std::optional<H5O_type_t> linked_object_type(const H5::Group& location, const std::string& name) {
  H5O_info_t info;
  if (H5Oget_info_by_name(location.getId(), name.c_str(), &info, H5P_DEFAULT) < 0)
    return std::nullopt;
  return info.type;
}

H5::DataSet open_dataset(const std::filesystem::path& file, const H5::Group& location,
                         const std::string& name) {
  if (!has_object(location, name)) fail(file, name, "a dataset", "nothing at that path");
  const auto type = linked_object_type(location, name);
  if (!type)
    fail(file, path_in(location, name), "a dataset",
         "a link that cannot be followed (a dangling soft or external link)");
  if (*type != H5O_TYPE_DATASET)
    fail(file, path_in(location, name), "a dataset", "a group or other object");
  try {
    return location.openDataSet(name);
  } catch (const H5::Exception& e) {
    fail(file, name, "a readable dataset", "an unreadable one (" + e.getDetailMsg() + ")");
  }
}

std::vector<hsize_t> dataset_dims(const H5::DataSet& dataset) {
  H5::DataSpace space = dataset.getSpace();
  std::vector<hsize_t> dims(space.getSimpleExtentNdims());
  if (!dims.empty()) space.getSimpleExtentDims(dims.data());
  return dims;
}

void require_dims(const std::filesystem::path& file, const std::string& name,
                  const H5::DataSet& dataset, const std::vector<int64_t>& expected,
                  const std::string& what) {
  auto dims = dataset_dims(dataset);
  bool ok = dims.size() == expected.size();
  for (size_t i = 0; ok && i < dims.size(); ++i)
    ok = expected[i] < 0 || static_cast<int64_t>(dims[i]) == expected[i];
  if (!ok)
    fail(file, name,
         fmt::format("rank {} shape {} {}", expected.size(), expected_dims_text(expected), what),
         fmt::format("rank {} shape {}", dims.size(), dims_text(dims)));
}

namespace {

// An IEEE binary16 layout (numpy's and h5py's float16): sign bit 15, 5 exponent bits from bit 10
// with bias 15, 10 mantissa bits; HDF5 converts it to double exactly, subnormals and Inf/NaN
// included. Other 16-bit float layouts (bfloat16 has 8 exponent bits) are not it.
bool is_ieee_half(const H5::DataSet& dataset) {
  const H5::FloatType type = dataset.getFloatType();
  size_t sign = 0, exponent_pos = 0, exponent_size = 0, mantissa_pos = 0, mantissa_size = 0;
  type.getFields(sign, exponent_pos, exponent_size, mantissa_pos, mantissa_size);
  return type.getSize() == 2 && sign == 15 && exponent_pos == 10 && exponent_size == 5 &&
         mantissa_pos == 0 && mantissa_size == 10 && type.getEbias() == 15;
}

}  // namespace

void require_float(const std::filesystem::path& file, const std::string& name,
                   const H5::DataSet& dataset) {
  H5::DataType type = dataset.getDataType();
  const bool ok = type.getClass() == H5T_FLOAT &&
                  (type.getSize() == 4 || type.getSize() == 8 || is_ieee_half(dataset));
  if (!ok) fail(file, name, "float16, float32 or float64 data", type_text(type));
}

void require_integer(const std::filesystem::path& file, const std::string& name,
                     const H5::DataSet& dataset) {
  H5::DataType type = dataset.getDataType();
  if (type.getClass() != H5T_INTEGER) fail(file, name, "integer data", type_text(type));
}

namespace {

// A flat row-major index as the dataset's index: "[1, 5, 3] (flat index 2883)".
std::string index_text(const H5::DataSet& dataset, size_t flat) {
  const auto dims = dataset_dims(dataset);
  std::vector<hsize_t> index(dims.size());
  size_t rest = flat;
  for (size_t axis = dims.size(); axis-- > 0;) {
    index[axis] = rest % dims[axis];
    rest /= dims[axis];
  }
  return fmt::format("{} (flat index {})", dims_text(index), flat);
}

// The dataset's element count, or FileError when its values as 8-byte numbers, held twice (read
// whole, then copied into matrices), would not fit in 80% of the memory this process may use.
// A file can declare extents it does not store (unwritten HDF5 chunks take no room on disk):
// without this check such a file ends in an out-of-memory kill or bad_alloc, not a message.
size_t element_count(const std::filesystem::path& file, const std::string& name,
                     const H5::DataSet& dataset) {
  const auto dims = dataset_dims(dataset);
  double count = 1;  // in double: a product of extents can overflow 64 bits
  for (hsize_t extent : dims) count *= static_cast<double>(extent);
  const MemoryLimit memory = memory_limit();
  if (2 * 8 * count >= 0.8 * memory.bytes)
    fail(file, name, "a dataset whose values fit in 80% of " + memory.text,
         fmt::format("shape {}, about {} as doubles", dims_text(dims), bytes_text(2 * 8 * count)));
  return static_cast<size_t>(count);
}

}  // namespace

std::vector<double> read_doubles(const std::filesystem::path& file, const std::string& name,
                                 const H5::DataSet& dataset, bool finite_only) {
  require_float(file, name, dataset);
  std::vector<double> data(element_count(file, name, dataset));
  try {
    if (!data.empty()) dataset.read(data.data(), H5::PredType::NATIVE_DOUBLE);
  } catch (const H5::Exception& e) {
    fail(file, name, "readable data", "a read error (" + e.getDetailMsg() + ")");
  }
  for (size_t i = 0; finite_only && i < data.size(); ++i)
    if (!std::isfinite(data[i]))
      fail(file, name, "finite values", fmt::format("{} at {}", data[i], index_text(dataset, i)));
  return data;
}

std::vector<int64_t> read_int64s(const H5::DataSet& dataset) {
  const std::string file = dataset.getFileName(), name = dataset.getObjName();
  std::vector<int64_t> data(element_count(file, name, dataset));
  const H5::DataType type = dataset.getDataType();
  if (data.empty() || type.getClass() != H5T_INTEGER || type.getSize() != 8 ||
      dataset.getIntType().getSign() != H5T_SGN_NONE) {
    if (!data.empty()) dataset.read(data.data(), H5::PredType::NATIVE_INT64);
    return data;
  }
  // uint64: HDF5 clips a value above int64's range to its largest, so read them as stored and
  // name the one found (a -1 written as uint64 is 18446744073709551615, not 2^63 - 1).
  std::vector<uint64_t> stored(data.size());
  dataset.read(stored.data(), H5::PredType::NATIVE_UINT64);
  for (size_t i = 0; i < stored.size(); ++i) {
    if (stored[i] > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      fail(file, name, "integers within int64's range (-1 needs a signed type)",
           fmt::format("{} at {} in unsigned 64-bit integers", stored[i], index_text(dataset, i)));
    data[i] = static_cast<int64_t>(stored[i]);
  }
  return data;
}

std::string read_text(const std::filesystem::path& file, const std::string& name,
                      const H5::DataSet& dataset) {
  H5::DataType type = dataset.getDataType();
  if (type.getClass() != H5T_STRING) fail(file, name, "a string", type_text(type));
  std::string text;
  dataset.read(text, memory_string_type(dataset.getStrType()));
  return text;
}

bool has_attribute(const H5::H5Object& object, const std::string& name) {
  return object.attrExists(name);
}

namespace {

// FileError unless the attribute holds one value (an array of 2, say, or an empty one, named).
void require_one_value(const std::filesystem::path& file, const std::string& where,
                       const std::string& expected, const H5::Attribute& attribute) {
  const hssize_t n = attribute.getSpace().getSimpleExtentNpoints();
  if (n != 1)
    fail(file, where, expected,
         "an array of " + std::to_string(n) + " " + type_text(attribute.getDataType()));
}

H5::Attribute open_attribute(const std::filesystem::path& file, const H5::H5Object& object,
                             const std::string& object_name, const std::string& name) {
  std::string where = (object_name.empty() ? "/" : object_name) + " attribute " + name;
  if (!object.attrExists(name)) fail(file, where, "the attribute to exist", "no such attribute");
  return object.openAttribute(name);
}

}  // namespace

std::string read_string_attribute(const std::filesystem::path& file, const H5::H5Object& object,
                                  const std::string& object_name, const std::string& name) {
  H5::Attribute attribute = open_attribute(file, object, object_name, name);
  H5::DataType type = attribute.getDataType();
  if (type.getClass() != H5T_STRING)
    fail(file, object_name + " attribute " + name, "a string", type_text(type));
  if (const hssize_t n = attribute.getSpace().getSimpleExtentNpoints(); n != 1)
    fail(file, object_name + " attribute " + name, "one string",
         "an array of " + std::to_string(n) + " strings");
  std::string value;
  attribute.read(memory_string_type(attribute.getStrType()), value);
  // Fixed-length strings may carry trailing NULs.
  while (!value.empty() && value.back() == '\0') value.pop_back();
  return value;
}

int64_t read_int_attribute(const std::filesystem::path& file, const H5::H5Object& object,
                           const std::string& object_name, const std::string& name) {
  H5::Attribute attribute = open_attribute(file, object, object_name, name);
  H5::DataType type = attribute.getDataType();
  if (type.getClass() != H5T_INTEGER)
    fail(file, object_name + " attribute " + name, "one integer", type_text(type));
  require_one_value(file, object_name + " attribute " + name, "one integer", attribute);
  int64_t value = 0;
  attribute.read(H5::PredType::NATIVE_INT64, &value);
  return value;
}

double read_double_attribute(const std::filesystem::path& file, const H5::H5Object& object,
                             const std::string& object_name, const std::string& name) {
  H5::Attribute attribute = open_attribute(file, object, object_name, name);
  H5::DataType type = attribute.getDataType();
  if (type.getClass() != H5T_FLOAT && type.getClass() != H5T_INTEGER)
    fail(file, object_name + " attribute " + name, "one number", type_text(type));
  require_one_value(file, object_name + " attribute " + name, "one number", attribute);
  double value = 0;
  attribute.read(H5::PredType::NATIVE_DOUBLE, &value);
  if (!std::isfinite(value))
    fail(file, object_name + " attribute " + name, "a finite number", std::to_string(value));
  return value;
}

void write_attribute(H5::H5Object& object, const std::string& name, const std::string& value) {
  if (object.attrExists(name)) object.removeAttr(name);
  H5::StrType type = utf8_string_type();
  H5::Attribute attribute = object.createAttribute(name, type, H5::DataSpace(H5S_SCALAR));
  attribute.write(type, value);
}

void write_attribute(H5::H5Object& object, const std::string& name, int64_t value) {
  if (object.attrExists(name)) object.removeAttr(name);
  H5::Attribute attribute =
      object.createAttribute(name, H5::PredType::STD_I64LE, H5::DataSpace(H5S_SCALAR));
  attribute.write(H5::PredType::NATIVE_INT64, &value);
}

void write_attribute(H5::H5Object& object, const std::string& name, double value) {
  if (object.attrExists(name)) object.removeAttr(name);
  H5::Attribute attribute =
      object.createAttribute(name, H5::PredType::IEEE_F64LE, H5::DataSpace(H5S_SCALAR));
  attribute.write(H5::PredType::NATIVE_DOUBLE, &value);
}

namespace {

H5::DataSpace space_of(const std::vector<hsize_t>& dims) {
  if (dims.empty()) return H5::DataSpace(H5S_SCALAR);
  return H5::DataSpace(static_cast<int>(dims.size()), dims.data());
}

// Parent groups of a '/'-separated dataset path are created on demand.
std::pair<H5::Group, std::string> parent_and_leaf(H5::Group& location, const std::string& path) {
  auto parts = split_path(path);
  if (parts.empty()) throw FileError("dataset path must not be empty");
  std::string leaf = parts.back();
  parts.pop_back();
  std::string parent;
  for (const auto& part : parts) parent += part + "/";
  return {parent.empty() ? location : ensure_group(location, parent), leaf};
}

template <class T>
H5::DataSet write_typed(H5::Group& location, const std::string& name, const T* data,
                        const std::vector<hsize_t>& dims, const H5::DataType& file_type,
                        const H5::PredType& memory_type) {
  auto [parent, leaf] = parent_and_leaf(location, name);
  H5::DataSet dataset = parent.createDataSet(leaf, file_type, space_of(dims));
  size_t n = 1;
  for (auto extent : dims) n *= extent;
  if (n > 0) dataset.write(data, memory_type);
  return dataset;
}

}  // namespace

H5::DataSet write_doubles(H5::Group& location, const std::string& name, const double* data,
                          const std::vector<hsize_t>& dims, bool as_float32) {
  return write_typed(location, name, data, dims,
                     as_float32 ? H5::PredType::IEEE_F32LE : H5::PredType::IEEE_F64LE,
                     H5::PredType::NATIVE_DOUBLE);
}

H5::DataSet write_int32s(H5::Group& location, const std::string& name, const int32_t* data,
                         const std::vector<hsize_t>& dims) {
  return write_typed(location, name, data, dims, H5::PredType::STD_I32LE,
                     H5::PredType::NATIVE_INT32);
}

H5::DataSet write_int64s(H5::Group& location, const std::string& name, const int64_t* data,
                         const std::vector<hsize_t>& dims) {
  return write_typed(location, name, data, dims, H5::PredType::STD_I64LE,
                     H5::PredType::NATIVE_INT64);
}

H5::DataSet write_uint8s(H5::Group& location, const std::string& name, const uint8_t* data,
                         const std::vector<hsize_t>& dims) {
  return write_typed(location, name, data, dims, H5::PredType::STD_U8LE,
                     H5::PredType::NATIVE_UINT8);
}

H5::DataSet write_text(H5::Group& location, const std::string& name, const std::string& text) {
  auto [parent, leaf] = parent_and_leaf(location, name);
  H5::StrType type = utf8_string_type();
  H5::DataSet dataset = parent.createDataSet(leaf, type, H5::DataSpace(H5S_SCALAR));
  dataset.write(text, type);
  return dataset;
}

namespace {

// Temporary files alive right now, so that SIGINT/SIGTERM/SIGHUP/SIGQUIT can remove them before
// the process dies (destructors do not run on a signal). Fixed storage: the handler may only call
// async-signal-safe functions.
constexpr int kMaxLiveTemps = 32;
constexpr size_t kMaxPathBytes = 4096;
char g_live_temps[kMaxLiveTemps][kMaxPathBytes];
volatile std::sig_atomic_t g_live_used[kMaxLiveTemps];
// Set while a UnitStopScope lives: the first SIGINT/SIGTERM asks the unit runners to stop.
volatile std::sig_atomic_t g_stop_between_units = 0;
// Set while a ChildProcessScope lives: the child to end with this process.
volatile std::sig_atomic_t g_child_pid = 0;

void remove_live_temps_and_die(int signal_number) {
  if (g_child_pid > 0) ::kill(g_child_pid, SIGINT);
  for (int i = 0; i < kMaxLiveTemps; ++i)
    if (g_live_used[i]) ::unlink(g_live_temps[i]);
  std::signal(signal_number, SIG_DFL);
  std::raise(signal_number);
}

void on_signal(int signal_number) {
  const bool stoppable = signal_number == SIGINT || signal_number == SIGTERM;
  if (stoppable && g_stop_between_units && analysis::stop_requested() == 0) {
    analysis::request_stop(signal_number);  // an atomic store; the unit loops do the rest
    return;
  }
  remove_live_temps_and_die(signal_number);
}

void install_signal_cleanup() {
  static bool installed = false;
  if (installed) return;
  installed = true;
  for (int signal_number : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) {
    // A signal the caller ignores stays ignored: `nohup hils ...` must survive the hangup, and
    // a background job of a script ignores Ctrl-C.
    struct sigaction current {};
    if (::sigaction(signal_number, nullptr, &current) == 0 && current.sa_handler == SIG_IGN)
      continue;
    std::signal(signal_number, on_signal);
  }
}

void register_temp(const std::filesystem::path& path) {
  install_signal_cleanup();
  const std::string text = path.string();
  if (text.size() >= kMaxPathBytes) return;  // too long to track; still removed on exceptions
  for (int i = 0; i < kMaxLiveTemps; ++i) {
    if (g_live_used[i]) continue;
    std::memcpy(g_live_temps[i], text.c_str(), text.size() + 1);
    g_live_used[i] = 1;
    return;
  }
}

void unregister_temp(const std::filesystem::path& path) {
  const std::string text = path.string();
  for (int i = 0; i < kMaxLiveTemps; ++i)
    if (g_live_used[i] && text == g_live_temps[i]) g_live_used[i] = 0;
}

std::filesystem::path temp_name_for(const std::filesystem::path& final_path) {
  static std::atomic<int> counter{0};
  auto name = fmt::format(".{}.tmp-{}-{}", final_path.filename().string(), ::getpid(),
                          counter.fetch_add(1));
  return final_path.parent_path() / name;
}

}  // namespace

namespace {

// The line a CorruptInputGuard's handler writes (composed before the read: write(2) and _exit are
// all a handler may call).
char g_corrupt_line[kMaxPathBytes + 256];
size_t g_corrupt_length = 0;

void on_corrupt_input(int signal_number) {
  const char* name = signal_number == SIGBUS ? "SIGBUS)\n" : "SIGSEGV)\n";
  [[maybe_unused]] ssize_t a = ::write(STDERR_FILENO, g_corrupt_line, g_corrupt_length);
  [[maybe_unused]] ssize_t b = ::write(STDERR_FILENO, name, std::strlen(name));
  ::_exit(2);  // bad input
}

}  // namespace

CorruptInputGuard::CorruptInputGuard(const std::filesystem::path& file) {
  std::string text = file.string();
  if (text.size() >= kMaxPathBytes) text = text.substr(0, kMaxPathBytes - 4) + "...";
  const std::string line =
      "hils: bad input: " + text +
      ": expected a complete HDF5 file, found one the HDF5 library crashed on while reading it "
      "(corrupt metadata; `h5dump -H` may say where; signal ";
  std::memcpy(g_corrupt_line, line.data(), line.size());
  g_corrupt_length = line.size();
  struct sigaction action {};
  action.sa_handler = on_corrupt_input;
  sigemptyset(&action.sa_mask);
  ::sigaction(SIGSEGV, &action, &outer_segv_);
  ::sigaction(SIGBUS, &action, &outer_bus_);
}

CorruptInputGuard::~CorruptInputGuard() {
  ::sigaction(SIGSEGV, &outer_segv_, nullptr);
  ::sigaction(SIGBUS, &outer_bus_, nullptr);
}

UnitStopScope::UnitStopScope() {
  install_signal_cleanup();
  // Again, as another handler may have replaced ours since (a test framework's); a signal
  // ignored from the start stays ignored.
  for (int signal_number : {SIGINT, SIGTERM}) {
    struct sigaction current {};
    if (::sigaction(signal_number, nullptr, &current) == 0 && current.sa_handler != SIG_IGN)
      std::signal(signal_number, on_signal);
  }
  g_stop_between_units = 1;
}

UnitStopScope::~UnitStopScope() { g_stop_between_units = 0; }

ChildProcessScope::ChildProcessScope(int pid) {
  install_signal_cleanup();
  g_child_pid = pid;
}

ChildProcessScope::~ChildProcessScope() { g_child_pid = 0; }

std::string utf8_text(const std::string& text) {
  // nlohmann's dump replaces what is not UTF-8 (escaping the rest as JSON); parsing undoes that.
  return nlohmann::json::parse(json_text(nlohmann::json(text))).get<std::string>();
}

std::string json_text(const nlohmann::json& document) {
  return document.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

void require_writable_folder(const std::filesystem::path& final_path) {
  if (final_path.empty() || final_path.filename().empty() || final_path.filename() == "." ||
      final_path.filename() == "..")
    fail(final_path.empty() ? "(empty path)" : final_path, "", "a file name for the output",
         "'" + final_path.string() + "'");
  auto folder = final_path.parent_path();
  if (folder.empty()) folder = ".";
  std::error_code ec;
  if (!std::filesystem::is_directory(folder, ec))
    fail(final_path, "", "an output folder that exists",
         std::filesystem::exists(folder, ec) ? folder.string() + ", which is not a folder"
                                             : "no folder " + folder.string());
  if (::access(folder.c_str(), W_OK) != 0)
    fail(final_path, "", "a writable output folder", "folder " + folder.string() +
                                                         " is not writable");
  const auto status = std::filesystem::status(final_path, ec);
  if (std::filesystem::is_directory(status))
    fail(final_path, "", "a file name for the output", "an existing folder");
  // The output is written beside and renamed over its name: a device (/dev/null as root), FIFO
  // or socket there would be replaced by a regular file.
  if (std::filesystem::exists(status) && !std::filesystem::is_regular_file(status))
    fail(final_path, "", "a regular file or a new name for the output",
         "a device, FIFO or socket (hils writes a new file and renames it over the name)");
}


std::filesystem::path output_target(const std::filesystem::path& path) {
  std::filesystem::path target = path;
  std::error_code ec;
  for (int hop = 0; hop < 40 && std::filesystem::is_symlink(target, ec); ++hop) {
    const auto next = std::filesystem::read_symlink(target, ec);
    if (ec) break;
    target = next.is_absolute() ? next : target.parent_path() / next;
  }
  return target;
}

TempFile::TempFile(const std::filesystem::path& final_path)
    : final_(output_target(final_path)), temp_(temp_name_for(final_)) {
  require_writable_folder(final_);
  // Create it now so that permission problems surface before any work is done.
  register_temp(temp_);
  const int fd = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int error = errno;
    unregister_temp(temp_);
    if (error == ENAMETOOLONG)
      fail(final_, "", "a file name short enough for its temporary file's (NAME_MAX 255 with "
           "'.' and '.tmp-<pid>-<n>' added)", temp_.filename().string() + ": " +
           std::strerror(error));
    fail(final_, "", "a writable output folder",
         "cannot create " + temp_.string() + ": " + std::strerror(error));
  }
  ::close(fd);
  active_ = true;
}

TempFile::~TempFile() {
  if (active_) {
    std::error_code ec;
    std::filesystem::remove(temp_, ec);
    unregister_temp(temp_);
  }
}

TempFile::TempFile(TempFile&& other) noexcept
    : final_(std::move(other.final_)), temp_(std::move(other.temp_)), active_(other.active_) {
  other.active_ = false;
}

TempFile& TempFile::operator=(TempFile&& other) noexcept {
  if (this != &other) {
    if (active_) {
      std::error_code ec;
      std::filesystem::remove(temp_, ec);
      unregister_temp(temp_);
    }
    final_ = std::move(other.final_);
    temp_ = std::move(other.temp_);
    active_ = other.active_;
    other.active_ = false;
  }
  return *this;
}

void TempFile::publish() {
  std::error_code ec;
  std::filesystem::rename(temp_, final_, ec);
  if (ec) fail(final_, "", "a rename of the finished temporary file", ec.message());
  unregister_temp(temp_);
  active_ = false;
}

namespace {

std::filesystem::path folder_of(const std::filesystem::path& output) {
  return output.parent_path().empty() ? std::filesystem::path(".") : output.parent_path();
}

// Whether the device of `output`'s folder has no block left for this user.
bool full_device(const std::filesystem::path& output) {
  struct statvfs space {};
  return ::statvfs(folder_of(output).c_str(), &space) == 0 && space.f_bavail == 0;
}

std::string no_space(const std::filesystem::path& output) {
  return "no space left on the device of " + folder_of(output).string();
}

}  // namespace

void TempFile::publish_copy() const {
  auto second = temp_name_for(final_);
  register_temp(second);
  std::error_code ec;
  std::filesystem::copy_file(temp_, second, std::filesystem::copy_options::overwrite_existing,
                             ec);
  if (!ec) std::filesystem::rename(second, final_, ec);
  unregister_temp(second);
  if (ec) {
    // libstdc++ reports a short copy (a full disk) as EIO: say what the device says, while
    // the partial copy still fills it.
    const std::string reason = full_device(final_) ? no_space(final_) : ec.message();
    std::error_code ignored;
    std::filesystem::remove(second, ignored);
    fail_writing(final_, "", "room to publish a checkpoint copy of the results so far",
         reason + " (the last published checkpoint, if any, is untouched)");
  }
}

void fail_write(const std::filesystem::path& output, const H5::Exception& error,
                int saved_errno) {
  std::string reason;
  if (full_device(output))
    reason = no_space(output);
  else if (saved_errno == ENOSPC || saved_errno == EFBIG || saved_errno == EDQUOT ||
           saved_errno == EIO || saved_errno == EROFS)
    reason = std::strerror(saved_errno);
  else
    reason = "HDF5 could not write it (" + error.getFuncName() + ": " + error.getDetailMsg() +
             "; the disk may be full or a file-size limit reached)";
  std::error_code ec;
  const bool published = std::filesystem::exists(output, ec);
  // errno as found: a caller cleaning up after a failed write (activation_file.cpp closes the
  // file, which fails here too, then rethrows the first error) reads it again.
  errno = saved_errno;
  fail_writing(output, "", "room to write the output",
       reason + (published ? "; this write was not published (the file of that name, as last "
                             "published, is untouched)"
                           : "; nothing was published"));
}

namespace {
std::atomic<bool> g_file_abandoned{false};
}  // namespace

bool hdf5_file_abandoned() { return g_file_abandoned.load(); }

void close_file(const std::filesystem::path& output, std::unique_ptr<H5::H5File>& file) {
  if (!file) return;
  try {
    file->close();
    file.reset();
  } catch (const H5::Exception& error) {
    const int saved_errno = errno;
    (void)file.release();  // see the header: never closed twice
    g_file_abandoned = true;
    fail_write(output, error, saved_errno);
  }
}

// ---- OutputLock ------------------------------------------------------------------------------

namespace {

struct HeldLock {
  int fd = -1;
  int count = 0;
};
std::mutex g_locks_mutex;
std::map<std::string, HeldLock>& held_locks() {
  static std::map<std::string, HeldLock> locks;
  return locks;
}

std::filesystem::path lock_path_for(const std::filesystem::path& final_path) {
  auto folder = final_path.parent_path();
  std::error_code ec;
  auto absolute = std::filesystem::absolute(folder.empty() ? "." : folder, ec);
  return (ec ? folder : absolute) / ("." + final_path.filename().string() + ".lock");
}

std::string read_holder(int fd) {
  char text[512] = {};
  ssize_t n = ::pread(fd, text, sizeof text - 1, 0);
  std::string holder = n > 0 ? std::string(text, static_cast<size_t>(n)) : "";
  while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
  return holder.empty() ? "another process" : holder;
}

// Removes the temporary files ".<name>.tmp-<pid>-<n>" beside `final_path` of a writer whose
// lock we just took over: a lock file still present when we lock it names a holder that died
// without cleaning up (SIGKILL, a crash, a killed MPI rank 0), and that holder's temporary
// files (a copy of the results, possibly GBs) would otherwise stay forever. Only that pid's
// files: a temporary file of another pid may belong to a live writer (hils dump).
void remove_orphaned_temps(const std::filesystem::path& final_path,
                           const std::string& stale_holder) {
  long pid = 0;
  if (std::sscanf(stale_holder.c_str(), "pid %ld", &pid) != 1 || pid <= 0) return;
  const std::filesystem::path folder =
      final_path.parent_path().empty() ? std::filesystem::path(".") : final_path.parent_path();
  const std::string prefix = fmt::format(".{}.tmp-{}-", final_path.filename().string(), pid);
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(folder, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) == 0) std::filesystem::remove(entry.path(), ec);
  }
}

// Locks `lock` exclusively (without waiting) and returns its descriptor, or fails naming the
// holder. Retries when the file was removed or replaced between open and flock.
int acquire_lock_file(const std::filesystem::path& final_path, const std::filesystem::path& lock,
                      const std::string& holder) {
  for (int attempt = 0; attempt < 100; ++attempt) {
    int fd = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
      fail(final_path, "", "a lock file the output folder can hold",
           "cannot create " + lock.string() + ": " + std::strerror(errno));
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      std::string who = read_holder(fd);
      ::close(fd);
      fail(final_path, "", "no other writer of this file",
           "it is being written by " + who + " (lock " + lock.string() +
               "); wait for it to finish or write another file");
    }
    struct stat opened {}, named {};
    if (::fstat(fd, &opened) == 0 && ::stat(lock.c_str(), &named) == 0 &&
        opened.st_dev == named.st_dev && opened.st_ino == named.st_ino) {
      remove_orphaned_temps(final_path, read_holder(fd));
      std::string text = holder + "\n";
      if (::ftruncate(fd, 0) == 0) {
        ssize_t ignored = ::pwrite(fd, text.data(), text.size(), 0);
        (void)ignored;  // the holder's description is a courtesy; the lock is what excludes
      }
      return fd;
    }
    ::close(fd);  // the holder removed it after we opened it: lock the new one
  }
  fail(final_path, "", "a stable lock file", "it kept being replaced: " + lock.string());
}

}  // namespace

OutputLock::OutputLock(const std::filesystem::path& final_path, const std::string& holder)
    : key_(lock_path_for(output_target(final_path)).string()) {
  require_writable_folder(final_path);
  std::lock_guard<std::mutex> guard(g_locks_mutex);
  HeldLock& held = held_locks()[key_];
  if (held.count == 0) {
    try {
      held.fd = acquire_lock_file(final_path, key_,
                                  fmt::format("pid {} ({})", ::getpid(), holder));
    } catch (...) {
      held_locks().erase(key_);
      throw;
    }
    register_temp(key_);  // an interrupted run removes it too (the flock dies with the process)
  }
  ++held.count;
}

OutputLock::OutputLock(OutputLock&& other) noexcept : key_(std::move(other.key_)) {
  other.key_.clear();
}

OutputLock::~OutputLock() {
  if (key_.empty()) return;
  std::lock_guard<std::mutex> guard(g_locks_mutex);
  auto it = held_locks().find(key_);
  if (it == held_locks().end() || --it->second.count > 0) return;
  ::unlink(key_.c_str());  // while still locked, so no waiter holds a removed file unnoticed
  unregister_temp(key_);
  ::close(it->second.fd);
  held_locks().erase(it);
}

}  // namespace hils::io
