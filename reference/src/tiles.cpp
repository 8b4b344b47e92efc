#include "tiles.hpp"

#ifdef HILS_FUSED_KERNELS

#include <cmath>

namespace hils::detail {

namespace {

// The table of exp_nonpositive8: 2^(j/16) = head[j] + tail[j], j = 0..15.
struct ExpTable {
  alignas(64) double head[16];
  alignas(64) double tail[16];
  ExpTable() {
    for (int j = 0; j < 16; ++j) {
      const long double value = std::exp2l(static_cast<long double>(j) / 16);
      head[j] = static_cast<double>(value);
      tail[j] = static_cast<double>(value - head[j]);
    }
  }
};
const ExpTable kExpTable;

}  // namespace

__m512d exp_nonpositive8(__m512d x) {
  constexpr double kSixteenLog2e = 23.083120654223414517;  // 16 / ln 2
  // ln2/16 in two parts: the head has 32 significant bits, so k * head is exact for |k| < 2^21.
  constexpr double kHead = 6.93147180369123816490e-01 / 16;
  constexpr double kTail = 1.90821492927058770002e-10 / 16;
  constexpr double kRoundingShift = 6755399441055744.0;  // 1.5 * 2^52: adding it rounds to an integer
  const __m512d underflow = _mm512_set1_pd(-708.0);
  // max(a, b) returns b when either is NaN: NaN goes through to the result.
  const __m512d clamped = _mm512_max_pd(underflow, x);
  const __m512d shift = _mm512_set1_pd(kRoundingShift);
  const __m512d shifted = _mm512_fmadd_pd(clamped, _mm512_set1_pd(kSixteenLog2e), shift);
  const __m512d k = _mm512_sub_pd(shifted, shift);
  __m512d r = _mm512_fnmadd_pd(k, _mm512_set1_pd(kHead), clamped);
  r = _mm512_fnmadd_pd(k, _mm512_set1_pd(kTail), r);
  // q = exp(r) - 1 = r + r^2/2! + ... + r^7/7!, Horner's rule.
  __m512d p = _mm512_set1_pd(1.0 / 5040);
  p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0 / 720));
  p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0 / 120));
  p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0 / 24));
  p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0 / 6));
  p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(0.5));
  p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0));
  const __m512d q = _mm512_mul_pd(p, r);
  // The low bits of `shifted` hold k = 16 n + j.
  const __m512i k_bits = _mm512_sub_epi64(_mm512_castpd_si512(shifted), _mm512_castpd_si512(shift));
  const __m512i j = _mm512_and_si512(k_bits, _mm512_set1_epi64(15));
  const __m512i n = _mm512_srai_epi64(k_bits, 4);
  const __m512d head_lo = _mm512_loadu_pd(kExpTable.head), head_hi = _mm512_loadu_pd(kExpTable.head + 8);
  const __m512d tail_lo = _mm512_loadu_pd(kExpTable.tail), tail_hi = _mm512_loadu_pd(kExpTable.tail + 8);
  const __m512d head = _mm512_permutex2var_pd(head_lo, j, head_hi);
  const __m512d tail = _mm512_permutex2var_pd(tail_lo, j, tail_hi);
  // 2^(j/16) (1 + q), then times 2^n: exact, as the result is normal for x >= -708.
  const __m512d mantissa = _mm512_add_pd(_mm512_fmadd_pd(head, q, tail), head);
  const __m512d two_to_n =
      _mm512_castsi512_pd(_mm512_slli_epi64(_mm512_add_epi64(n, _mm512_set1_epi64(1023)), 52));
  const __mmask8 below = _mm512_cmp_pd_mask(x, underflow, _CMP_LT_OQ);
  return _mm512_maskz_mul_pd(static_cast<__mmask8>(~below), mantissa, two_to_n);
}

void transpose_rows(const double* rows, int64_t row_stride, int64_t keys, int64_t d,
                    double* out, int64_t stride) {
  const int64_t full_keys = keys / kLanes * kLanes, full_dims = d / kLanes * kLanes;
  // Index vectors of _mm512_permutex2var_pd: 0-7 pick from the first operand, 8-15 the second.
  const __m512i pairs_even = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
  const __m512i pairs_odd = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
  const __m512i low_halves = _mm512_setr_epi64(0, 1, 2, 3, 8, 9, 10, 11);
  const __m512i high_halves = _mm512_setr_epi64(4, 5, 6, 7, 12, 13, 14, 15);
  for (int64_t j = 0; j < full_keys; j += kLanes) {
    for (int64_t dim = 0; dim < full_dims; dim += kLanes) {
      __m512d row[kLanes];  // row[r] = rows[j + r][dim .. dim + 7]
      for (int r = 0; r < kLanes; ++r) row[r] = _mm512_loadu_pd(rows + (j + r) * row_stride + dim);
      // Interleave pairs of rows: even[p] holds columns 0,2,4,6 of rows 2p, 2p+1; odd[p] 1,3,5,7.
      __m512d even[4], odd[4];
      for (int p = 0; p < 4; ++p) {
        even[p] = _mm512_unpacklo_pd(row[2 * p], row[2 * p + 1]);
        odd[p] = _mm512_unpackhi_pd(row[2 * p], row[2 * p + 1]);
      }
      // Quarters: rows 0-3 (from pairs 0, 1) or 4-7 (pairs 2, 3) of columns c and c + 4.
      const __m512d c04_lo = _mm512_permutex2var_pd(even[0], pairs_even, even[1]);
      const __m512d c26_lo = _mm512_permutex2var_pd(even[0], pairs_odd, even[1]);
      const __m512d c15_lo = _mm512_permutex2var_pd(odd[0], pairs_even, odd[1]);
      const __m512d c37_lo = _mm512_permutex2var_pd(odd[0], pairs_odd, odd[1]);
      const __m512d c04_hi = _mm512_permutex2var_pd(even[2], pairs_even, even[3]);
      const __m512d c26_hi = _mm512_permutex2var_pd(even[2], pairs_odd, even[3]);
      const __m512d c15_hi = _mm512_permutex2var_pd(odd[2], pairs_even, odd[3]);
      const __m512d c37_hi = _mm512_permutex2var_pd(odd[2], pairs_odd, odd[3]);
      double* column = out + dim * stride + j;
      _mm512_storeu_pd(column + 0 * stride, _mm512_permutex2var_pd(c04_lo, low_halves, c04_hi));
      _mm512_storeu_pd(column + 4 * stride, _mm512_permutex2var_pd(c04_lo, high_halves, c04_hi));
      _mm512_storeu_pd(column + 2 * stride, _mm512_permutex2var_pd(c26_lo, low_halves, c26_hi));
      _mm512_storeu_pd(column + 6 * stride, _mm512_permutex2var_pd(c26_lo, high_halves, c26_hi));
      _mm512_storeu_pd(column + 1 * stride, _mm512_permutex2var_pd(c15_lo, low_halves, c15_hi));
      _mm512_storeu_pd(column + 5 * stride, _mm512_permutex2var_pd(c15_lo, high_halves, c15_hi));
      _mm512_storeu_pd(column + 3 * stride, _mm512_permutex2var_pd(c37_lo, low_halves, c37_hi));
      _mm512_storeu_pd(column + 7 * stride, _mm512_permutex2var_pd(c37_lo, high_halves, c37_hi));
    }
    for (int64_t dim = full_dims; dim < d; ++dim)
      for (int64_t r = j; r < j + kLanes; ++r) out[dim * stride + r] = rows[r * row_stride + dim];
  }
  for (int64_t r = full_keys; r < keys; ++r)
    for (int64_t dim = 0; dim < d; ++dim) out[dim * stride + r] = rows[r * row_stride + dim];
}

}  // namespace hils::detail

#endif
