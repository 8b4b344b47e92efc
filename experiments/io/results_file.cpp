#include "io/results_file.hpp"

#include <algorithm>
#include <chrono>
#include <ctime>
#include <optional>

#include <fmt/format.h>

#include "io/file_error.hpp"
#include "io/hdf5_util.hpp"

namespace hils::io {

std::string utc_now() {
  std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm parts{};
  gmtime_r(&now, &parts);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &parts);
  return text;
}

struct ResultsWriter::State {
  OutputLock lock;  // declared first: released after the temporary file is gone
  TempFile temp;
  std::unique_ptr<H5::H5File> file;
  std::vector<std::string> complete;
  // Units in the file under the final name that this writer stands for: a resumed file's, then
  // those of its last publish (0 while a created file is unpublished: a file already there is
  // another run's).
  size_t published = 0;
};

namespace {

constexpr const char* kCompleteUnits = "complete_units";

void write_provenance(H5::H5File& file, const Provenance& provenance) {
  write_attribute(file, "format", std::string(kResultsFormat));
  write_attribute(file, "format_version", kResultsFormatVersion);
  write_attribute(file, "config", json_text(provenance.config));
  write_attribute(file, "hils_version", project_version());
  write_attribute(file, "git_commit", git_commit());
  // Seeds are 64-bit unsigned; HDF5 readers see the same bits as a signed int64, so the decimal
  // text travels alongside.
  write_attribute(file, "seed", static_cast<int64_t>(provenance.seed));
  write_attribute(file, "seed_text", std::to_string(provenance.seed));
  write_attribute(file, "created", utc_now());
  write_attribute(file, "command", provenance.command);
  write_attribute(file, kCompleteUnits, std::string("[]"));
}

nlohmann::json without_keys(nlohmann::json config, const std::vector<std::string>& keys) {
  if (config.is_object())
    for (const auto& key : keys) config.erase(key);
  return config;
}

// `was` (the stored configuration) against `now` (this run's) under the key `name` -> one
// "name (X in the file, Y in this run)" per value that differs, objects compared key by key,
// anything else (a list, a number) as a whole; a key on one side only shows as absent.
void collect_differences(const nlohmann::json& was, const nlohmann::json& now,
                         const std::string& name, std::vector<std::string>& out) {
  const auto shown = [](const nlohmann::json* x) { return x ? x->dump() : "absent"; };
  const auto line = [&](const std::string& key, const nlohmann::json* a, const nlohmann::json* b) {
    out.push_back(fmt::format("{} ({} in the file, {} in this run)", key, shown(a), shown(b)));
  };
  if (!was.is_object() || !now.is_object()) {
    if (was != now) line(name, &was, &now);
    return;
  }
  const auto key_of = [&](const std::string& key) { return name.empty() ? key : name + "." + key; };
  for (const auto& [key, value] : was.items())
    if (now.contains(key))
      collect_differences(value, now.at(key), key_of(key), out);
    else
      line(key_of(key), &value, nullptr);
  for (const auto& [key, value] : now.items())
    if (!was.contains(key)) line(key_of(key), nullptr, &value);
}

void require_results_format(const std::filesystem::path& path, const H5::H5File& file) {
  std::string format = read_string_attribute(path, file, "/", "format");
  if (format != kResultsFormat)
    fail(path, "/ attribute format", std::string("\"") + kResultsFormat + "\"",
         "\"" + format + "\"");
  int64_t version = read_int_attribute(path, file, "/", "format_version");
  if (version != kResultsFormatVersion)
    fail(path, "/ attribute format_version", std::to_string(kResultsFormatVersion),
         std::to_string(version));
}

// The `complete_units` attribute: a JSON array of unit names, or FileError naming it.
std::vector<std::string> read_complete_units(const std::filesystem::path& path,
                                             const H5::H5File& file) {
  const std::string text = read_string_attribute(path, file, "/", kCompleteUnits);
  std::vector<std::string> units;
  try {
    auto parsed = nlohmann::json::parse(text);
    if (!parsed.is_array()) throw std::invalid_argument("not an array");
    for (const auto& unit : parsed) units.push_back(unit.get<std::string>());
  } catch (const std::exception&) {
    fail(path, std::string("/ attribute ") + kCompleteUnits,
         "a JSON array of unit names (the file is damaged; write a new one)",
         "\"" + text.substr(0, 60) + "\"");
  }
  return units;
}

std::string strip_slashes(const std::string& path) {
  size_t begin = path.find_first_not_of('/');
  if (begin == std::string::npos) return "";
  size_t end = path.find_last_not_of('/');
  return path.substr(begin, end - begin + 1);
}

}  // namespace

std::string config_differences(const nlohmann::json& was, const nlohmann::json& now) {
  std::vector<std::string> lines;
  collect_differences(was, now, "", lines);
  std::string text;
  for (size_t i = 0; i < std::min<size_t>(lines.size(), 3); ++i)
    text += (i ? ", " : "") + lines[i];
  if (lines.size() > 3) text += fmt::format(" and {} more", lines.size() - 3);
  return text;
}

ResultsWriter::ResultsWriter(std::unique_ptr<State> state) : state_(std::move(state)) {}
ResultsWriter::ResultsWriter(ResultsWriter&&) noexcept = default;
ResultsWriter& ResultsWriter::operator=(ResultsWriter&&) noexcept = default;

ResultsWriter::~ResultsWriter() {
  if (state_ && state_->file) {
    try {
      close_file(state_->temp.path(), state_->file);
    } catch (...) {
      // The temporary file is removed by TempFile whatever state it is in.
    }
  }
}

ResultsWriter ResultsWriter::create(const std::filesystem::path& path,
                                    const Provenance& provenance) {
  H5::Exception::dontPrint();
  OutputLock lock(path, provenance.command);
  auto state =
      std::make_unique<State>(State{std::move(lock), TempFile(path), nullptr, {}, 0});
  guard_write(path, [&] {
    state->file = std::make_unique<H5::H5File>(state->temp.path().string(), H5F_ACC_TRUNC);
    write_provenance(*state->file, provenance);
  });
  return ResultsWriter(std::move(state));
}

ResultsWriter ResultsWriter::resume(const std::filesystem::path& path,
                                    const Provenance& provenance,
                                    const std::vector<std::string>& ignore_keys) {
  OutputLock lock(path, provenance.command);  // before reading: no writer may change it meanwhile
  std::vector<std::string> complete;
  {
    H5::H5File existing = open_hdf5(path);
    require_results_format(path, existing);
    std::string text = read_string_attribute(path, existing, "/", "config");
    nlohmann::json config;
    try {
      config = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception&) {
      fail(path, "/ attribute config", "a JSON document", "\"" + text.substr(0, 60) + "\"");
    }
    // This run's config as it would be stored (non-UTF-8 bytes of a path replaced alike).
    const nlohmann::json current = nlohmann::json::parse(json_text(provenance.config));
    if (without_keys(config, ignore_keys) != without_keys(current, ignore_keys))
      fail(path, "/ attribute config",
           "the configuration of this run (resuming must not mix experiments: write to another "
           "file, or remove this one to start over)",
           "one that differs in " + config_differences(without_keys(config, ignore_keys),
                                                       without_keys(current, ignore_keys)));
    complete = read_complete_units(path, existing);
  }
  auto state = std::make_unique<State>(
      State{std::move(lock), TempFile(path), nullptr, complete, complete.size()});
  std::error_code ec;
  std::filesystem::copy_file(path, state->temp.path(),
                             std::filesystem::copy_options::overwrite_existing, ec);
  if (ec)
    fail_writing(path, "", "room to copy the results file to resume it",
         ec.message() + " (is the disk full or a file-size limit reached? the file is untouched)");
  guard_write(path, [&] {
    state->file = std::make_unique<H5::H5File>(state->temp.path().string(), H5F_ACC_RDWR);
    std::string earlier = read_string_attribute(path, *state->file, "/", "git_commit");
    if (earlier != git_commit())
      write_attribute(*state->file, "git_commit", earlier + " then " + git_commit());
    write_attribute(*state->file, "resumed", utc_now());
  });
  return ResultsWriter(std::move(state));
}

ResultsWriter ResultsWriter::open(const std::filesystem::path& path,
                                  const Provenance& provenance,
                                  const std::vector<std::string>& ignore_keys) {
  std::error_code ec;
  if (std::filesystem::exists(path, ec)) return resume(path, provenance, ignore_keys);
  return create(path, provenance);
}

namespace {

H5::Group root_of(H5::H5File& file) { return file.openGroup("/"); }

void require_new(const H5::H5File& file, const std::filesystem::path& final_path,
                 const std::string& path) {
  if (has_object(file, path))
    fail(final_path, path, "a dataset written once", "an existing dataset of that name");
}

}  // namespace

void ResultsWriter::write_matrix(const std::string& path, const Matrix<double>& data,
                          const std::string& meaning) {
  guard_write(this->path(), [&] {
    require_new(*state_->file, this->path(), path);
    H5::Group root = root_of(*state_->file);
    auto dataset = write_doubles(
        root, path, data.data(),
        {static_cast<hsize_t>(data.rows()), static_cast<hsize_t>(data.cols())}, false);
    write_attribute(dataset, "meaning", meaning);
    // Closed inside the guard: a failed close (full disk) becomes FileError here rather than
    // a "DataSet::~DataSet - H5Dclose failed" line printed by the destructor.
    dataset.close();
  });
}

void ResultsWriter::write_vector(const std::string& path, const Vector<double>& data,
                          const std::string& meaning) {
  guard_write(this->path(), [&] {
    require_new(*state_->file, this->path(), path);
    H5::Group root = root_of(*state_->file);
    auto dataset =
        write_doubles(root, path, data.data(), {static_cast<hsize_t>(data.size())}, false);
    write_attribute(dataset, "meaning", meaning);
    dataset.close();  // see write_matrix
  });
}

void ResultsWriter::write_vector(const std::string& path, const std::vector<double>& data,
                          const std::string& meaning) {
  guard_write(this->path(), [&] {
    require_new(*state_->file, this->path(), path);
    H5::Group root = root_of(*state_->file);
    auto dataset = write_doubles(root, path, data.data(), {data.size()}, false);
    write_attribute(dataset, "meaning", meaning);
    dataset.close();  // see write_matrix
  });
}

void ResultsWriter::write_indices(const std::string& path, const IndexMatrix& data,
                          const std::string& meaning) {
  guard_write(this->path(), [&] {
    require_new(*state_->file, this->path(), path);
    H5::Group root = root_of(*state_->file);
    auto dataset = write_int32s(
        root, path, data.data(),
        {static_cast<hsize_t>(data.rows()), static_cast<hsize_t>(data.cols())});
    write_attribute(dataset, "meaning", meaning);
    dataset.close();  // see write_matrix
  });
}

void ResultsWriter::write_indices(const std::string& path, const std::vector<int64_t>& data,
                          const std::string& meaning) {
  guard_write(this->path(), [&] {
    require_new(*state_->file, this->path(), path);
    H5::Group root = root_of(*state_->file);
    auto dataset = write_int64s(root, path, data.data(), {data.size()});
    write_attribute(dataset, "meaning", meaning);
    dataset.close();  // see write_matrix
  });
}

void ResultsWriter::write_text(const std::string& path, const std::string& text,
                          const std::string& meaning) {
  guard_write(this->path(), [&] {
    require_new(*state_->file, this->path(), path);
    H5::Group root = root_of(*state_->file);
    auto dataset = io::write_text(root, path, text);
    write_attribute(dataset, "meaning", meaning);
    dataset.close();  // see write_matrix
  });
}

namespace {

// The group or dataset at `object` ("" is the root); groups are created on demand.
template <class Value>
void set_attribute_on(H5::H5File& file, const std::string& object, const std::string& name,
                      const Value& value) {
  std::string path = strip_slashes(object);
  H5::Group root = file.openGroup("/");
  if (path.empty()) {
    write_attribute(root, name, value);
    return;
  }
  H5O_info_t info;
  if (has_object(root, path) &&
      H5Oget_info_by_name(root.getId(), path.c_str(), &info, H5P_DEFAULT) >= 0 &&
      info.type == H5O_TYPE_DATASET) {
    H5::DataSet dataset = root.openDataSet(path);
    write_attribute(dataset, name, value);
    dataset.close();  // see write_matrix
    return;
  }
  H5::Group group = ensure_group(root, path);
  write_attribute(group, name, value);
}

}  // namespace

void ResultsWriter::set_attribute(const std::string& object, const std::string& name,
                                  const std::string& v) {
  guard_write(this->path(), [&] {
    set_attribute_on(*state_->file, object, name, v);
  });
}
void ResultsWriter::set_attribute(const std::string& object, const std::string& name,
                                  double v) {
  guard_write(this->path(), [&] {
    set_attribute_on(*state_->file, object, name, v);
  });
}
void ResultsWriter::set_attribute(const std::string& object, const std::string& name,
                                  int64_t v) {
  guard_write(this->path(), [&] {
    set_attribute_on(*state_->file, object, name, v);
  });
}

bool ResultsWriter::exists(const std::string& path) const {
  return has_object(*state_->file, strip_slashes(path));
}

std::vector<std::string> ResultsWriter::complete_units() const { return state_->complete; }

size_t ResultsWriter::units_published() const { return state_->published; }

bool ResultsWriter::is_complete(const std::string& unit) const {
  std::string key = strip_slashes(unit);
  for (const auto& done : state_->complete)
    if (done == key) return true;
  return false;
}

void ResultsWriter::mark_complete(const std::string& unit) {
  guard_write(this->path(), [&] {
    std::string key = strip_slashes(unit);
    if (is_complete(key)) return;
    state_->complete.push_back(key);
    if (!key.empty()) set_attribute(key, "complete", static_cast<int64_t>(1));
    H5::Group root = state_->file->openGroup("/");
    write_attribute(root, kCompleteUnits, json_text(nlohmann::json(state_->complete)));
  });
}

void ResultsWriter::checkpoint() {
  // Closing makes the temporary file self-consistent before it is copied.
  close_file(path(), state_->file);
  state_->temp.publish_copy();
  state_->published = state_->complete.size();
  guard_write(path(), [&] { state_->file = std::make_unique<H5::H5File>(state_->temp.path().string(), H5F_ACC_RDWR); });
}

void ResultsWriter::commit() {
  require(state_ && state_->file != nullptr, "ResultsWriter", "an open writer",
          "one already committed");
  close_file(path(), state_->file);
  state_->temp.publish();
  state_->published = state_->complete.size();
}

const std::filesystem::path& ResultsWriter::path() const { return state_->temp.final_path(); }

// ---- reader -----------------------------------------------------------------------------------

struct ResultsReader::State {
  std::filesystem::path path;
  H5::H5File file;
};

ResultsReader::ResultsReader(const std::filesystem::path& path) {
  H5::H5File file = open_hdf5(path);
  require_results_format(path, file);
  state_ = std::make_unique<State>(State{path, file});
}
ResultsReader::~ResultsReader() = default;
ResultsReader::ResultsReader(ResultsReader&&) noexcept = default;

bool ResultsReader::exists(const std::string& path) const {
  return has_object(state_->file, strip_slashes(path));
}

Matrix<double> ResultsReader::matrix(const std::string& path) const {
  auto dataset = open_dataset(state_->path, state_->file, strip_slashes(path));
  auto dims = dataset_dims(dataset);
  if (dims.size() > 2) fail(state_->path, path, "rank 0, 1 or 2", std::to_string(dims.size()));
  auto flat = read_doubles(state_->path, path, dataset, false);
  int64_t rows = dims.empty() ? 1 : static_cast<int64_t>(dims[0]);
  int64_t cols = dims.size() == 2 ? static_cast<int64_t>(dims[1]) : 1;
  Matrix<double> m(rows, cols);
  std::copy(flat.begin(), flat.end(), m.data());
  return m;
}

IndexMatrix ResultsReader::index_matrix(const std::string& path) const {
  auto dataset = open_dataset(state_->path, state_->file, strip_slashes(path));
  require_integer(state_->path, path, dataset);
  auto dims = dataset_dims(dataset);
  if (dims.size() > 2) fail(state_->path, path, "rank 0, 1 or 2", std::to_string(dims.size()));
  auto flat = read_int64s(dataset);
  int64_t rows = dims.empty() ? 1 : static_cast<int64_t>(dims[0]);
  int64_t cols = dims.size() == 2 ? static_cast<int64_t>(dims[1]) : 1;
  IndexMatrix m(rows, cols);
  for (size_t i = 0; i < flat.size(); ++i) m.data()[i] = static_cast<int32_t>(flat[i]);
  return m;
}

std::string ResultsReader::text(const std::string& path) const {
  auto dataset = open_dataset(state_->path, state_->file, strip_slashes(path));
  return read_text(state_->path, path, dataset);
}

namespace {

// Attributes live on the root, a group or a dataset.
template <class Read>
auto read_attribute_at(const std::filesystem::path& file_path, const H5::H5File& file,
                       const std::string& object, Read read) {
  std::string path = strip_slashes(object);
  if (path.empty()) return read(file, "/");
  if (!has_object(file, path)) fail(file_path, path, "an object", "nothing at that path");
  H5O_info_t info;
  H5Oget_info_by_name(file.getId(), path.c_str(), &info, H5P_DEFAULT);
  if (info.type == H5O_TYPE_DATASET) return read(file.openDataSet(path), path);
  return read(file.openGroup(path), path);
}

}  // namespace

bool ResultsReader::has_attribute(const std::string& object, const std::string& name) const {
  std::string path = strip_slashes(object);
  if (path.empty()) return state_->file.attrExists(name);
  if (!has_object(state_->file, path)) return false;
  H5O_info_t info;
  H5Oget_info_by_name(state_->file.getId(), path.c_str(), &info, H5P_DEFAULT);
  if (info.type == H5O_TYPE_DATASET) return state_->file.openDataSet(path).attrExists(name);
  return state_->file.openGroup(path).attrExists(name);
}

std::string ResultsReader::string_attribute(const std::string& object,
                                            const std::string& name) const {
  return read_attribute_at(state_->path, state_->file, object,
                           [&](const H5::H5Object& o, const std::string& where) {
                             return read_string_attribute(state_->path, o, where, name);
                           });
}

double ResultsReader::double_attribute(const std::string& object,
                                       const std::string& name) const {
  return read_attribute_at(state_->path, state_->file, object,
                           [&](const H5::H5Object& o, const std::string& where) {
                             return read_double_attribute(state_->path, o, where, name);
                           });
}

int64_t ResultsReader::int_attribute(const std::string& object, const std::string& name) const {
  return read_attribute_at(state_->path, state_->file, object,
                           [&](const H5::H5Object& o, const std::string& where) {
                             return read_int_attribute(state_->path, o, where, name);
                           });
}

nlohmann::json ResultsReader::config() const {
  std::string text = string_attribute("", "config");
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception&) {
    fail(state_->path, "/ attribute config", "a JSON document", "\"" + text.substr(0, 60) + "\"");
  }
}

std::vector<std::string> ResultsReader::members(const std::string& group) const {
  std::string path = strip_slashes(group);
  H5::Group g = state_->file.openGroup(path.empty() ? "/" : path);
  std::vector<std::string> names;
  for (hsize_t i = 0; i < g.getNumObjs(); ++i) names.push_back(g.getObjnameByIdx(i));
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace hils::io
