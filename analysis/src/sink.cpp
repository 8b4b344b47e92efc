#include "hils/analysis/sink.hpp"

#include <algorithm>
#include <sstream>

namespace hils::analysis {

namespace {

// Datasets are written once per unit, as in the HDF5 results writer.
void require_new(const MemorySink& sink, const std::string& path) {
  require(!sink.data.count(path), "dataset " + path, "written once", "a second write");
}

}  // namespace

bool MemorySink::is_complete(const std::string& unit) const {
  return std::find(completed.begin(), completed.end(), unit) != completed.end();
}

void MemorySink::mark_complete(const std::string& unit) {
  if (!is_complete(unit)) completed.push_back(unit);
}

void MemorySink::write(const std::string& path, const Matrix<double>& m,
                       const std::string& meaning) {
  require_new(*this, path);
  data[path] = m;
  meanings[path] = meaning;
  ++writes;
}

void MemorySink::write(const std::string& path, const std::vector<double>& v,
                       const std::string& meaning) {
  Matrix<double> m(static_cast<int64_t>(v.size()), 1);
  for (size_t i = 0; i < v.size(); ++i) m(i, 0) = v[i];
  write(path, m, meaning);
}

void MemorySink::write(const std::string& path, const std::vector<int64_t>& v,
                       const std::string& meaning) {
  std::vector<double> d(v.begin(), v.end());
  write(path, d, meaning);
}

void MemorySink::write(const std::string& path, const IndexMatrix& v,
                       const std::string& meaning) {
  write(path, Matrix<double>(v.cast<double>()), meaning);
}

void MemorySink::set_attribute(const std::string& object, const std::string& name,
                               const std::string& value) {
  attributes[object + "@" + name] = value;
}

void MemorySink::set_attribute(const std::string& object, const std::string& name,
                               double value) {
  std::ostringstream text;
  text.precision(17);
  text << value;
  attributes[object + "@" + name] = text.str();
}

std::optional<Matrix<double>> MemorySink::read(const std::string& path) const {
  auto it = data.find(path);
  if (it == data.end()) return std::nullopt;
  return it->second;
}

}  // namespace hils::analysis
