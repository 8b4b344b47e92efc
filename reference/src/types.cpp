#include "hils/types.hpp"
#include "hils/threads.hpp"

#include <omp.h>

#include <algorithm>
#include <thread>

namespace hils {

void require(bool ok, const std::string& field, const std::string& expected,
             const std::string& found) {
  if (!ok) throw InvalidArgument(field + ": expected " + expected + ", got " + found);
}

int thread_team_size(int64_t units) {
  const int64_t hardware = std::max(1u, std::thread::hardware_concurrency());
  const int64_t team = std::min({static_cast<int64_t>(omp_get_max_threads()), units, 4 * hardware});
  return static_cast<int>(std::max<int64_t>(team, 1));
}

}  // namespace hils
