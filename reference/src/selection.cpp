#include "selection.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "blocks.hpp"

namespace hils::detail {
namespace {

// log Z_hat(t,h) = logaddexp(lse_swa, LSE_{c in V(t)} s_hat) (Eq. 8).
template <class Scalar>
Scalar surrogate_normalizer(const Scalar* scores, int64_t candidates, Scalar lse_window) {
  Scalar top = lse_window;
  for (int64_t c = 0; c < candidates; ++c) top = std::max(top, scores[c]);
  Scalar sum = std::exp(lse_window - top);
  for (int64_t c = 0; c < candidates; ++c) sum += std::exp(scores[c] - top);
  return top + std::log(sum);
}

}  // namespace

template <class Scalar>
void select_row(const std::vector<const Scalar*>& score_rows, const std::vector<Scalar>& lse_window,
                int64_t candidates, GroupRule rule, int64_t K, int32_t* out) {
  std::fill(out, out + K, -1);
  const int64_t take = std::min(K, candidates);
  if (take == 0) return;
  std::vector<Scalar> group_score(static_cast<size_t>(candidates),
                                  rule == GroupRule::sum_probabilities ? Scalar(0) : neg_inf<Scalar>());
  for (size_t h = 0; h < score_rows.size(); ++h) {
    const Scalar* s = score_rows[h];
    const Scalar log_z = rule == GroupRule::max_raw
                             ? Scalar(0)
                             : surrogate_normalizer(s, candidates, lse_window[h]);
    for (int64_t c = 0; c < candidates; ++c) {
      Scalar& r = group_score[static_cast<size_t>(c)];
      switch (rule) {
        case GroupRule::max_normalized: r = std::max(r, s[c] - log_z); break;
        case GroupRule::sum_probabilities: r += std::exp(s[c] - log_z); break;
        case GroupRule::max_raw: r = std::max(r, s[c]); break;
      }
    }
  }
  std::vector<int32_t> order(static_cast<size_t>(candidates));
  std::iota(order.begin(), order.end(), 0);
  // Larger score first; equal scores keep the lower chunk index first.
  std::partial_sort(order.begin(), order.begin() + take, order.end(), [&](int32_t a, int32_t b) {
    const Scalar ra = group_score[static_cast<size_t>(a)], rb = group_score[static_cast<size_t>(b)];
    return ra > rb || (ra == rb && a < b);
  });
  std::sort(order.begin(), order.begin() + take);
  std::copy(order.begin(), order.begin() + take, out);
}

template void select_row<float>(const std::vector<const float*>&, const std::vector<float>&,
                                int64_t, GroupRule, int64_t, int32_t*);
template void select_row<double>(const std::vector<const double*>&, const std::vector<double>&,
                                 int64_t, GroupRule, int64_t, int32_t*);
template void select_row<long double>(const std::vector<const long double*>&,
                                      const std::vector<long double>&, int64_t, GroupRule,
                                      int64_t, int32_t*);

}  // namespace hils::detail
