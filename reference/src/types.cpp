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

namespace {
thread_local const std::atomic<int>* t_stop_flag = nullptr;
}  // namespace

StopScope::StopScope(const std::atomic<int>* flag) noexcept : outer_(t_stop_flag) {
  t_stop_flag = flag;
}

StopScope::~StopScope() { t_stop_flag = outer_; }

const std::atomic<int>* detail::stop_flag() noexcept { return t_stop_flag; }

}  // namespace hils
