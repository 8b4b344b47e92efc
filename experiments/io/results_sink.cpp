#include "io/results_sink.hpp"

#include <algorithm>

namespace hils::io {

void ResultsWriterSink::mark_complete(const std::string& unit) {
  writer_.mark_complete(unit);
  marked(1);
}

void ResultsWriterSink::mark_complete_all(const std::vector<std::string>& units) {
  for (const auto& unit : units) writer_.mark_complete(unit);
  marked(units.size());
}

void ResultsWriterSink::marked(size_t units) {
  written_since_mark_ = false;
  unpublished_ += units;
  if (unpublished_ == 0) return;
  const std::chrono::duration<double> since =
      std::chrono::steady_clock::now() - last_checkpoint_end_;
  if (last_checkpoint_seconds_ == 0 ||
      since.count() >= checkpoint_spacing_ * last_checkpoint_seconds_)
    checkpoint();
}

void ResultsWriterSink::checkpoint() {
  const auto start = std::chrono::steady_clock::now();
  writer_.checkpoint();
  last_checkpoint_end_ = std::chrono::steady_clock::now();
  // A floor keeps a very fast first checkpoint from reading as "none yet".
  last_checkpoint_seconds_ =
      std::max(1e-9, std::chrono::duration<double>(last_checkpoint_end_ - start).count());
  unpublished_ = 0;
}

void ResultsWriterSink::publish_completed() noexcept {
  if (unpublished_ == 0 || written_since_mark_) return;
  try {
    checkpoint();
  } catch (...) {
    // The last checkpoint stays what the file holds; the caller reports the run's own error.
  }
}

void ResultsWriterSink::write(const std::string& path, const Matrix<double>& data,
                              const std::string& meaning) {
  written();
  writer_.write_matrix(path, data, meaning);
  if (read_back_ == ReadBack::written_and_previous) written_[path] = data;
}

void ResultsWriterSink::write(const std::string& path, const std::vector<double>& data,
                              const std::string& meaning) {
  written();
  writer_.write_vector(path, data, meaning);
  if (read_back_ == ReadBack::written_and_previous)
    written_[path] =
        Eigen::Map<const Matrix<double>>(data.data(), static_cast<int64_t>(data.size()), 1);
}

void ResultsWriterSink::write(const std::string& path, const std::vector<int64_t>& data,
                              const std::string& meaning) {
  written();
  writer_.write_indices(path, data, meaning);
}

void ResultsWriterSink::write(const std::string& path, const IndexMatrix& data,
                              const std::string& meaning) {
  written();
  writer_.write_indices(path, data, meaning);
}

void ResultsWriterSink::set_attribute(const std::string& object, const std::string& name,
                                      const std::string& value) {
  written();
  writer_.set_attribute(object, name, value);
}

void ResultsWriterSink::set_attribute(const std::string& object, const std::string& name,
                                      double value) {
  written();
  writer_.set_attribute(object, name, value);
}

std::optional<Matrix<double>> ResultsWriterSink::read(const std::string& path) const {
  if (auto it = written_.find(path); it != written_.end()) return it->second;
  if (previous_ && previous_->exists(path)) return previous_->matrix(path);
  return std::nullopt;
}

}  // namespace hils::io
