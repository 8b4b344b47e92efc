#include "io/results_sink.hpp"

namespace hils::io {

void ResultsWriterSink::mark_complete(const std::string& unit) {
  writer_.mark_complete(unit);
  writer_.checkpoint();
}

void ResultsWriterSink::mark_complete_all(const std::vector<std::string>& units) {
  for (const auto& unit : units) writer_.mark_complete(unit);
  if (!units.empty()) writer_.checkpoint();
}

void ResultsWriterSink::write(const std::string& path, const Matrix<double>& data,
                              const std::string& meaning) {
  writer_.write_matrix(path, data, meaning);
  if (read_back_ == ReadBack::written_and_previous) written_[path] = data;
}

void ResultsWriterSink::write(const std::string& path, const std::vector<double>& data,
                              const std::string& meaning) {
  writer_.write_vector(path, data, meaning);
  if (read_back_ == ReadBack::written_and_previous)
    written_[path] =
        Eigen::Map<const Matrix<double>>(data.data(), static_cast<int64_t>(data.size()), 1);
}

void ResultsWriterSink::write(const std::string& path, const std::vector<int64_t>& data,
                              const std::string& meaning) {
  writer_.write_indices(path, data, meaning);
}

void ResultsWriterSink::write(const std::string& path, const IndexMatrix& data,
                              const std::string& meaning) {
  writer_.write_indices(path, data, meaning);
}

void ResultsWriterSink::set_attribute(const std::string& object, const std::string& name,
                                      const std::string& value) {
  writer_.set_attribute(object, name, value);
}

void ResultsWriterSink::set_attribute(const std::string& object, const std::string& name,
                                      double value) {
  writer_.set_attribute(object, name, value);
}

std::optional<Matrix<double>> ResultsWriterSink::read(const std::string& path) const {
  if (auto it = written_.find(path); it != written_.end()) return it->second;
  if (previous_ && previous_->exists(path)) return previous_->matrix(path);
  return std::nullopt;
}

}  // namespace hils::io
