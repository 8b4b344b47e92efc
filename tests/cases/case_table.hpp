// The one table of shapes that CPU tests, GPU tests and benchmarks all read.
// Flat literals; every case derives its random seed from its name.
#pragma once

#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

#include "hils/draws.hpp"

namespace hils::cases {

struct Case {
  const char* name;
  int64_t T, S, W, K;
  int64_t Hq, Hkv, d, dv;
  bool landmarks;
  // Multiplies the queries: small values give flat intra-chunk attention, large values peaked.
  double query_gain;
};

// clang-format off
inline constexpr std::array kCaseTable{
  //    name                         T     S    W    K  Hq Hkv  d  dv  lmk   gain
  Case{"single_slot",                1,    4,   4,   2,  2,  1,  8,  8, true,  1.0},
  Case{"shorter_than_chunk",         3,    8,   4,   2,  2,  2,  8,  4, false, 1.0},
  Case{"shorter_than_window",       30,    4,  64,   3,  4,  2, 16, 16, true,  1.0},
  Case{"ragged_tail",               77,    8,  16,   3,  4,  2, 16, 12, true,  1.0},
  Case{"ragged_tail_no_landmarks",  77,    8,  16,   3,  4,  2, 16, 12, false, 1.0},
  Case{"gqa_group4",               131,    8,  16,   4,  8,  2, 16, 16, true,  1.0},
  Case{"k_zero",                    96,    8,  16,   0,  2,  1, 16, 16, true,  1.0},
  Case{"k_covers_all",             150,    8,  16,  64,  4,  2, 16, 16, true,  1.0},
  Case{"k_covers_all_no_landmarks",150,    8,  16,  64,  2,  1, 16, 16, false, 1.0},
  Case{"window_one",                70,    4,   1,   3,  2,  1,  8,  8, true,  1.0},
  Case{"flat_attention",           239,   16,  32,   4,  4,  1, 32, 32, true,  0.05},
  Case{"peaked_attention",         239,   16,  32,   4,  4,  1, 32, 32, true,  6.0},
  Case{"chunk_two",                 41,    2,   2,   5,  2,  2,  4,  4, true,  1.0},
  Case{"longer_blocks",            799,   32,  96,   6,  4,  2, 64, 64, true,  1.0},
};
// clang-format on

// FNV-1a of the case name: the seed of every random draw for that case.
constexpr uint64_t seed_of(std::string_view name) { return name_hash(name); }

// The case of the table with this name; throws std::invalid_argument for an unknown name.
inline const Case& case_named(std::string_view name) {
  for (const Case& c : kCaseTable)
    if (name == c.name) return c;
  throw std::invalid_argument("no case named " + std::string(name));
}

}  // namespace hils::cases
