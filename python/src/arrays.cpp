#include "arrays.hpp"

#include <cmath>
#include <cstring>
#include <limits>

#include "hils/memory.hpp"

namespace hils::python {

namespace {

using FloatArray = py::array_t<double, py::array::c_style | py::array::forcecast>;
using IntArray = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;

// "<name>: expected <expected>, found <found>", the CLI's phrasing of a bad dataset.
std::string message(const std::string& name, const std::string& expected,
                    const std::string& found) {
  return name + ": expected " + expected + ", found " + found;
}

// [2, 130, 16]
std::string dims_text(const py::array& a) {
  std::string text = "[";
  for (py::ssize_t i = 0; i < a.ndim(); ++i)
    text += (i ? ", " : "") + std::to_string(a.shape(i));
  return text + "]";
}

// [*, 130, 16]: -1 is any size.
std::string expected_dims_text(const std::vector<int64_t>& dims) {
  std::string text = "[";
  for (size_t i = 0; i < dims.size(); ++i)
    text += (i ? ", " : "") + (dims[i] < 0 ? std::string("*") : std::to_string(dims[i]));
  return text + "]";
}

// object -> the numpy array it is, or a TypeError naming `name`.
py::array require_array(const std::string& name, const py::handle& object) {
  if (!py::isinstance<py::array>(object))
    throw py::type_error(message(name, "a numpy array",
                                 "an object of type " +
                                     py::str(py::type::handle_of(object).attr("__name__")).cast<std::string>()));
  return py::reinterpret_borrow<py::array>(object);
}

// Kind letters of numpy dtypes: 'f' floats, 'i' / 'u' signed / unsigned integers.
void require_kind(const std::string& name, const py::array& a, bool integer) {
  const char kind = a.dtype().kind();
  const bool ok = integer ? (kind == 'i' || kind == 'u') : kind == 'f';
  if (!ok)
    throw py::type_error(message(name, integer ? "integer data" : "float data (float16, float32 or float64)",
                                 py::str(a.dtype()).cast<std::string>() + " data"));
}

// Rank and sizes against `shape` (a ValueError naming both shapes otherwise, and a batch axis
// when there is one axis too many).
void require_dims(const std::string& name, const py::array& a, const ArrayShape& shape) {
  bool ok = a.ndim() == static_cast<py::ssize_t>(shape.dims.size());
  for (size_t i = 0; ok && i < shape.dims.size(); ++i)
    ok = shape.dims[i] < 0 || a.shape(static_cast<py::ssize_t>(i)) == shape.dims[i];
  if (ok) return;
  // One axis too many: a batch axis, most likely. Only layout "hsd" reaches here with one
  // (hils/layouts.py checks the rank of every other layout's tensors first).
  std::string axes = shape.axes;
  if (a.ndim() == static_cast<py::ssize_t>(shape.dims.size()) + 1 && !axes.empty() && axes.back() == ')')
    axes.insert(axes.size() - 1,
                "; one sequence in layout \"hsd\", the default: pass x[b], or the batch with "
                "layout=\"bhsd\" or \"bshd\"");
  throw py::value_error(message(
      name,
      "rank " + std::to_string(shape.dims.size()) + " shape " + expected_dims_text(shape.dims) + " " + axes,
      "rank " + std::to_string(a.ndim()) + " shape " + dims_text(a)));
}

// A flat C-order index as the array's index: "[1, 5, 3] (flat index 2883)".
std::string index_text(const FloatArray& d, py::ssize_t flat) {
  std::vector<py::ssize_t> index(static_cast<size_t>(d.ndim()));
  py::ssize_t rest = flat;
  for (py::ssize_t axis = d.ndim() - 1; axis >= 0; --axis) {
    index[static_cast<size_t>(axis)] = rest % d.shape(axis);
    rest /= d.shape(axis);
  }
  std::string text = "[";
  for (size_t i = 0; i < index.size(); ++i) text += (i ? ", " : "") + std::to_string(index[i]);
  return text + "] (flat index " + std::to_string(flat) + ")";
}

// The array's values as C-ordered doubles (a copy for other dtypes or strides).
FloatArray doubles_of(const std::string& name, const py::handle& object, const ArrayShape& shape,
                      bool finite_only) {
  const py::array a = require_array(name, object);
  require_kind(name, a, false);
  require_dims(name, a, shape);
  require_fits_in_memory(name, a, "float64");
  FloatArray d = FloatArray::ensure(a);
  if (!d) throw py::type_error(message(name, "values convertible to float64", "an array that is not"));
  const double* data = d.data();
  for (py::ssize_t i = 0; finite_only && i < d.size(); ++i)
    if (!std::isfinite(data[i]))
      throw py::value_error(message(name, "finite values",
                                    std::string(std::isnan(data[i]) ? "nan" : data[i] > 0 ? "inf" : "-inf") +
                                        " at " + index_text(d, i)));
  return d;
}

}  // namespace

// The array's values as 8-byte `copy` ("float64", "int64"), copied here (and floats again into
// the reference's heads), within the memory this process may use (hils/memory.hpp): a larger
// array (a broadcast view, a memory-mapped dump) ended in numpy's MemoryError, swallowed into
// "not convertible to float64", or in an out-of-memory kill, neither naming the argument or its
// size.
void require_fits_in_memory(const std::string& name, const py::array& a, const char* copy) {
  const double bytes = static_cast<double>(a.size()) * 8;
  const MemoryLimit memory = memory_limit();
  if (bytes < 0.8 * memory.bytes) return;
  throw py::value_error(message(name, std::string("an array whose ") + copy + " values fit in 80% of " + memory.text,
                                "shape " + dims_text(a) + ", about " + bytes_text(bytes)));
}

std::vector<Matrix<double>> heads_from_array(const std::string& name, const py::handle& object,
                                             const ArrayShape& shape, bool finite_only) {
  // [H x rows x cols] array -> H row-major matrices.
  const FloatArray d = doubles_of(name, object, shape, finite_only);
  const auto rows = static_cast<Eigen::Index>(d.shape(1)), cols = static_cast<Eigen::Index>(d.shape(2));
  std::vector<Matrix<double>> heads;
  for (py::ssize_t h = 0; h < d.shape(0); ++h)
    heads.push_back(Eigen::Map<const Matrix<double>>(d.data() + h * rows * cols, rows, cols));
  return heads;
}

std::vector<Vector<double>> vectors_from_array(const std::string& name, const py::handle& object,
                                               const ArrayShape& shape, bool finite_only) {
  // [H x n] array -> H vectors.
  const FloatArray d = doubles_of(name, object, shape, finite_only);
  const auto n = static_cast<Eigen::Index>(d.shape(1));
  std::vector<Vector<double>> heads;
  for (py::ssize_t h = 0; h < d.shape(0); ++h)
    heads.push_back(Eigen::Map<const Vector<double>>(d.data() + h * n, n));
  return heads;
}

namespace {

// An integer array a (any integer dtype) -> its values as int64; uint64 values above int64's
// range are refused (numpy's cast would wrap them to negatives). A copy that cannot fit is refused
// first: it was "expected values convertible to int64" (numpy's MemoryError swallowed), and a
// broadcast uint64 selection spent minutes in the range check's max().
IntArray int64s_of(const std::string& name, const py::array& a) {
  require_fits_in_memory(name, a, "int64");
  if (a.dtype().kind() == 'u' && a.itemsize() == 8 && a.size() > 0) {
    const auto top = py::cast<uint64_t>(a.attr("max")());
    if (top > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      throw py::value_error(message(name, "values within int64's range", std::to_string(top)));
  }
  const IntArray d = IntArray::ensure(a);
  if (!d) throw py::type_error(message(name, "values convertible to int64", "an array that is not"));
  return d;
}

}  // namespace

std::vector<IndexMatrix> selection_from_array(const std::string& name, const py::handle& object) {
  // [Hkv x Tq x K] integer array -> Hkv index matrices; indices must fit int32 and be >= -1.
  const py::array a = require_array(name, object);
  require_kind(name, a, true);
  require_dims(name, a, {{-1, -1, -1}, "(KV groups, queries, K)"});
  const IntArray d = int64s_of(name, a);
  const auto rows = static_cast<Eigen::Index>(d.shape(1)), cols = static_cast<Eigen::Index>(d.shape(2));
  std::vector<IndexMatrix> heads;
  for (py::ssize_t g = 0; g < d.shape(0); ++g) {
    IndexMatrix m(rows, cols);
    for (Eigen::Index i = 0; i < m.size(); ++i) {
      const int64_t value = d.data()[g * rows * cols + i];
      if (value < -1 || value > std::numeric_limits<int32_t>::max())
        throw py::value_error(message(name, "chunk indices from -1 (padding) to 2147483647 (int32)",
                                      std::to_string(value)));
      m.data()[i] = static_cast<int32_t>(value);
    }
    heads.push_back(std::move(m));
  }
  return heads;
}

std::vector<int64_t> int64s_from_array(const std::string& name, const py::handle& object) {
  // [n] integer array -> values.
  const py::array a = require_array(name, object);
  require_kind(name, a, true);
  require_dims(name, a, {{-1}, "(queries)"});
  const IntArray d = int64s_of(name, a);
  return std::vector<int64_t>(d.data(), d.data() + d.size());
}

py::array_t<double> array_from_heads(const std::vector<Matrix<double>>& heads) {
  // H matrices of equal shape -> [H x rows x cols].
  const py::ssize_t rows = heads.empty() ? 0 : heads.front().rows();
  const py::ssize_t cols = heads.empty() ? 0 : heads.front().cols();
  py::array_t<double> out(std::vector<py::ssize_t>{static_cast<py::ssize_t>(heads.size()), rows, cols});
  double* p = out.mutable_data();
  for (const auto& m : heads) {
    if (m.size()) std::memcpy(p, m.data(), sizeof(double) * static_cast<size_t>(m.size()));
    p += m.size();
  }
  return out;
}

py::array_t<double> array_from_vectors(const std::vector<Vector<double>>& heads) {
  // H vectors of equal length -> [H x n].
  const py::ssize_t n = heads.empty() ? 0 : heads.front().size();
  py::array_t<double> out(std::vector<py::ssize_t>{static_cast<py::ssize_t>(heads.size()), n});
  double* p = out.mutable_data();
  for (const auto& v : heads) {
    if (v.size()) std::memcpy(p, v.data(), sizeof(double) * static_cast<size_t>(v.size()));
    p += v.size();
  }
  return out;
}

py::array_t<int64_t> array_from_selection(const std::vector<IndexMatrix>& selection) {
  // Hkv index matrices -> [Hkv x Tq x K] int64.
  const py::ssize_t rows = selection.empty() ? 0 : selection.front().rows();
  const py::ssize_t cols = selection.empty() ? 0 : selection.front().cols();
  py::array_t<int64_t> out(
      std::vector<py::ssize_t>{static_cast<py::ssize_t>(selection.size()), rows, cols});
  int64_t* p = out.mutable_data();
  for (const auto& m : selection)
    for (Eigen::Index i = 0; i < m.size(); ++i) *p++ = m.data()[i];
  return out;
}

}  // namespace hils::python
