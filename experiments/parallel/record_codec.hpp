// A unit's recorded results as bytes, for sending them from an MPI worker to rank 0:
// [uint64 unit index][uint64 record count] then each record (see record_codec.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hils/analysis/units.hpp"

namespace hils::parallel {

std::vector<char> encode_unit(uint64_t unit, const analysis::RecordingSink& records);
// Throws std::runtime_error on a truncated or malformed message.
analysis::RecordingSink decode_unit(const std::vector<char>& bytes, uint64_t& unit);

}  // namespace hils::parallel
