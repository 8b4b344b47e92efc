#include "hils/types.hpp"

namespace hils {

void require(bool ok, const std::string& field, const std::string& expected,
             const std::string& found) {
  if (!ok) throw InvalidArgument(field + ": expected " + expected + ", got " + found);
}

}  // namespace hils
