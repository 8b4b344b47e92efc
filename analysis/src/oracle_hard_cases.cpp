// The hard cases (hils/analysis/hard_cases.hpp): one row per case in kHardCases, each with its
// length rule and its construction. Lengths are counted in candidates of the last query:
// T = W + m S gives the last query tau = m complete chunks left of its window
// (reference/SEMANTICS.md §2), so the rows of one case see 0 .. m candidates.
#include "hils/analysis/hard_cases.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "hils/draws.hpp"
#include "hils/geometry.hpp"
#include "hils/memory.hpp"

namespace hils::oracle {

namespace {

struct CaseContext {
  const MechanismSpec& spec;
  const HeadShape& shape;
  InputPrecision precision;
  int64_t T;
  uint64_t seed;
};

// Lengths are capped here: far beyond what the memory check lets through, and low enough that
// rounding up to a length multiple (capped too) stays within int64 for any spec.
constexpr int64_t kLengthCap = int64_t{1} << 50;

// Slots for the last query to see m candidates (a multiple of S plus W), kLengthCap if more.
int64_t length_for_candidates(const MechanismSpec& spec, int64_t m) {
  const double T = static_cast<double>(spec.W) + static_cast<double>(m) * static_cast<double>(spec.S);
  return T >= static_cast<double>(kLengthCap) ? kLengthCap : spec.W + m * spec.S;
}

// The candidates most cases want: more than K, so that every later row cuts its top-K, and
// 2K + 2 so that the tied cases' two patterns have K + 1 copies each.
int64_t selecting_length(const MechanismSpec& spec) {
  return length_for_candidates(spec, 2 * spec.K + 2);
}

double round_to_input(double x, InputPrecision precision) {
  if (precision == InputPrecision::fp32) return static_cast<double>(static_cast<float>(x));
  return round_to_input_precision(x, precision);  // bf16, fp16: hard_cases refuses the others
}

void round_heads(std::vector<Matrix<double>>& heads, InputPrecision precision) {
  for (auto& m : heads) m = m.unaryExpr([precision](double x) { return round_to_input(x, precision); });
}

void round_inputs(AttentionInputs<double>& in, InputPrecision precision) {
  round_heads(in.q, precision);
  round_heads(in.k, precision);
  round_heads(in.v, precision);
  round_heads(in.q_retrieval, precision);
  round_heads(in.prior, precision);
}

// The next number of the precision away from zero: x (1 + 2u) for a power of two, generally
// x + sign(x) u 2^e with x = f 2^e, f in [0.5, 1), u = the unit roundoff (spacing 2u 2^(e-1)).
double one_unit_larger(double x, InputPrecision precision) {
  int e = 0;
  std::frexp(x, &e);
  const double step = unit_roundoff(precision) * std::ldexp(1.0, e);
  return round_to_input(x == 0.0 ? step : x + std::copysign(step, x), precision);
}

// Whether the spec reads a prior from the inputs (landmark_query reads q~ instead), and how many
// rows: one per head (shared), one per chunk and head (given; none before a chunk completes).
bool reads_prior(const MechanismSpec& spec) {
  return spec.needs_prior() && spec.prior_rule != PriorRule::landmark_query;
}
int64_t prior_rows(const MechanismSpec& spec, int64_t T) {
  if (!reads_prior(spec)) return 0;
  return spec.prior_rule == PriorRule::shared ? 1 : geometry_of(spec, T).n_chunks();
}

// i.i.d. N(0, 1) k, v and prior, q times `query_gain`; one stream per tensor and head.
AttentionInputs<double> gaussian_inputs(const CaseContext& c, double query_gain) {
  AttentionInputs<double> in;
  const HeadShape& s = c.shape;
  for (int64_t h = 0; h < s.Hq; ++h) {
    auto rng = draw_stream(c.seed, "q", h);
    in.q.push_back(gaussian(rng, c.T, s.d, query_gain));
  }
  for (int64_t g = 0; g < s.Hkv; ++g) {
    auto rng = draw_stream(c.seed, "k", g);
    in.k.push_back(gaussian(rng, c.T, s.d, 1.0));
  }
  for (int64_t g = 0; g < s.Hkv; ++g) {
    auto rng = draw_stream(c.seed, "v", g);
    in.v.push_back(gaussian(rng, c.T, s.dv, 1.0));
  }
  const int64_t rows = prior_rows(c.spec, c.T);
  for (int64_t h = 0; reads_prior(c.spec) && h < s.Hq; ++h) {
    auto rng = draw_stream(c.seed, "prior", h);
    in.prior.push_back(gaussian(rng, rows, s.d, query_gain));
  }
  return in;
}

// A direction per KV group with |u|^2 = d (one N(0, 1) draw scaled to that norm).
Matrix<double> group_directions(const CaseContext& c) {
  auto rng = draw_stream(c.seed, "direction", 0);
  Matrix<double> u = gaussian(rng, c.shape.Hkv, c.shape.d, 1.0);
  for (int64_t g = 0; g < u.rows(); ++g)
    u.row(g) *= std::sqrt(static_cast<double>(c.shape.d)) / u.row(g).norm();
  return u;
}

// Chunk `to` becomes an exact copy of chunk `from`: every slot's q, k, v (so its summary, its
// landmark query and its keys are the same) and its given prior rows.
void copy_chunk(AttentionInputs<double>& in, int64_t S, int64_t from, int64_t to) {
  auto copy_rows = [&](std::vector<Matrix<double>>& heads) {
    for (auto& m : heads) m.middleRows(to * S, S) = m.middleRows(from * S, S).eval();
  };
  copy_rows(in.q);
  copy_rows(in.k);
  copy_rows(in.v);
  for (auto& p : in.prior)
    if (p.rows() > 1) p.row(to) = p.row(from).eval();
}

// Chunks 2, 3, ... copies of chunk 0 and chunk 1 in turn: a row of m candidates has two tie
// groups of about m/2 chunks, so its top-K cut runs through one of them whenever m > K.
void tie_chunks(const CaseContext& c, AttentionInputs<double>& in) {
  const int64_t n_chunks = geometry_of(c.spec, c.T).n_chunks();
  for (int64_t chunk = 2; chunk < n_chunks; ++chunk) copy_chunk(in, c.spec.S, chunk % 2, chunk);
}

// --- the constructions ---

void build_gaussian(const CaseContext& c, AttentionInputs<double>& in) { in = gaussian_inputs(c, 1.0); }

void build_tied(const CaseContext& c, AttentionInputs<double>& in) {
  in = gaussian_inputs(c, 1.0);
  round_inputs(in, c.precision);
  tie_chunks(c, in);
}

// Each copy c >= 2 has one key entry one unit larger in the precision (row c mod its tokens,
// column c mod d): the tie groups split into scores that differ in their last bits.
void build_near_tied(const CaseContext& c, AttentionInputs<double>& in) {
  build_tied(c, in);
  const Geometry geometry = geometry_of(c.spec, c.T);
  const int64_t tokens = geometry.tokens_per_chunk();
  for (int64_t chunk = 2; chunk < geometry.n_chunks(); ++chunk)
    for (auto& k : in.k) {
      double& entry = k(chunk * c.spec.S + chunk % tokens, chunk % c.shape.d);
      entry = one_unit_larger(entry, c.precision);
    }
}

// Every third slot's query is zero in every head: its logits are all exactly 0.
void build_zero_queries(const CaseContext& c, AttentionInputs<double>& in) {
  in = gaussian_inputs(c, 1.0);
  for (auto& q : in.q)
    for (int64_t t = 2; t < c.T; t += 3) q.row(t).setZero();
}

// Logits ~ N(0, 40^2) (sigma = 1/sqrt(d)): maxima near 150, one key dominates every softmax.
void build_large_logits(const CaseContext& c, AttentionInputs<double>& in) {
  in = gaussian_inputs(c, 40.0);
}

// q = -a u + e, k = a u + e' with a chosen so that sigma a^2 d = 150: every logit is near -150.
void build_negative_logits(const CaseContext& c, AttentionInputs<double>& in) {
  in = gaussian_inputs(c, 1.0);
  const Matrix<double> u = group_directions(c);
  const double sigma = logit_scale(c.spec, c.shape.d);
  const double a = std::sqrt(150.0 / (sigma * static_cast<double>(c.shape.d)));
  const int64_t G = c.shape.Hq / c.shape.Hkv;
  for (int64_t g = 0; g < c.shape.Hkv; ++g) {
    in.k[g].rowwise() += a * u.row(g);
    for (int64_t h = g * G; h < (g + 1) * G; ++h) in.q[h].rowwise() -= a * u.row(g);
  }
  for (int64_t h = 0; h < static_cast<int64_t>(in.prior.size()); ++h) in.prior[h].rowwise() -= a * u.row(h / G);
}

// Logits ~ N(0, 1/64^2): every softmax nearly uniform.
void build_flat_logits(const CaseContext& c, AttentionInputs<double>& in) {
  in = gaussian_inputs(c, 1.0 / 64.0);
}

// Every query shares a direction u with chunk 0's keys, sigma a d = 8 above the other keys.
void build_dominant_chunk(const CaseContext& c, AttentionInputs<double>& in) {
  in = gaussian_inputs(c, 1.0);
  const Matrix<double> u = group_directions(c);
  const double sigma = logit_scale(c.spec, c.shape.d);
  const double a = 8.0 / (sigma * static_cast<double>(c.shape.d));
  const int64_t G = c.shape.Hq / c.shape.Hkv;
  for (int64_t g = 0; g < c.shape.Hkv; ++g) {
    in.k[g].topRows(c.spec.S).rowwise() += a * u.row(g);
    for (int64_t h = g * G; h < (g + 1) * G; ++h) in.q[h].rowwise() += u.row(g);
  }
}

// --- the table ---

using Applies = std::string (*)(const MechanismSpec&, const HeadShape&);
using Keeps = bool (*)(const MechanismSpec&, int64_t T);

std::string always(const MechanismSpec&, const HeadShape&) { return {}; }
std::string if_selecting(const MechanismSpec& spec, const HeadShape&) {
  if (spec.selects()) return {};
  return "the spec selects no chunks (fusion " + to_string(spec.fusion) + ")";
}
std::string if_cut(const MechanismSpec& spec, const HeadShape& shape) {
  if (std::string reason = if_selecting(spec, shape); !reason.empty()) return reason;
  if (spec.K < 1) return "K = 0 selects no chunks, so there is no top-K cut";
  return {};
}
bool any_length(const MechanismSpec&, int64_t) { return true; }
bool one_slot(const MechanismSpec&, int64_t T) { return T == 1; }
bool below_chunk(const MechanismSpec& spec, int64_t T) { return T < spec.S; }
bool partial_chunk(const MechanismSpec& spec, int64_t T) { return T % spec.S != 0; }

struct CaseRow {
  const char* name;
  const char* catches;
  Applies applies;        // "" or why the case means nothing for this spec and shape
  int64_t (*length)(const MechanismSpec&);
  Keeps keeps;            // whether a length (rounded up to length_multiple) keeps the point
  const char* point;      // that point, for the skip reason
  void (*build)(const CaseContext&, AttentionInputs<double>&);
  const char* draw_of = nullptr;  // the case whose random draw this one shares (nullptr: its own)
};

const CaseRow kHardCases[] = {
    {"gaussian",
     "i.i.d. N(0, 1) inputs, rows with 0 to 2K + 2 candidates: the baseline the other cases vary",
     always, selecting_length, any_length, "", build_gaussian},
    {"single_slot", "T = 1: one query, one key, no chunk (a kernel that assumes a full tile)",
     always, [](const MechanismSpec&) -> int64_t { return 1; }, one_slot, "T = 1", build_gaussian},
    {"shorter_than_chunk",
     "T = S - 1: no complete chunk, so the selection is all -1 and o is the window's",
     always, [](const MechanismSpec& s) { return std::max<int64_t>(1, s.S - 1); }, below_chunk,
     "T < S", build_gaussian},
    {"candidate_counts",
     "T = W + (K+1) S: rows with 0, 1, ..., K + 1 candidates (-1 padding below K, one chunk dropped "
     "at K + 1) and the window's left edge moving every S slots",
     if_selecting, [](const MechanismSpec& s) { return length_for_candidates(s, s.K + 1); },
     any_length, "", build_gaussian},
    {"ragged_tail",
     "a trailing partial chunk (no landmark, never a candidate): a read past T, or the partial chunk "
     "treated as complete",
     always,
     [](const MechanismSpec& s) { return length_for_candidates(s, s.K + 1) + s.S / 2 + 1; },
     partial_chunk, "T not a multiple of S", build_gaussian},
    {"tied_chunks",
     "chunks 2, 3, ... exact copies of chunks 0 and 1 in turn, so that every top-K cut runs through "
     "a tie: a selection of more or fewer than K chunks, a repeated index, or o from other chunks "
     "than the selection",
     if_cut, selecting_length, any_length, "", build_tied},
    {"near_tied_chunks",
     "the tied chunks with one key entry per copy one unit larger: scores that differ in their last "
     "bits, which a correct kernel may order either way",
     if_cut, selecting_length, any_length, "", build_near_tied, "tied_chunks"},
    {"zero_queries",
     "every third query zero, as padding rows are: all its logits exactly 0 and every chunk tied "
     "(a division by the query's norm gives NaN; a top-K must still choose K distinct chunks)",
     always, selecting_length, any_length, "", build_zero_queries},
    {"large_logits",
     "logits ~ N(0, 40^2), maxima near 150: exp without the running maximum overflows fp32, and "
     "every softmax is one-hot",
     always, selecting_length, any_length, "", build_large_logits},
    {"negative_logits",
     "every logit near -150: a running maximum started at 0 (or any finite floor) underflows every "
     "exp to 0 and divides by 0",
     always, selecting_length, any_length, "", build_negative_logits},
    {"flat_logits",
     "logits ~ N(0, 1/64^2): nearly uniform softmaxes over thousands of keys (sums kept in low "
     "precision) and near-tied chunk scores everywhere",
     always, selecting_length, any_length, "", build_flat_logits},
    {"dominant_chunk",
     "every query's strongest chunk is chunk 0, the farthest: an off-by-one in the candidates 0 .. "
     "tau(t) - 1 or in a chunk's first slot moves o far",
     if_cut, selecting_length, any_length, "", build_dominant_chunk},
    {"many_candidates",
     "up to max(2K + 2, 300) candidates per row, more than one 256-chunk selection tile: the merge "
     "of per-tile top-K lists",
     if_cut, [](const MechanismSpec& s) { return length_for_candidates(s, std::max<int64_t>(2 * s.K + 2, 300)); },
     any_length, "", build_gaussian},
};

// The smallest T >= base that is a multiple of `multiple` and keeps the case's point; 0 if none.
// Two multiples suffice: the points are T = 1, T < S (only the first can hold) and T % S != 0
// (if S does not divide `multiple`, one of two consecutive multiples has it).
int64_t case_length(const CaseRow& row, const MechanismSpec& spec, int64_t multiple) {
  const int64_t base = std::min(row.length(spec), kLengthCap);
  int64_t T = (base + multiple - 1) / multiple * multiple;
  for (int step = 0; step < 2; ++step, T += multiple)
    if (row.keeps(spec, T)) return T;
  return 0;
}

uint64_t case_seed(const CaseRow& row, const MechanismSpec& spec, const HeadShape& shape, int64_t T) {
  uint64_t seed = name_hash(row.draw_of ? row.draw_of : row.name);
  for (int64_t value : {T, spec.S, spec.W, spec.K, shape.Hq, shape.Hkv, shape.d, shape.dv})
    seed = (seed ^ static_cast<uint64_t>(value)) * 1099511628211ull;
  return seed;
}

void check_options(const HeadShape& shape, const HardCaseOptions& options) {
  auto positive = [](int64_t value, const char* field) {
    if (value < 1)
      throw InvalidArgument(std::string(field) + ": expected an integer >= 1, got " +
                            std::to_string(value));
  };
  positive(shape.Hq, "Hq");
  positive(shape.Hkv, "Hkv");
  positive(shape.d, "d");
  positive(shape.dv, "dv");
  if (shape.Hq % shape.Hkv != 0)
    throw InvalidArgument("Hq: expected a multiple of Hkv = " + std::to_string(shape.Hkv) +
                          ", got " + std::to_string(shape.Hq));
  if (!precision_row(options.precision).input)
    throw InvalidArgument("precision: expected an input precision (" + input_precision_list() +
                          "), got " + to_string(options.precision));
  positive(options.length_multiple, "length_multiple");
  if (options.length_multiple > kLengthCap)
    throw InvalidArgument("length_multiple: expected at most 2^50, got " +
                          std::to_string(options.length_multiple));
  if (options.max_T < 0)
    throw InvalidArgument("max_T: expected 0 (no limit) or a length >= 1, got " +
                          std::to_string(options.max_T));
}

// Bytes of one case's inputs in double.
double input_bytes(const MechanismSpec& spec, const HeadShape& shape, int64_t T) {
  const double values = static_cast<double>(T) *
                            static_cast<double>(shape.Hq * shape.d + shape.Hkv * (shape.d + shape.dv)) +
                        static_cast<double>(prior_rows(spec, T) * shape.Hq * shape.d);
  return 8.0 * values;
}

}  // namespace

std::vector<std::string> hard_case_names() {
  std::vector<std::string> names;
  for (const CaseRow& row : kHardCases) names.emplace_back(row.name);
  return names;
}

HardCases hard_cases(const MechanismSpec& spec, const HeadShape& shape, const HardCaseOptions& options) {
  spec.validate();
  check_options(shape, options);
  struct Planned {
    const CaseRow* row;
    int64_t T;
  };
  HardCases result;
  std::vector<Planned> planned;
  double bytes = 0;
  for (const CaseRow& row : kHardCases) {
    if (std::string reason = row.applies(spec, shape); !reason.empty()) {
      result.skipped.push_back({row.name, reason});
      continue;
    }
    const int64_t T = case_length(row, spec, options.length_multiple);
    if (T == 0) {
      result.skipped.push_back({row.name, std::string("needs ") + row.point + ", which no multiple of " +
                                              std::to_string(options.length_multiple) + " is"});
      continue;
    }
    if (options.max_T > 0 && T > options.max_T) {
      const std::string length = T >= kLengthCap ? "T beyond 2^50" : "T = " + std::to_string(T);
      result.skipped.push_back({row.name, "needs " + length + " > max_T = " + std::to_string(options.max_T)});
      continue;
    }
    planned.push_back({&row, T});
    bytes += input_bytes(spec, shape, T);
  }
  const MemoryLimit limit = memory_limit();
  if (bytes > 0.8 * limit.bytes)
    throw InvalidArgument("hard cases: their inputs need " + bytes_text(bytes) + " in double, more than 80% of " +
                          limit.text + "; expected fewer heads, smaller d or dv, or a max_T");
  for (const Planned& p : planned) {
    const CaseContext context{spec, shape, options.precision, p.T, case_seed(*p.row, spec, shape, p.T)};
    HardCase item{p.row->name, p.row->catches, {}};
    p.row->build(context, item.inputs);
    round_inputs(item.inputs, options.precision);
    item.inputs.validate(spec);
    result.cases.push_back(std::move(item));
  }
  return result;
}

}  // namespace hils::oracle
