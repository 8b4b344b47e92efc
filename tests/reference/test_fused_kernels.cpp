// The reference's fused double kernels (AVX-512 builds): the exact chunk log-mass
// (reference/src/chunk_mass.hpp) against the plain path, attention (blocks.cpp) against the plain
// path in long double; both bit-identical across thread counts.
#include <catch2/catch.hpp>
#include <omp.h>

#include <cstring>
#include <random>

#include "case_inputs.hpp"
#include "chunk_mass.hpp"
#include "support.hpp"

using namespace hils;

namespace {

// Shapes beyond the case table: chunks of more than 64 keys (two register tiles, the second
// partial, and padding) and of exactly 64 (the bench's shape).
struct Shape {
  const char* name;
  int64_t T, S, W, d;
  bool landmarks;
};
constexpr Shape kWideShapes[] = {{"wide_chunks_landmarks", 700, 100, 64, 128, true},
                                 {"chunks_of_64", 900, 64, 128, 64, false}};

Matrix<double> gaussian(int64_t rows, int64_t cols, std::mt19937_64& rng) {
  std::normal_distribution<double> gauss;
  Matrix<double> m(rows, cols);
  for (int64_t i = 0; i < m.size(); ++i) m.data()[i] = gauss(rng);
  return m;
}

// The stage over `queries` (empty: all) block by block, with the fused keys or the plain ones.
Matrix<double> chunk_log_mass(const Matrix<double>& q, const Matrix<double>& k,
                              const Geometry& geometry, double scale,
                              const std::vector<int64_t>& queries, bool fused) {
  const auto rows = detail::resolve_queries(queries, geometry.T());
  const auto keys = detail::prepare_chunk_keys(k, geometry, fused);
  Matrix<double> out(static_cast<int64_t>(rows.size()), geometry.n_chunks());
  for (const auto& block : detail::partition_queries(rows, geometry))
    out.middleRows(block.begin, block.size()) = detail::block_chunk_log_mass(
        detail::gather_rows(q, rows, block), rows, block, keys, geometry, scale);
  return out;
}

// Fused and plain agree to rounding: the same -inf entries, and finite entries within
// 1e-14 of the largest |L| (they sum in different orders: measured <= 2.6e-16 of it).
void check_fused_against_plain(const std::string& name, const Matrix<double>& q,
                               const Matrix<double>& k, const Geometry& geometry, double scale) {
  std::vector<int64_t> sparse;  // every 7th slot: blocks with ragged query tiles
  for (int64_t t = 3; t < geometry.T(); t += 7) sparse.push_back(t);
  for (const auto& queries : {std::vector<int64_t>{}, sparse}) {
    const auto fused = chunk_log_mass(q, k, geometry, scale, queries, true);
    const auto plain = chunk_log_mass(q, k, geometry, scale, queries, false);
    double largest = 1;
    for (int64_t i = 0; i < plain.size(); ++i)
      if (std::isfinite(plain.data()[i])) largest = std::max(largest, std::abs(plain.data()[i]));
    INFO(name << (queries.empty() ? ", all queries" : ", every 7th query"));
    REQUIRE(testing::relative_error(fused, plain) < 1.0);  // the same -inf pattern
    CHECK(testing::max_abs_difference(fused, plain) <= 1e-14 * largest);
  }
}

}  // namespace

TEST_CASE("fused chunk log-mass equals the plain path to rounding on every case", "[chunk_mass]") {
  if (!detail::fused_chunk_mass_built())
    WARN("this build has no fused kernel (no AVX-512): the plain path is compared with itself");
  for (const auto& c : cases::kCaseTable) {
    const auto in = cases::make_inputs<double>(c);
    const Geometry geometry(c.T, c.S, c.W, c.landmarks);
    if (geometry.n_chunks() == 0) continue;
    for (int64_t h = 0; h < c.Hq; ++h)
      check_fused_against_plain(c.name, in.q[h], in.k[h / (c.Hq / c.Hkv)], geometry,
                                1.0 / std::sqrt(double(c.d)));
  }
  for (const auto& s : kWideShapes) {
    std::mt19937_64 rng(cases::seed_of(s.name));
    const auto q = gaussian(s.T, s.d, rng), k = gaussian(s.T, s.d, rng);
    check_fused_against_plain(s.name, q, k, Geometry(s.T, s.S, s.W, s.landmarks),
                              1.0 / std::sqrt(double(s.d)));
  }
}

TEST_CASE("exact chunk log-mass is bit-identical on 1 and 2 threads", "[chunk_mass]") {
  for (const auto& s : kWideShapes) {
    std::mt19937_64 rng(cases::seed_of(s.name));
    const auto q = gaussian(s.T, s.d, rng), k = gaussian(s.T, s.d, rng);
    const Geometry geometry(s.T, s.S, s.W, s.landmarks);
    const int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    const auto one = exact_chunk_log_mass<double>(q, k, geometry, 0.125, {});
    omp_set_num_threads(2);
    const auto two = exact_chunk_log_mass<double>(q, k, geometry, 0.125, {});
    omp_set_num_threads(threads);
    INFO(s.name);
    REQUIRE(one.size() == two.size());
    CHECK(std::memcmp(one.data(), two.data(), sizeof(double) * one.size()) == 0);
  }
}

namespace {

// Attention of the fused double kernel against the plain path in long double, all queries and
// every 7th: lse within 1e-14 of the largest |lse| (or of 1), o within 1e-14 relative
// (measured on such shapes: at most 1.4e-15 absolute and 7.3e-16).
void check_attention(const std::string& name, const Matrix<double>& q, const Matrix<double>& k,
                     const Matrix<double>& v, const Geometry& geometry, double scale) {
  const Matrix<long double> q_ld = q.cast<long double>(), k_ld = k.cast<long double>(),
                            v_ld = v.cast<long double>();
  std::vector<int64_t> sparse;
  for (int64_t t = 3; t < geometry.T(); t += 7) sparse.push_back(t);
  for (const auto& queries : {std::vector<int64_t>{}, sparse}) {
    for (bool window : {false, true}) {
      const auto fused = window ? window_attention<double>(q, k, v, geometry, scale, queries)
                                : full_attention<double>(q, k, v, geometry, scale, queries);
      const auto exact =
          window ? window_attention<long double>(q_ld, k_ld, v_ld, geometry, scale, queries)
                 : full_attention<long double>(q_ld, k_ld, v_ld, geometry, scale, queries);
      INFO(name << (window ? ", window" : ", full")
                << (queries.empty() ? ", all queries" : ", every 7th query"));
      const double largest = std::max(1.0, static_cast<double>(exact.lse.cwiseAbs().maxCoeff()));
      CHECK(testing::max_abs_difference(fused.lse, exact.lse) <= 1e-14 * largest);
      CHECK(testing::relative_error(fused.o, exact.o) <= 1e-14);
    }
  }
}

}  // namespace

TEST_CASE("fused attention equals the long double plain path to rounding", "[fused_attention]") {
  if (!detail::fused_chunk_mass_built())
    WARN("this build has no fused kernel (no AVX-512): double runs the plain path");
  for (const auto& c : cases::kCaseTable) {
    const auto in = cases::make_inputs<double>(c);
    const Geometry geometry(c.T, c.S, c.W, c.landmarks);
    for (int64_t h = 0; h < c.Hq; ++h) {
      const int64_t g = h / (c.Hq / c.Hkv);
      check_attention(c.name, in.q[h], in.k[g], in.v[g], geometry, 1.0 / std::sqrt(double(c.d)));
    }
  }
  // Over 64 keys per query (several key steps), d = 128, and dv = 72 (a second, partial pass
  // of output vectors).
  std::mt19937_64 rng(cases::seed_of("wide_attention"));
  const auto q = gaussian(400, 128, rng), k = gaussian(400, 128, rng), v = gaussian(400, 72, rng);
  check_attention("wide_attention", q, k, v, Geometry(400, 16, 100, true), 1.0 / std::sqrt(128.0));
}

TEST_CASE("full attention is bit-identical on 1 and 2 threads", "[fused_attention]") {
  std::mt19937_64 rng(cases::seed_of("attention_threads"));
  const auto q = gaussian(900, 64, rng), k = gaussian(900, 64, rng), v = gaussian(900, 64, rng);
  const Geometry geometry(900, 64, 128, true);
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const auto one = full_attention<double>(q, k, v, geometry, 0.125, {});
  omp_set_num_threads(2);
  const auto two = full_attention<double>(q, k, v, geometry, 0.125, {});
  omp_set_num_threads(threads);
  REQUIRE(one.o.size() == two.o.size());
  CHECK(std::memcmp(one.o.data(), two.o.data(), sizeof(double) * one.o.size()) == 0);
  CHECK(std::memcmp(one.lse.data(), two.lse.data(), sizeof(double) * one.lse.size()) == 0);
}
