// The reference's fused double kernels (AVX-512 builds): the exact chunk log-mass
// (reference/src/chunk_mass.hpp) against the plain path, attention (blocks.cpp) against the plain
// path in long double, the backward's window softmax (fused_backward.hpp) against the Eigen path
// in double and long double; all bit-identical across thread counts.
#include <catch2/catch.hpp>
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>

#include "case_inputs.hpp"
#include "chunk_mass.hpp"
#include "fused_backward.hpp"
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

namespace {

// Beyond the case table for the fused backward, both with T not a multiple of 64 and 2 heads per
// KV group: several 64 x 64 tiles, d = 128 and dv = 72 (a full and a partial output vector);
// and 66 query blocks, so that units of 4 x 4 tiles run (fused_backward.cpp), the last partial.
constexpr cases::Case kWideBackward{"wide_backward", 400, 16, 100, 4, 2, 1, 128, 72, true, 1.0};
constexpr cases::Case kLongBackward{"long_backward", 4200, 16, 300, 4, 2, 1, 16, 8, true, 1.0};

OutputGradients<double> gaussian_upstream(const cases::Case& c) {
  std::mt19937_64 rng(cases::seed_of(c.name) ^ 0xbac4);
  OutputGradients<double> g;
  for (int64_t h = 0; h < c.Hq; ++h) {
    g.d_o.push_back(gaussian(c.T, c.dv, rng));
    g.d_lse.push_back(Vector<double>(gaussian(c.T, 1, rng)));
  }
  return g;
}

template <class Scalar>
OutputGradients<Scalar> cast_upstream(const OutputGradients<double>& g) {
  OutputGradients<Scalar> out;
  for (const auto& m : g.d_o) out.d_o.push_back(m.cast<Scalar>());
  for (const auto& m : g.d_lse) out.d_lse.push_back(m.cast<Scalar>());
  return out;
}

// The largest relative error (testing::relative_error) over the heads of dq, dk, dv and dq~.
template <class Scalar>
double gradient_error(const InputGradients<double>& a, const InputGradients<Scalar>& b) {
  double worst = 0;
  auto compare = [&](const auto& x, const auto& y) {
    REQUIRE(x.size() == y.size());
    for (size_t h = 0; h < x.size(); ++h) worst = std::max(worst, testing::relative_error(x[h], y[h]));
  };
  compare(a.dq, b.dq);
  compare(a.dk, b.dk);
  compare(a.dv, b.dv);
  compare(a.dq_retrieval, b.dq_retrieval);
  return worst;
}

// The worst relative errors of the fused backward seen, against each path.
struct Worst {
  double to_plain = 0, to_exact = 0;
};

// The fused backward against the Eigen path in double and, with `exact`, in long double (no
// saved forward: each recomputes the window softmax as its forward does). Both within 1e-13
// (measured: at most 8.9e-15 on these shapes, the plain double path itself 8e-15 from long double).
void check_backward(const MechanismSpec& spec, const cases::Case& c, bool exact, Worst& worst) {
  const auto in = cases::make_inputs<double>(c);
  const auto g = gaussian_upstream(c);
  const auto selection = run_mechanism(spec, in).selection;
  const auto fused = detail::mechanism_backward<double>(spec, in, selection, g, nullptr, true);
  const auto plain = detail::mechanism_backward<double>(spec, in, selection, g, nullptr, false);
  INFO(c.name << ", " << spec.name);
  const double to_plain = gradient_error(fused, plain);
  CHECK(to_plain <= 1e-13);
  worst.to_plain = std::max(worst.to_plain, to_plain);
  if (!exact) return;
  const auto in_ld = cases::make_inputs<long double>(c);
  const auto to_exact = gradient_error(
      fused, detail::mechanism_backward<long double>(spec, in_ld, selection,
                                                     cast_upstream<long double>(g), nullptr, false));
  CHECK(to_exact <= 1e-13);
  worst.to_exact = std::max(worst.to_exact, to_exact);
}

}  // namespace

// Every spec against the double Eigen path; full, swa and hils (full, window and hierarchical
// fusion) against long double too (its path is slow; the fused kernel computes the same window
// softmax for every spec, given each row's lambda and delta).
TEST_CASE("fused backward equals the Eigen path in double and long double to rounding",
          "[fused_backward]") {
  if (!detail::fused_chunk_mass_built())
    WARN("this build has no fused kernel (no AVX-512): double runs the Eigen path");
  const std::vector<std::string> with_exact = {"full", "swa", "hils"};
  Worst worst;
  for (const auto& base : testing::all_specs()) {
    const bool exact =
        std::find(with_exact.begin(), with_exact.end(), base.name) != with_exact.end();
    for (const auto& c : cases::kCaseTable)
      if (const auto spec = testing::spec_for_case(base, c)) check_backward(*spec, c, exact, worst);
    if (const auto spec = testing::spec_for_case(base, kWideBackward))
      check_backward(*spec, kWideBackward, exact, worst);
  }
  for (const char* name : {"full", "hils"})  // long: the double Eigen path only
    check_backward(cases::with_case_geometry(preset(name), kLongBackward), kLongBackward, false,
                   worst);
  std::printf("fused backward vs the Eigen path: worst relative %.2e (double), %.2e (long double)\n",
              worst.to_plain, worst.to_exact);
}

TEST_CASE("fused backward is bit-identical on 1 and 2 threads", "[fused_backward]") {
  for (const auto& c : {kWideBackward, kLongBackward}) {
    const auto in = cases::make_inputs<double>(c);
    const auto g = gaussian_upstream(c);
    for (const char* name : {"full", "swa", "hils"}) {
      const auto spec = cases::with_case_geometry(preset(name), c);
      const auto selection = run_mechanism(spec, in).selection;
      const int threads = omp_get_max_threads();
      omp_set_num_threads(1);
      const auto one = run_mechanism_backward(spec, in, selection, g);
      omp_set_num_threads(2);
      const auto two = run_mechanism_backward(spec, in, selection, g);
      omp_set_num_threads(threads);
      INFO(c.name << ", " << name);
      CHECK(one.dq == two.dq);
      CHECK(one.dk == two.dk);
      CHECK(one.dv == two.dv);
      CHECK(one.dq_retrieval == two.dq_retrieval);
    }
  }
}
