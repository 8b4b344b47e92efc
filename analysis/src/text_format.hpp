// printf-style formatting into a std::string, for the oracle's messages (private to the analysis
// library, which does not link fmt).
#pragma once

#include <cstdio>
#include <string>

namespace hils::oracle::detail {

// The text is cut at 511 characters; every caller formats a short message.
template <class... Args>
std::string format(const char* pattern, Args... args) {
  char buffer[512];
  std::snprintf(buffer, sizeof buffer, pattern, args...);
  return buffer;
}

}  // namespace hils::oracle::detail
