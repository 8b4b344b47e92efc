// run_mechanism_backward against finite differences of the long double forward (Richardson
// extrapolated central differences), identities, and thread-count bit identity.
#include <catch2/catch.hpp>
#include <omp.h>

#include <cmath>
#include <complex>
#include <cstdio>
#include <random>

#include "support.hpp"

using namespace hils;

namespace {

using LD = long double;

template <class To, class From>
std::vector<Matrix<To>> cast_heads(const std::vector<Matrix<From>>& heads) {
  std::vector<Matrix<To>> out;
  for (const auto& m : heads) out.push_back(m.template cast<To>());
  return out;
}

template <class To, class From>
AttentionInputs<To> cast_inputs(const AttentionInputs<From>& in) {
  return {cast_heads<To>(in.q), cast_heads<To>(in.k), cast_heads<To>(in.v),
          cast_heads<To>(in.q_retrieval), cast_heads<To>(in.prior)};
}

// The five input tensors by name, for perturbing and for reading gradients.
std::vector<Matrix<LD>>& tensor(AttentionInputs<LD>& in, int which) {
  switch (which) {
    case 0: return in.q;
    case 1: return in.k;
    case 2: return in.v;
    case 3: return in.q_retrieval;
    default: return in.prior;
  }
}
const std::vector<Matrix<double>>& gradient(const InputGradients<double>& g, int which) {
  switch (which) {
    case 0: return g.dq;
    case 1: return g.dk;
    case 2: return g.dv;
    case 3: return g.dq_retrieval;
    default: return g.dprior;
  }
}
const char* const kTensorNames[] = {"q", "k", "v", "q_retrieval", "prior"};

// Upstream gradients do, dlse: Gaussian from the case's seed.
OutputGradients<double> upstream(const cases::Case& c) {
  std::mt19937_64 rng(cases::seed_of(c.name) ^ 0xd0d0);
  std::normal_distribution<double> gauss(0.0, 1.0);
  OutputGradients<double> g;
  for (int64_t h = 0; h < c.Hq; ++h) {
    g.d_o.push_back(Matrix<double>(c.T, c.dv));
    for (int64_t i = 0; i < g.d_o.back().size(); ++i) g.d_o.back().data()[i] = gauss(rng);
    g.d_lse.push_back(Vector<double>(c.T));
    for (int64_t i = 0; i < c.T; ++i) g.d_lse.back()(i) = gauss(rng);
  }
  return g;
}

// L = sum do.o + sum dlse.lse of the long double forward; sets `changed` if the selection
// differs from `selection` (the finite difference then crossed a tie and is not comparable).
LD loss(const MechanismSpec& spec, const AttentionInputs<LD>& in, const OutputGradients<double>& g,
        const std::vector<IndexMatrix>& selection, bool& changed) {
  const auto out = run_mechanism(spec, in);
  if (out.selection != selection) changed = true;
  LD total = 0;
  for (size_t h = 0; h < out.heads.size(); ++h) {
    total += (out.heads[h].o.array() * g.d_o[h].cast<LD>().array()).sum();
    total += (out.heads[h].lse.array() * g.d_lse[h].cast<LD>().array()).sum();
  }
  return total;
}

// Directional derivative of the loss along `direction` in tensor `which`: central differences
// at h and h/2 combined by Richardson extrapolation (error O(h^4)), in long double.
LD directional_derivative(const MechanismSpec& spec, const AttentionInputs<LD>& base, int which,
                          const std::vector<Matrix<LD>>& direction, const OutputGradients<double>& g,
                          const std::vector<IndexMatrix>& selection, LD h) {
  auto at = [&](LD step) {
    AttentionInputs<LD> moved = base;
    auto& heads = tensor(moved, which);
    for (size_t i = 0; i < heads.size(); ++i) heads[i] += step * direction[i];
    bool changed = false;
    const LD value = loss(spec, moved, g, selection, changed);
    if (changed) throw std::runtime_error("selection changed under the finite-difference step");
    return value;
  };
  // A step that crosses a near-tie of the selection is retried 100x smaller (twice at most).
  for (int attempt = 0;; ++attempt, h /= 100) {
    try {
      const LD coarse = (at(h) - at(-h)) / (2 * h);
      const LD fine = (at(h / 2) - at(-h / 2)) / h;
      return (4 * fine - coarse) / 3;
    } catch (const std::runtime_error&) {
      if (attempt == 2) throw;
    }
  }
}

// Gaussian direction shaped like the tensor.
std::vector<Matrix<LD>> random_direction(const std::vector<Matrix<LD>>& like, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> gauss(0.0, 1.0);
  std::vector<Matrix<LD>> out;
  for (const auto& m : like) {
    out.push_back(Matrix<LD>(m.rows(), m.cols()));
    for (int64_t i = 0; i < m.size(); ++i) out.back().data()[i] = gauss(rng);
  }
  return out;
}

// |fd - <grad, u>| / sum |grad_i u_i|: the error relative to the inner product's own scale.
double directional_error(LD fd, const std::vector<Matrix<double>>& grad,
                         const std::vector<Matrix<LD>>& direction) {
  LD dot = 0, scale = 0;
  for (size_t i = 0; i < grad.size(); ++i) {
    dot += (grad[i].cast<LD>().array() * direction[i].array()).sum();
    scale += (grad[i].cast<LD>().array() * direction[i].array()).abs().sum();
  }
  if (scale == 0) return static_cast<double>(std::abs(fd));
  return static_cast<double>(std::abs(fd - dot) / scale);
}

// The inputs this spec reads: q_retrieval always given (distinct from q), prior for
// shared/given rules only.
AttentionInputs<double> inputs_for(const MechanismSpec& spec, const cases::Case& c) {
  auto in = cases::make_inputs<double>(c);
  if (!(spec.needs_prior() && spec.prior_rule != PriorRule::landmark_query)) in.prior.clear();
  if (spec.needs_prior() && spec.prior_rule == PriorRule::given) {
    // One prior row per chunk: the case's shared row, varied per chunk (cos of the chunk).
    const int64_t chunks = geometry_of(spec, c.T).n_chunks();
    for (auto& prior : in.prior) {
      const Matrix<double> row = prior;
      prior.resize(chunks, c.d);
      for (int64_t ch = 0; ch < chunks; ++ch) prior.row(ch) = row * std::cos(0.7 * ch);
    }
  }
  return in;
}

// all_specs() plus a per-chunk given prior, so every prior rule's gradient path is checked.
std::vector<MechanismSpec> gradient_specs() {
  auto specs = hils::testing::all_specs();
  MechanismSpec given = preset("hils");
  given.name = "hils_given_prior";
  given.landmarks = false;
  given.prior_rule = PriorRule::given;
  specs.push_back(given);
  return specs;
}

// Small cases (the suite's time budget): landmarks on and off, GQA groups, ragged tails.
const char* const kFdCases[] = {"ragged_tail_no_landmarks", "chunk_two"};

}  // namespace

TEST_CASE("backward matches Richardson finite differences of the long double forward along "
          "random directions, every mechanism and input tensor",
          "[backward]") {
  double worst = 0;
  double worst_of[5] = {0, 0, 0, 0, 0};
  int checked_of[5] = {0, 0, 0, 0, 0};
  for (const char* name : kFdCases) {
    const auto& c = cases::case_named(name);
    const auto g = upstream(c);
    for (const auto& base : gradient_specs()) {
      auto spec = hils::testing::spec_for_case(base, c);
      if (!spec) continue;
      const auto in = inputs_for(*spec, c);
      // The long double forward's selection (it may break a near-tie differently from double):
      // the finite differences hold it, and the backward is given it.
      const auto in_ld = cast_inputs<LD>(in);
      const auto selection = run_mechanism(*spec, in_ld).selection;
      const auto grads = run_mechanism_backward(*spec, in, selection, g);
      struct { std::vector<IndexMatrix> selection; } forward{selection};
      for (int which = 0; which < 5; ++which) {
        auto& heads = tensor(const_cast<AttentionInputs<LD>&>(in_ld), which);
        if (heads.empty()) continue;
        INFO(c.name << " " << spec->name << " d" << kTensorNames[which]);
        const auto direction =
            random_direction(heads, cases::seed_of(c.name) ^ cases::seed_of(spec->name) ^ which);
        const LD fd = directional_derivative(*spec, in_ld, which, direction, g,
                                             forward.selection, 1e-3L);
        const double err = directional_error(fd, gradient(grads, which), direction);
        worst = std::max(worst, err);
        worst_of[which] = std::max(worst_of[which], err);
        ++checked_of[which];
        CHECK(err < 1e-9);
      }
    }
  }
  std::printf("backward vs Richardson finite differences (directional): worst relative %.2e\n",
              worst);
  for (int which = 0; which < 5; ++which)
    std::printf("  d%-12s %2d (case, mechanism) pairs, worst %.2e\n", kTensorNames[which],
                checked_of[which], worst_of[which]);
  // Every input tensor's gradient was checked somewhere (prior: shared and given rules).
  for (int which = 0; which < 5; ++which) CHECK(checked_of[which] > 0);
}

TEST_CASE("backward matches finite differences element by element on the smallest case",
          "[backward]") {
  // Every 11th element of dk and dq~ of hils on chunk_two, the summary path (time budget).
  const auto& c = cases::case_named("chunk_two");
  const auto g = upstream(c);
  double worst = 0;
  for (const char* preset_name : {"hils"}) {
    auto spec = hils::testing::spec_for_case(preset(preset_name), c);
    REQUIRE(spec);
    const auto in = inputs_for(*spec, c);
    const auto forward = run_mechanism(*spec, in);
    const auto grads = run_mechanism_backward(*spec, in, forward.selection, g);
    const auto in_ld = cast_inputs<LD>(in);
    for (int which : {1, 3}) {
      const auto& heads = tensor(const_cast<AttentionInputs<LD>&>(in_ld), which);
      const auto& grad = gradient(grads, which);
      double magnitude = 0;
      for (const auto& m : grad) magnitude = std::max(magnitude, m.cwiseAbs().maxCoeff());
      for (size_t h = 0; h < heads.size(); ++h)
        for (int64_t i = 0; i < heads[h].size(); i += 11) {
          std::vector<Matrix<LD>> unit;
          for (const auto& m : heads) unit.push_back(Matrix<LD>::Zero(m.rows(), m.cols()));
          unit[h].data()[i] = 1;
          const LD fd = directional_derivative(*spec, in_ld, which, unit, g, forward.selection,
                                               1e-3L);
          const double err =
              std::abs(static_cast<double>(fd) - grad[h].data()[i]) / std::max(magnitude, 1e-300);
          worst = std::max(worst, err);
          INFO(preset_name << " d" << kTensorNames[which] << "[" << h << "] element " << i);
          CHECK(err < 1e-9);
        }
    }
  }
  std::printf("backward vs finite differences (sampled elements of chunk_two): worst %.2e of the "
              "tensor's largest entry\n", worst);
}

TEST_CASE("flat and exact-hierarchical with K >= |V| have full attention's gradients",
          "[backward]") {
  for (const char* name : {"k_covers_all", "k_covers_all_no_landmarks"}) {
    const auto& c = cases::case_named(name);
    const auto g = upstream(c);
    auto full = cases::with_case_geometry(preset("full"), c);
    const auto in = cases::make_inputs<double>(c);
    const auto expected = run_mechanism_backward(full, in, {}, g);
    MechanismSpec exact_hier = preset("naive_bsa");
    exact_hier.fusion = Fusion::hierarchical;
    for (MechanismSpec base : {preset("naive_bsa"), preset("nsa"), exact_hier}) {
      auto spec = cases::with_case_geometry(base, c);
      const auto grads = run_mechanism_backward(spec, in, run_mechanism(spec, in).selection, g);
      INFO(name << " " << describe(spec));
      for (size_t h = 0; h < grads.dq.size(); ++h) {
        CHECK(hils::testing::relative_error(grads.dq[h], expected.dq[h]) < 1e-12);
        CHECK(grads.dq_retrieval[h].isZero(0));  // flat and exact never read q~
      }
      for (size_t g2 = 0; g2 < grads.dk.size(); ++g2) {
        CHECK(hils::testing::relative_error(grads.dk[g2], expected.dk[g2]) < 1e-12);
        CHECK(hils::testing::relative_error(grads.dv[g2], expected.dv[g2]) < 1e-12);
      }
    }
  }
}

TEST_CASE("the Taylor surrogate's gap L - s_hat is stationary at mu = q (zero gradient in mu "
          "and k)", "[backward]") {
  const auto& c = cases::case_named("ragged_tail");
  const Geometry geometry(c.T, c.S, c.W, c.landmarks);
  const auto in = cases::make_inputs<double>(c);
  const double scale = 0.7;
  const auto& k = in.k[0];
  const Vector<double> q = in.q[0].row(c.T - 1).transpose();
  const int64_t chunks = geometry.n_chunks(), S = c.S, tokens = geometry.tokens_per_chunk();
  const Matrix<double> prior = q.transpose().replicate(chunks, 1);  // mu_c = q for every chunk
  // d s_hat / d k' = sigma q, d s_hat / d b' = 1 for every chunk.
  const Matrix<double> dkey = (scale * q).transpose().replicate(chunks, 1);
  const Vector<double> dbias = Vector<double>::Ones(chunks);
  const auto ds_hat = summarize_backward(k, prior, KeyRule::taylor, BiasRule::entropy, geometry,
                                         scale, dkey, dbias);
  // d L / d k_j = sigma P_j q on T_c; d L / d mu = 0.
  Matrix<double> dL = Matrix<double>::Zero(k.rows(), k.cols());
  for (int64_t ch = 0; ch < chunks; ++ch) {
    Vector<double> logits = (k.middleRows(ch * S, tokens) * q) * scale;
    Vector<double> p = (logits.array() - logits.maxCoeff()).exp().matrix();
    p /= p.sum();
    dL.middleRows(ch * S, tokens) = scale * p * q.transpose();
  }
  CHECK(ds_hat.dprior.cwiseAbs().maxCoeff() < 1e-14 * q.norm() * k.cwiseAbs().maxCoeff());
  CHECK((dL - ds_hat.dk).cwiseAbs().maxCoeff() < 1e-14 * dL.cwiseAbs().maxCoeff());
  // Away from mu = q the gap is not stationary: the check can fail.
  const auto moved = summarize_backward(k, Matrix<double>(prior * 1.5), KeyRule::taylor,
                                        BiasRule::entropy, geometry, scale, dkey, dbias);
  CHECK(moved.dprior.cwiseAbs().maxCoeff() > 1e-3);
}

TEST_CASE("landmark keys and values get zero gradient unless the landmark key is the summary",
          "[backward]") {
  const auto& c = cases::case_named("gqa_group4");
  const auto g = upstream(c);
  for (const auto& base : hils::testing::all_specs()) {
    auto spec = hils::testing::spec_for_case(base, c);
    if (!spec || !spec->landmarks) continue;
    const auto in = inputs_for(*spec, c);
    const auto grads = run_mechanism_backward(*spec, in, run_mechanism(*spec, in).selection, g);
    const Geometry geometry = geometry_of(*spec, c.T);
    bool key_nonzero = false;
    for (int64_t ch = 0; ch < geometry.n_chunks(); ++ch)
      for (size_t kv = 0; kv < grads.dk.size(); ++kv) {
        const int64_t slot = geometry.landmark_slot(ch);
        INFO(spec->name << " landmark slot " << slot);
        CHECK(grads.dv[kv].row(slot).isZero(0));
        if (spec->key_rule != KeyRule::landmark_key) CHECK(grads.dk[kv].row(slot).isZero(0));
        key_nonzero |= !grads.dk[kv].row(slot).isZero(0);
      }
    if (spec->key_rule == KeyRule::landmark_key) CHECK(key_nonzero);
  }
}

TEST_CASE("backward gives the same bits for 1 and 3 threads", "[backward]") {
  const auto& c = cases::case_named("gqa_group4");  // 2 KV groups x 3 query blocks
  const auto g = upstream(c);
  for (const char* name : {"hils", "nsa", "full"}) {
    auto spec = cases::with_case_geometry(preset(name), c);
    if (std::string(name) != "hils") spec.landmarks = false;
    const auto in = cases::make_inputs<double>(c);
    const auto selection = run_mechanism(spec, in).selection;
    const int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    const auto one = run_mechanism_backward(spec, in, selection, g);
    omp_set_num_threads(3);
    const auto three = run_mechanism_backward(spec, in, selection, g);
    omp_set_num_threads(saved);
    INFO(name);
    CHECK(one.dq == three.dq);
    CHECK(one.dk == three.dk);
    CHECK(one.dv == three.dv);
    CHECK(one.dq_retrieval == three.dq_retrieval);
  }
}

TEST_CASE("backward refuses bad selections and upstream gradients naming the field",
          "[backward]") {
  const auto& c = cases::case_named("ragged_tail");
  const auto spec = cases::with_case_geometry(preset("hils"), c);
  const auto in = cases::make_inputs<double>(c);
  auto g = upstream(c);
  auto selection = run_mechanism(spec, in).selection;
  selection[0](c.T - 1, 0) = 99;
  CHECK_THROWS_WITH(run_mechanism_backward(spec, in, selection, g),
                    Catch::Contains("selection[0]"));
  selection = run_mechanism(spec, in).selection;
  g.d_o[1](3, 2) = std::numeric_limits<double>::quiet_NaN();
  CHECK_THROWS_WITH(run_mechanism_backward(spec, in, selection, g), Catch::Contains("d_o[1]"));
  g = upstream(c);
  g.d_lse.pop_back();
  CHECK_THROWS_WITH(run_mechanism_backward(spec, in, selection, g), Catch::Contains("d_lse"));
}

TEST_CASE("summarize and its backward refuse the exact rule without listing the summary rules",
          "[backward]") {
  // The refusal names the field and what it wants, not the key rules by hand: a list of them
  // went stale when a rule was added to kKeyRuleNames (README "Adding a mechanism").
  const auto& c = cases::case_named("ragged_tail");
  const auto in = cases::make_inputs<double>(c);
  const Geometry geometry(c.T, c.S, c.W, c.landmarks);
  const std::string refusal = "key_rule: expected a key rule with a summary (any but exact), got exact";
  CHECK_THROWS_WITH(summarize(in.k[0], Matrix<double>(), KeyRule::exact, BiasRule::none, geometry, 0.25),
                    refusal);
  CHECK_THROWS_WITH(summarize_backward(in.k[0], Matrix<double>(), KeyRule::exact, BiasRule::none,
                                       geometry, 0.25, Matrix<double>(), Vector<double>()),
                    refusal);
}

namespace {

using Complex = std::complex<double>;

// The summary of one chunk written independently of the library, for complex arguments:
// l_j = sigma mu.k_j, p = softmax(l), k' = sum_j p_j k_j, b' = H(p) = log sum exp(l) - sum p l.
// Returns sum_i dkey_i k'_i + dbias b' (analytic in k and mu, so the complex step applies).
Complex summary_loss(const std::vector<std::vector<Complex>>& keys, const std::vector<Complex>& mu,
                     double scale, const Vector<double>& dkey, double dbias) {
  std::vector<Complex> logit(keys.size());
  Complex total = 0;
  for (size_t j = 0; j < keys.size(); ++j) {
    Complex dot = 0;
    for (size_t i = 0; i < mu.size(); ++i) dot += mu[i] * keys[j][i];
    logit[j] = scale * dot;
    total += std::exp(logit[j]);
  }
  Complex loss = 0, mean_logit = 0;
  for (size_t j = 0; j < keys.size(); ++j) {
    const Complex p = std::exp(logit[j]) / total;
    for (size_t i = 0; i < mu.size(); ++i) loss += dkey(static_cast<int64_t>(i)) * p * keys[j][i];
    mean_logit += p * logit[j];
  }
  return loss + dbias * (std::log(total) - mean_logit);
}

}  // namespace

TEST_CASE("summary backward (Taylor pooling, entropy bias) matches complex-step derivatives of "
          "an independent forward", "[backward]") {
  // Complex step: f'(x).u = Im f(x + i h u) / h with no subtractive cancellation, so h = 1e-20
  // gives the derivative to rounding error of f itself.
  const auto& c = cases::case_named("ragged_tail");
  const Geometry geometry(c.T, c.S, c.W, c.landmarks);
  const auto in = cases::make_inputs<double>(c);
  const double scale = 0.25, h = 1e-20;
  const int64_t chunks = geometry.n_chunks(), tokens = geometry.tokens_per_chunk();
  const Matrix<double>& k = in.k[0];
  Matrix<double> prior(chunks, c.d);
  for (int64_t ch = 0; ch < chunks; ++ch) prior.row(ch) = in.q[0].row(ch * c.S + 1);
  std::mt19937_64 rng(cases::seed_of("complex step"));
  std::normal_distribution<double> gauss(0.0, 1.0);
  Matrix<double> dkey(chunks, c.d);
  Vector<double> dbias(chunks);
  for (int64_t i = 0; i < dkey.size(); ++i) dkey.data()[i] = gauss(rng);
  for (int64_t i = 0; i < dbias.size(); ++i) dbias(i) = gauss(rng);
  const auto grads =
      summarize_backward(k, prior, KeyRule::taylor, BiasRule::entropy, geometry, scale, dkey, dbias);
  double worst = 0;
  for (int direction = 0; direction < 3; ++direction) {
    Matrix<double> u(k.rows(), k.cols()), w(chunks, c.d);
    for (int64_t i = 0; i < u.size(); ++i) u.data()[i] = gauss(rng);
    for (int64_t i = 0; i < w.size(); ++i) w.data()[i] = gauss(rng);
    double complex_step = 0;
    for (int64_t ch = 0; ch < chunks; ++ch) {
      std::vector<std::vector<Complex>> keys(static_cast<size_t>(tokens),
                                             std::vector<Complex>(static_cast<size_t>(c.d)));
      std::vector<Complex> mu(static_cast<size_t>(c.d));
      for (int64_t j = 0; j < tokens; ++j)
        for (int64_t i = 0; i < c.d; ++i)
          keys[j][i] = Complex(k(ch * c.S + j, i), h * u(ch * c.S + j, i));
      for (int64_t i = 0; i < c.d; ++i) mu[i] = Complex(prior(ch, i), h * w(ch, i));
      complex_step += summary_loss(keys, mu, scale, dkey.row(ch).transpose(), dbias(ch)).imag() / h;
    }
    // Landmark slots are not summarised: their rows of u must not matter.
    double analytic = 0, magnitude = 0;
    for (int64_t ch = 0; ch < chunks; ++ch) {
      const auto rows = grads.dk.middleRows(ch * c.S, tokens).array() *
                        u.middleRows(ch * c.S, tokens).array();
      analytic += rows.sum();
      magnitude += rows.abs().sum();
    }
    analytic += (grads.dprior.array() * w.array()).sum();
    magnitude += (grads.dprior.array() * w.array()).abs().sum();
    const double err = std::abs(analytic - complex_step) / magnitude;
    worst = std::max(worst, err);
    INFO("direction " << direction << ": analytic " << analytic << ", complex step " << complex_step);
    CHECK(err < 1e-12);
  }
  for (int64_t ch = 0; ch < chunks; ++ch)
    CHECK(grads.dk.row(geometry.landmark_slot(ch)).isZero(0));
  std::printf("summary backward vs complex-step derivatives (3 directions): worst relative %.2e\n",
              worst);
}

TEST_CASE("a saved forward gives the same gradient bits, and a forward of the wrong shape is "
          "refused", "[backward]") {
  const auto& c = cases::case_named("gqa_group4");
  const auto g = upstream(c);
  RunOptions keep;
  keep.keep_window = true;
  for (const char* name : {"full", "swa", "nsa", "hils"}) {
    const auto spec = cases::with_case_geometry(preset(name), c);
    const auto in = cases::make_inputs<double>(c);
    const auto forward = run_mechanism(spec, in, keep);
    const auto recomputed = run_mechanism_backward(spec, in, forward.selection, g);
    const auto saved = run_mechanism_backward(spec, in, forward.selection, g, &forward);
    INFO(name);
    CHECK(saved.dq == recomputed.dq);
    CHECK(saved.dk == recomputed.dk);
    CHECK(saved.dv == recomputed.dv);
    CHECK(saved.dq_retrieval == recomputed.dq_retrieval);
    if (spec.selects()) {
      const auto without_window = run_mechanism(spec, in);
      CHECK_THROWS_WITH(run_mechanism_backward(spec, in, forward.selection, g, &without_window),
                        Catch::Contains("keep_window"));
    }
  }
}
