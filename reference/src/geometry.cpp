#include "hils/geometry.hpp"

#include <algorithm>
#include <string>

#include "hils/types.hpp"

namespace hils {
namespace {

// Floor division that rounds toward -infinity also for negative numerators.
int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

}  // namespace

Geometry::Geometry(int64_t T, int64_t S, int64_t W, bool landmarks)
    : T_(T), S_(S), W_(W), landmarks_(landmarks) {
  require(T >= 1, "T", "at least 1 slot", std::to_string(T));
  require(S >= 1, "S", "a chunk size of at least 1", std::to_string(S));
  require(W >= 1, "W", "a window of at least 1 slot (W <= 0 is not a window)",
          std::to_string(W));
  require(!landmarks || S >= 2, "S", "at least 2 when landmarks are on (one slot is the landmark)",
          std::to_string(S));
}

Geometry Geometry::for_real_tokens(int64_t real_tokens, int64_t S, int64_t W, bool landmarks) {
  require(real_tokens >= 1, "real_tokens", "at least 1", std::to_string(real_tokens));
  require(S >= (landmarks ? 2 : 1), "S", landmarks ? "at least 2 with landmarks" : "at least 1",
          std::to_string(S));
  int64_t last_slot = landmarks ? (real_tokens - 1) + (real_tokens - 1) / (S - 1) : real_tokens - 1;
  return Geometry(last_slot + 1, S, W, landmarks);
}

bool Geometry::is_landmark(int64_t slot) const {
  // Every slot at offset S-1 of its chunk closes a complete chunk (slot < T), so it is a landmark.
  return landmarks_ && slot % S_ == S_ - 1;
}

int64_t Geometry::slot_of_real(int64_t real_index) const {
  return landmarks_ ? real_index + real_index / (S_ - 1) : real_index;
}

int64_t Geometry::real_tokens() const { return landmarks_ ? T_ - T_ / S_ : T_; }

std::vector<int64_t> Geometry::real_slots() const {
  std::vector<int64_t> slots;
  slots.reserve(static_cast<size_t>(real_tokens()));
  for (int64_t j = 0; j < T_; ++j)
    if (!is_landmark(j)) slots.push_back(j);
  return slots;
}

int64_t Geometry::position_id(int64_t slot) const {
  if (!landmarks_) return slot;
  int64_t chunk = slot / S_;
  int64_t offset = slot % S_;
  // Real tokens before this chunk: chunk * (S-1). A landmark (offset S-1) takes the position of
  // the chunk's last real token plus one, which is chunk * (S-1) + (S-1).
  return chunk * (S_ - 1) + offset;
}

std::vector<int64_t> Geometry::position_ids() const {
  std::vector<int64_t> ids(static_cast<size_t>(T_));
  for (int64_t j = 0; j < T_; ++j) ids[static_cast<size_t>(j)] = position_id(j);
  return ids;
}

int64_t Geometry::window_edge_chunk(int64_t t) const { return floor_div(t - W_ + 1, S_); }

int64_t Geometry::window_left(int64_t t) const {
  return std::max<int64_t>(0, window_edge_chunk(t) * S_);
}

int64_t Geometry::candidate_count(int64_t t) const {
  return std::max<int64_t>(0, std::min(window_edge_chunk(t), n_chunks()));
}

int64_t Geometry::window_token_count(int64_t t) const {
  int64_t count = 0;
  for (int64_t j = window_left(t); j <= t; ++j) count += attendable(j) ? 1 : 0;
  return count;
}

}  // namespace hils
