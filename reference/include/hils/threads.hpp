// The size of the OpenMP teams the reference and the studies run their units on.
#pragma once

#include <cstdint>

namespace hils {

// The OpenMP team for `units` independent units -> its size: OMP_NUM_THREADS (or OpenMP's
// default), at most `units` and at most 4 per hardware thread of this machine. Results never
// depend on it; the cap is there because OMP_NUM_THREADS=100000 made libgomp overflow the
// stack creating the team (SIGSEGV).
int thread_team_size(int64_t units);

}  // namespace hils
