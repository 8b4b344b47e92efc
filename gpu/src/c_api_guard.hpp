// The C ABIs' one rule for exceptions (c_api.cpp, decode_c_api.cpp): run `body`, then return 0
// and clear `last_error`, or keep the exception's text in `last_error` and return 2 for bad input
// (std::invalid_argument) or 3 for any other failure, as hils/gpu/c_api.h documents.
#pragma once

#include <exception>
#include <stdexcept>
#include <string>

namespace hils::gpu::detail {

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
