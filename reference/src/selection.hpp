// Top-K selection of one query row of one KV group (reference/SEMANTICS.md §4); shared by
// select_chunks and run_mechanism.
#pragma once

#include <cstdint>
#include <vector>

#include "hils/spec.hpp"

namespace hils::detail {

// score_rows[h][c]: s_hat of head h of the group (only c < candidates is read);
// lse_window[h]: that head's window log-mass. Writes K indices to `out`: the
// min(K, candidates) chunks with the largest group score r, ascending, then -1 padding.
template <class Scalar>
void select_row(const std::vector<const Scalar*>& score_rows, const std::vector<Scalar>& lse_window,
                int64_t candidates, GroupRule rule, int64_t K, int32_t* out);

}  // namespace hils::detail
