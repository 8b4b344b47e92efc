// numpy arrays <-> the reference's head lists, with every bad array answered by a Python
// exception naming the argument (TypeError for a wrong dtype, ValueError for a wrong rank or
// shape, a non-finite input, an index out of range), in the words `hils verify` uses for the
// same dataset of a verify file (data/verify_format.md).
#pragma once

#include <string>
#include <vector>

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "hils/types.hpp"

namespace hils::python {

namespace py = pybind11;

// Expected sizes of an array's axes; -1 accepts any size. `axes` names them for the message,
// e.g. "(heads, rows, columns)".
struct ArrayShape {
  std::vector<int64_t> dims;
  std::string axes;
};

// A float array (any float dtype) [H x rows x cols] -> H row-major double matrices.
// finite_only: NaN or Inf is a ValueError (inputs); kernel outputs may hold them.
std::vector<Matrix<double>> heads_from_array(const std::string& name, const py::handle& object,
                                             const ArrayShape& shape, bool finite_only);

// A float array [H x n] -> H vectors.
std::vector<Vector<double>> vectors_from_array(const std::string& name, const py::handle& object,
                                               const ArrayShape& shape, bool finite_only);

// An integer array [Hkv x Tq x K] of chunk indices >= -1 -> Hkv index matrices.
std::vector<IndexMatrix> selection_from_array(const std::string& name, const py::handle& object);

// ValueError naming `name` when the array's values as 8-byte `copy` ("float64", "int64") do not
// fit in 80% of the memory this process may use (hils/memory.hpp); every array is checked so
// before it is copied.
void require_fits_in_memory(const std::string& name, const py::array& a, const char* copy);

// An integer array [n] -> the values.
std::vector<int64_t> int64s_from_array(const std::string& name, const py::handle& object);

// Head lists -> float64 arrays [H x rows x cols] and [H x n]; selections -> int64 arrays.
py::array_t<double> array_from_heads(const std::vector<Matrix<double>>& heads);
py::array_t<double> array_from_vectors(const std::vector<Vector<double>>& heads);
py::array_t<int64_t> array_from_selection(const std::vector<IndexMatrix>& selection);

}  // namespace hils::python
