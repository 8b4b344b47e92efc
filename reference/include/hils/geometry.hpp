// Slot layout, chunks, landmarks, the chunk-aligned window A(t) and the candidates V(t)
// (reference/SEMANTICS.md §1–2, paper Eq. 1).
#pragma once

#include <cstdint>
#include <vector>

namespace hils {

class Geometry {
 public:
  // T slots, chunk size S, window W; landmarks put one landmark slot at the end of every
  // complete chunk. Throws InvalidArgument for T < 1, S < 1, W < 1, or S < 2 with landmarks.
  Geometry(int64_t T, int64_t S, int64_t W, bool landmarks);

  // The geometry whose slots hold `real_tokens` real tokens (plus their landmark slots).
  static Geometry for_real_tokens(int64_t real_tokens, int64_t S, int64_t W, bool landmarks);

  int64_t T() const { return T_; }
  int64_t S() const { return S_; }
  int64_t W() const { return W_; }
  bool landmarks() const { return landmarks_; }

  // Complete chunks, the only ones that can be retrieved: floor(T / S).
  int64_t n_chunks() const { return T_ / S_; }
  int64_t chunk_of(int64_t slot) const { return slot / S_; }
  bool is_landmark(int64_t slot) const;
  bool attendable(int64_t slot) const { return !is_landmark(slot); }
  // Slot (c+1)S-1; only meaningful with landmarks.
  int64_t landmark_slot(int64_t chunk) const { return (chunk + 1) * S_ - 1; }
  // Attendable slots of a chunk: S, or S-1 with landmarks.
  int64_t tokens_per_chunk() const { return landmarks_ ? S_ - 1 : S_; }

  // Real token r sits at slot r + floor(r / (S-1)) with landmarks, at slot r without.
  int64_t slot_of_real(int64_t real_index) const;
  // Number of real (non-landmark) slots among the T slots.
  int64_t real_tokens() const;
  // Slots of the real tokens, ascending.
  std::vector<int64_t> real_slots() const;
  // Position id of a slot for RoPE: real tokens keep their positions, a landmark takes the
  // position of the last real token of its chunk plus one.
  int64_t position_id(int64_t slot) const;
  std::vector<int64_t> position_ids() const;

  // tau(t) = floor((t - W + 1) / S), floor division also for negative numerators.
  int64_t window_edge_chunk(int64_t t) const;
  // l(t) = max(0, tau(t) S): first slot of A(t).
  int64_t window_left(int64_t t) const;
  // |V(t)| = max(0, min(tau(t), n_chunks)); V(t) = {0, ..., |V(t)|-1}.
  int64_t candidate_count(int64_t t) const;
  // |A(t)|: attendable slots in [l(t), t].
  int64_t window_token_count(int64_t t) const;

 private:
  int64_t T_, S_, W_;
  bool landmarks_;
};

}  // namespace hils
