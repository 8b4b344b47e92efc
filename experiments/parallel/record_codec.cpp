#include "parallel/record_codec.hpp"

#include <bit>
#include <cstring>
#include <stdexcept>

namespace hils::parallel {

namespace {

using analysis::RecordingSink;

class Writer {
 public:
  void bytes(const void* p, size_t n) {
    const auto* c = static_cast<const char*>(p);
    out.insert(out.end(), c, c + n);
  }
  void u64(uint64_t v) { bytes(&v, sizeof v); }
  void text(const std::string& s) { u64(s.size()), bytes(s.data(), s.size()); }
  template <class T>
  void array(const T* data, uint64_t rows, uint64_t cols) {
    u64(rows), u64(cols), bytes(data, rows * cols * sizeof(T));
  }
  std::vector<char> out;
};

class Reader {
 public:
  explicit Reader(const std::vector<char>& in) : in_(in) {}
  void bytes(void* p, size_t n) {
    if (n > in_.size() - at_) throw std::runtime_error("unit message: truncated");
    std::memcpy(p, in_.data() + at_, n);
    at_ += n;
  }
  uint64_t u64() {
    uint64_t v;
    bytes(&v, sizeof v);
    return v;
  }
  std::string text() {
    std::string s(u64(), '\0');
    bytes(s.data(), s.size());
    return s;
  }
  template <class M>
  M matrix() {
    const auto rows = static_cast<int64_t>(u64()), cols = static_cast<int64_t>(u64());
    M m(rows, cols);
    bytes(m.data(), static_cast<size_t>(rows * cols) * sizeof(typename M::Scalar));
    return m;
  }
  template <class T>
  std::vector<T> vector() {
    const auto rows = u64();
    u64();
    std::vector<T> v(rows);
    bytes(v.data(), rows * sizeof(T));
    return v;
  }
  bool done() const { return at_ == in_.size(); }

 private:
  const std::vector<char>& in_;
  size_t at_ = 0;
};

// Record kinds on the wire.
enum Kind : uint64_t { kMatrix, kDoubles, kIndices, kIndexMatrix, kTextAttribute, kNumberAttribute };

}  // namespace

std::vector<char> encode_unit(uint64_t unit, const RecordingSink& records) {
  Writer w;
  w.u64(unit);
  w.u64(records.records.size());
  for (const auto& record : records.records) {
    if (const auto* d = std::get_if<RecordingSink::Dataset>(&record)) {
      w.u64(d->data.index());
      w.text(d->path), w.text(d->meaning);
      if (const auto* m = std::get_if<Matrix<double>>(&d->data)) w.array(m->data(), m->rows(), m->cols());
      if (const auto* v = std::get_if<std::vector<double>>(&d->data)) w.array(v->data(), v->size(), 1);
      if (const auto* v = std::get_if<std::vector<int64_t>>(&d->data)) w.array(v->data(), v->size(), 1);
      if (const auto* m = std::get_if<IndexMatrix>(&d->data)) w.array(m->data(), m->rows(), m->cols());
    } else {
      const auto& a = std::get<RecordingSink::Attribute>(record);
      const bool text = std::holds_alternative<std::string>(a.value);
      w.u64(text ? kTextAttribute : kNumberAttribute);
      w.text(a.object), w.text(a.name);
      if (text) w.text(std::get<std::string>(a.value));
      else w.u64(std::bit_cast<uint64_t>(std::get<double>(a.value)));
    }
  }
  return std::move(w.out);
}

RecordingSink decode_unit(const std::vector<char>& bytes, uint64_t& unit) {
  Reader r(bytes);
  unit = r.u64();
  RecordingSink out;
  const uint64_t count = r.u64();
  for (uint64_t i = 0; i < count; ++i) {
    const uint64_t kind = r.u64();
    std::string first = r.text(), second = r.text();
    switch (kind) {
      case kMatrix: out.write(first, r.matrix<Matrix<double>>(), second); break;
      case kDoubles: out.write(first, r.vector<double>(), second); break;
      case kIndices: out.write(first, r.vector<int64_t>(), second); break;
      case kIndexMatrix: out.write(first, r.matrix<IndexMatrix>(), second); break;
      case kTextAttribute: out.set_attribute(first, second, r.text()); break;
      case kNumberAttribute: out.set_attribute(first, second, std::bit_cast<double>(r.u64())); break;
      default: throw std::runtime_error("unit message: unknown record kind");
    }
  }
  if (!r.done()) throw std::runtime_error("unit message: trailing bytes");
  return out;
}

}  // namespace hils::parallel
