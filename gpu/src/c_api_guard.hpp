// The C ABIs' one rule for exceptions (c_api.cpp, decode_c_api.cpp): run `body`, then return 0
// and clear `last_error`, or keep the exception's text in `last_error` and return 2 for bad input
// (std::invalid_argument) or 3 for any other failure, as hils/gpu/c_api.h documents. And their one
// reading of an enum field given as an integer (enum_field).
#pragma once

#include <cstdint>
#include <exception>
#include <stdexcept>
#include <string>

#include "hils/spec.hpp"

namespace hils::gpu::detail {

// An enum field of a C struct (hils_gpu_problem, hils_gpu_decode) -> the spec's value, or
// invalid_argument naming the field and the accepted integers (the names tables of hils/spec.hpp,
// in integer order).
template <class Enum>
Enum enum_field(int32_t value, const char* field) {
  if (auto e = hils::enum_from_int<Enum>(value)) return *e;
  std::string accepted;
  for (const auto& entry : hils::enum_names(Enum{})) {
    const int i = static_cast<int>(entry.value);  // the tables are in integer order
    accepted += (i == 0 ? "" : ", ") + std::to_string(i) + " (" + entry.name + ")";
  }
  throw std::invalid_argument(std::string(field) + ": expected one of " + accepted + ", got " +
                              std::to_string(value));
}

template <class Body>
int call_guarded(std::string& last_error, Body body) {
  try {
    body();
    last_error.clear();
    return 0;
  } catch (const std::invalid_argument& e) {
    last_error = e.what();
    return 2;
  } catch (const std::exception& e) {
    last_error = e.what();
    return 3;
  }
}

}  // namespace hils::gpu::detail
