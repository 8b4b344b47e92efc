// hils._core: the reference and the oracle for Python (issue 9). The pure-Python package `hils`
// (python/hils) wraps these functions; users call hils.verify, hils.reference and
// hils.testing.assert_kernel_matches. Every computation runs the same C++ code as `hils
// verify`: the spec codec, the reference and oracle::verify with its report text.
#include <algorithm>
#include <atomic>
#include <csignal>
#include <exception>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>
#include <pybind11/stl.h>

#include "arrays.hpp"
#include "config/spec_codec.hpp"
#include "hils/analysis/hard_cases.hpp"
#include "hils/analysis/oracle.hpp"
#include "hils/hils.hpp"
#include "hils/memory.hpp"
#include "hils/threads.hpp"

namespace hils::python {

namespace {

// Ctrl-C during a long call: the C++ work runs without the GIL, so Python's own SIGINT handler
// only notes the signal and KeyboardInterrupt would come when the call returns (minutes at
// large T). While a Work lives on the main thread, with Python's default SIGINT handler in
// place, a SIGINT sets g_interrupt instead (one lock-free store), which the reference reads
// before each query block (hils::StopScope): the call ends with hils::Stopped, which the module
// turns into KeyboardInterrupt. A SIGINT after the work is handed back to Python. Elsewhere (a
// thread, a handler of the caller's own) it is only the GIL released, as before.
std::atomic<int> g_interrupt{0};

void on_interrupt(int signal_number) { g_interrupt.store(signal_number); }

// Whether Ctrl-C may stop the call: the main thread, and SIGINT is Python's default handler.
bool interruptible() {
  const py::module_ threading = py::module_::import("threading");
  const py::module_ signal = py::module_::import("signal");
  return threading.attr("current_thread")().is(threading.attr("main_thread")()) &&
         signal.attr("getsignal")(signal.attr("SIGINT")).is(signal.attr("default_int_handler"));
}

class Work {
 public:
  Work() : interruptible_(interruptible()) {
    if (interruptible_) {
      g_interrupt.store(0);
      struct sigaction action {};
      action.sa_handler = on_interrupt;
      sigemptyset(&action.sa_mask);
      ::sigaction(SIGINT, &action, &python_handler_);
      stop_.emplace(&g_interrupt);
    }
    release_.emplace();
  }
  ~Work() {
    release_.reset();  // the GIL again
    if (!interruptible_) return;
    stop_.reset();
    ::sigaction(SIGINT, &python_handler_, nullptr);
    // A SIGINT that stopped nothing (it came after the last query block) goes to Python; one
    // that stopped the work leaves as hils::Stopped, KeyboardInterrupt by the module's translator.
    if (g_interrupt.load() != 0 && std::uncaught_exceptions() == 0) PyErr_SetInterrupt();
  }
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;

 private:
  bool interruptible_;
  struct sigaction python_handler_ {};
  std::optional<StopScope> stop_;
  std::optional<py::gil_scoped_release> release_;
};

// A verdict and the kernel name it was given (for repr and the caller's messages).
struct Report {
  oracle::Verdict verdict;
  std::string kernel;
};

// spec JSON text (what json.dumps made of the caller's dict) -> validated spec, through the
// same codec as the verify file's spec attribute.
MechanismSpec spec_from_text(const std::string& text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgument(std::string("spec: expected a JSON object, found invalid JSON (") +
                          e.what() + ")");
  }
  MechanismSpec spec = config::spec_from_json(j, "spec");
  spec.validate();
  return spec;
}

// The item `key` of a dict, or None.
py::object item_or_none(const py::dict& d, const char* key) {
  return d.contains(key) ? py::reinterpret_borrow<py::object>(d[key]) : py::none();
}

// Size of axis `axis` of an array already checked by heads_from_array.
int64_t axis_size(const py::object& array, py::ssize_t axis) {
  return static_cast<int64_t>(py::reinterpret_borrow<py::array>(array).shape(axis));
}

// "q, shape [4, 512, 32] read as [Hq, T, d]": where the other inputs' T and d come from, so that
// a q in another layout ([T, Hq, d]) is recognised in their messages, not taken for a wrong k.
std::string q_shape_text(const py::object& q) {
  const auto a = py::reinterpret_borrow<py::array>(q);
  std::string dims;
  for (py::ssize_t i = 0; i < a.ndim(); ++i) dims += (i ? ", " : "") + std::to_string(a.shape(i));
  return "from q, shape [" + dims + "] read as [Hq, T, d]";
}

// {"q", "k", "v", "q_retrieval"?, "prior"?} -> inputs, checked as the CLI checks /inputs.
AttentionInputs<double> inputs_from_dict(const py::dict& arrays) {
  AttentionInputs<double> in;
  const py::object q = item_or_none(arrays, "q");
  in.q = heads_from_array("q", q, {{-1, -1, -1}, "(heads, rows, columns)"}, true);
  const int64_t Hq = axis_size(q, 0), T = axis_size(q, 1), d = axis_size(q, 2);
  const std::string from_q = q_shape_text(q);
  const py::object k = item_or_none(arrays, "k");
  in.k = heads_from_array("k", k, {{-1, T, d}, "(KV heads, T, d; T = " + std::to_string(T) +
                                                   " and d = " + std::to_string(d) + " " + from_q + ")"},
                          true);
  in.v = heads_from_array("v", item_or_none(arrays, "v"),
                          {{axis_size(k, 0), T, -1},
                           "(KV heads, T, dv; KV heads = " + std::to_string(axis_size(k, 0)) +
                               " from k, T = " + std::to_string(T) + " " + from_q + ")"},
                          true);
  const py::object q_retrieval = item_or_none(arrays, "q_retrieval");
  if (!q_retrieval.is_none())
    in.q_retrieval = heads_from_array("q_retrieval", q_retrieval,
                                      {{Hq, T, d}, "(Hq, T, d " + from_q + ")"}, true);
  const py::object prior = item_or_none(arrays, "prior");
  if (!prior.is_none())
    in.prior = heads_from_array("prior", prior,
                                {{Hq, -1, d}, "(Hq, rows, d; Hq = " + std::to_string(Hq) + " and d = " +
                                                  std::to_string(d) + " " + from_q + ")"},
                                true);
  return in;
}

// The oracle's copies of a problem's inputs: its context keeps them in float64 and float32 (12
// bytes a value: oracle_context.hpp's inputs and inputs_float) and, while it is built, the
// float64 copy inputs_from_dict made is alive too (8 more). A batch's B oracles are all kept, the
// last one's build on top (12 B + 8 bytes a value of one sequence): each sequence's share of
// memory_limit() (SequencesAtOnce) is checked against 12 + 8 / B. Refused before anything is
// converted, naming the largest input: beyond it the call ended in std::bad_alloc (MemoryError)
// after the conversions and part of the reference, or in an out-of-memory kill without a ulimit
// (a decode step of hils.verify_decode holds q [Hq, T, d] for its one query: audit23).
void require_oracle_inputs_fit(const py::dict& arrays, int sequences) {
  const char* names[] = {"q", "k", "v", "q_retrieval", "prior"};
  double values = 0, largest = -1;
  std::string name, parts;
  for (const char* key : names) {
    const py::object a = item_or_none(arrays, key);
    if (a.is_none() || !py::isinstance<py::array>(a)) continue;  // the conversion names it
    const auto array = py::reinterpret_borrow<py::array>(a);
    const double n = static_cast<double>(array.size());
    values += n;
    if (n > largest) largest = n, name = key;
    std::string dims;
    for (py::ssize_t i = 0; i < array.ndim(); ++i) dims += (i ? ", " : "") + std::to_string(array.shape(i));
    parts += std::string(parts.empty() ? "" : ", ") + key + " [" + dims + "]";
  }
  const double bytes = values * (12.0 + 8.0 / sequences);
  const MemoryLimit memory = memory_limit();
  if (name.empty() || bytes < 0.8 * memory.bytes) return;
  throw py::value_error(
      name + ": expected inputs whose copies in the oracle (float64 and float32 of every value, "
             "and float64 again while it is built) fit in 80% of " + memory.text + ", found " +
      parts + ": " + bytes_text(bytes) + " (fewer or shorter sequences per call)");
}

// "outputs: unknown key 'x' (expected one of ...)", the codec's words for a typo.
void require_known_outputs(const py::dict& outputs) {
  for (const auto& item : outputs) {
    if (!py::isinstance<py::str>(item.first))
      throw py::type_error("outputs: expected string keys, found " +
                           py::repr(item.first).cast<std::string>());
    const std::string key = item.first.cast<std::string>();
    bool known = false;
    for (const auto& name : oracle::output_names()) known = known || name == key;
    if (!known) {
      std::string list;
      for (const auto& name : oracle::output_names()) list += (list.empty() ? "" : ", ") + name;
      throw InvalidArgument("outputs: unknown key '" + key + "' (expected one of " + list + ")");
    }
  }
}

// {name: array or None} -> the kernel's stages; a None or missing name was not produced.
oracle::KernelOutputs outputs_from_dict(const py::dict& outputs) {
  require_known_outputs(outputs);
  oracle::KernelOutputs out;
  const ArrayShape heads{{-1, -1, -1}, "(heads, rows, columns)"}, vectors{{-1, -1}, "(heads, rows)"};
  auto name = [](const char* key) { return std::string("outputs[\"") + key + "\"]"; };
  auto read = [&](const char* key, const py::object& a, auto& target) {
    using Field = std::decay_t<decltype(target)>;
    if constexpr (std::is_same_v<Field, std::vector<Matrix<double>>>)
      target = heads_from_array(name(key), a, heads, false);
    else if constexpr (std::is_same_v<Field, std::vector<Vector<double>>>)
      target = vectors_from_array(name(key), a, vectors, false);
    else {
      static_assert(std::is_same_v<Field, std::vector<IndexMatrix>>, "a reader for this output");
      target = selection_from_array(name(key), a);
    }
  };
  // oracle::kOutputTensors, in its order.
  oracle::for_each_output(out, [&](const auto& row, auto& target) {
    const py::object a = item_or_none(outputs, row.name);
    if (!a.is_none()) read(row.name, a, target);
  });
  return out;
}

// The gradient names of the verify file's /grads (data/verify_format.md "Gradients").
const std::vector<std::string>& gradient_names() {
  static const std::vector<std::string> names = {"dq", "dk", "dv", "dq_retrieval", "dprior"};
  return names;
}

// do, dlse (None or arrays) and {name: array or None} of gradients -> the kernel's backward.
oracle::KernelGradients gradients_from(const py::object& d_o, const py::object& d_lse,
                                       const py::dict& grads) {
  oracle::KernelGradients out;
  const ArrayShape heads{{-1, -1, -1}, "(heads, rows, columns)"}, vectors{{-1, -1}, "(heads, rows)"};
  if (!d_o.is_none()) out.d_o = heads_from_array("do", d_o, heads, true);
  if (!d_lse.is_none()) out.d_lse = vectors_from_array("dlse", d_lse, vectors, true);
  std::vector<Matrix<double>>* targets[] = {&out.dq, &out.dk, &out.dv, &out.dq_retrieval,
                                            &out.dprior};
  for (const auto& item : grads) {
    const std::string key = py::str(item.first).cast<std::string>();
    const auto& names = gradient_names();
    const auto it = std::find(names.begin(), names.end(), key);
    if (it == names.end())
      throw InvalidArgument("grads: unknown key '" + key +
                            "' (expected one of dq, dk, dv, dq_retrieval, dprior)");
    if (!item.second.is_none())
      *targets[it - names.begin()] =
          heads_from_array("grads[\"" + key + "\"]", item.second, heads, false);
  }
  return out;
}

std::vector<int64_t> queries_from(const py::object& queries) {
  return queries.is_none() ? std::vector<int64_t>{} : int64s_from_array("queries", queries);
}

// A batch's B (hils/layouts.py: one oracle or reference per sequence, all held until the
// call returns) -> the memory share of each (hils/memory.hpp, SequencesAtOnce).
int sequences_at_once(int64_t sequences) {
  return static_cast<int>(std::clamp<int64_t>(sequences, 1, std::numeric_limits<int>::max()));
}

// A kernel's arrays converted and checked (names, dtypes, do/dlse values) for the oracle. hils.verify
// builds it before the reference runs, so that a bad output is reported at once, not after it.
struct KernelArrays {
  KernelArrays(const py::dict& outputs, const py::object& d_o, const py::object& d_lse,
               const py::dict& grads)
      : kernel(outputs_from_dict(outputs)) {
    kernel.gradients = gradients_from(d_o, d_lse, grads);
  }
  oracle::KernelOutputs kernel;
};

// hils.Verifier's engine (hils.verify builds one and calls it once): the reference runs when it
// is built, each verify() judges one kernel's arrays. Arrays are converted while the GIL is
// held, the oracle runs without it.
class Verifier {
 public:
  Verifier(const std::string& spec_text, const py::dict& inputs, const std::string& input_precision,
           const std::string& score_precision, const std::string& bf16_rounding,
           const py::object& queries, int64_t max_messages, int64_t sequences) {
    const SequencesAtOnce share(sequences_at_once(sequences));  // a batch's oracles, all kept
    const MechanismSpec spec = spec_from_text(spec_text);
    oracle::VerifyOptions options;
    options.precision = oracle::parse_input_precision(input_precision, "input_precision");
    options.score_precision = oracle::parse_score_precision(score_precision, "score_precision");
    options.bf16_rounding = oracle::parse_bf16_rounding(bf16_rounding, "bf16_rounding");
    require(max_messages >= 1, "max_messages", "at least 1", std::to_string(max_messages));
    options.max_messages = max_messages;
    options.queries = queries_from(queries);
    require_oracle_inputs_fit(inputs, sequences_at_once(sequences));
    const AttentionInputs<double> in = inputs_from_dict(inputs);
    const Work work;  // without the GIL; Ctrl-C stops it
    verifier_ = std::make_unique<oracle::Verifier>(spec, in, options);
  }

  Report verify(const KernelArrays& arrays, const std::string& kernel) const {
    Report report;
    report.kernel = kernel;
    const Work work;  // without the GIL; Ctrl-C stops it
    report.verdict = verifier_->verify(arrays.kernel);
    return report;
  }

 private:
  std::unique_ptr<const oracle::Verifier> verifier_;
};

// Everything hils.reference returns, computed without the GIL.
struct ReferenceRun {
  MechanismOutputs<double> run;
  std::vector<Matrix<double>> summary_key;
  std::vector<Vector<double>> summary_bias;
};

// The chunk summaries k'_c, b'_c of every query head (reference/SEMANTICS.md §3), for mechanisms
// that have them.
void add_summaries(const MechanismSpec& spec, const AttentionInputs<double>& in, ReferenceRun& r) {
  if (!spec.selects() || spec.key_rule == KeyRule::exact) return;
  const Geometry geometry = geometry_of(spec, in.T());
  const double scale = logit_scale(spec, in.d());
  const int64_t G = in.Hq() / in.Hkv();
  for (int64_t h = 0; h < in.Hq(); ++h) {
    const Matrix<double> prior =
        spec.needs_prior() ? resolve_prior(in, h, spec, geometry) : Matrix<double>();
    const auto s = summarize(in.k[h / G], prior, spec.key_rule, spec.bias_rule, geometry, scale);
    r.summary_key.push_back(s.key);
    r.summary_bias.push_back(s.bias);
  }
}

// hils.hard_cases' engine: the table's cases for a spec and head shape -> ([{"name", "catches",
// "q", "k", "v", "prior"?}, ...], [(name, reason), ...]); arrays float64 [heads, T, columns].
py::tuple hard_cases(const std::string& spec_text, int64_t Hq, int64_t Hkv, int64_t d, int64_t dv,
                     const std::string& precision, int64_t length_multiple, int64_t max_T) {
  const MechanismSpec spec = spec_from_text(spec_text);
  oracle::HardCaseOptions options;
  options.precision = oracle::parse_input_precision(precision, "precision");
  options.length_multiple = length_multiple;
  options.max_T = max_T;
  const oracle::HardCases built = oracle::hard_cases(spec, {Hq, Hkv, d, dv}, options);  // ms
  py::list cases;
  for (const auto& c : built.cases) {
    py::dict item;
    item["name"] = c.name;
    item["catches"] = c.catches;
    item["q"] = array_from_heads(c.inputs.q);
    item["k"] = array_from_heads(c.inputs.k);
    item["v"] = array_from_heads(c.inputs.v);
    if (!c.inputs.prior.empty()) item["prior"] = array_from_heads(c.inputs.prior);
    cases.append(item);
  }
  py::list skipped;
  for (const auto& s : built.skipped) skipped.append(py::make_tuple(s.name, s.reason));
  return py::make_tuple(cases, skipped);
}

// hils.reference's engine: the double reference run -> dict of float64 (selection: int64) arrays.
py::dict reference(const std::string& spec_text, const py::dict& inputs, const py::object& queries,
                   int64_t sequences) {
  const SequencesAtOnce share(sequences_at_once(sequences));  // a batch's references, all kept
  const MechanismSpec spec = spec_from_text(spec_text);
  const AttentionInputs<double> in = inputs_from_dict(inputs);
  RunOptions options;
  options.keep_surrogate_scores = spec.selects();
  options.keep_window = spec.fusion != Fusion::full;
  options.queries = queries_from(queries);
  ReferenceRun r;
  {
    const Work work;  // without the GIL; Ctrl-C stops it
    in.validate(spec);
    r.run = run_mechanism(spec, in, options);
    add_summaries(spec, in, r);
  }
  auto heads = [&](auto field) {
    std::vector<Matrix<double>> m;
    for (const auto& h : r.run.heads) m.push_back(h.*field);
    return m;
  };
  auto vectors = [&](auto field) {
    std::vector<Vector<double>> m;
    for (const auto& h : r.run.heads) m.push_back(h.*field);
    return m;
  };
  using H = HeadOutputs<double>;
  py::dict result;
  result["o"] = array_from_heads(heads(&H::o));
  result["lse"] = array_from_vectors(vectors(&H::lse));
  result["fusion_weights"] = array_from_heads(heads(&H::fusion_weights));
  if (spec.selects()) {
    result["selection"] = array_from_selection(r.run.selection);
    result["surrogate_scores"] = array_from_heads(heads(&H::surrogate_scores));
  }
  if (options.keep_window) {
    result["o_window"] = array_from_heads(heads(&H::o_window));
    result["lse_window"] = array_from_vectors(vectors(&H::lse_window));
  }
  if (!r.summary_key.empty()) {
    result["summary_key"] = array_from_heads(r.summary_key);
    result["summary_bias"] = array_from_vectors(r.summary_bias);
  }
  return result;
}

const char* verdict_text(bool passed) { return passed ? "PASS" : "FAIL"; }

}  // namespace

}  // namespace hils::python

PYBIND11_MODULE(_core, m) {
  using namespace hils;
  using namespace hils::python;
  m.doc() = "hils-sim's reference and oracle (C++); use the package hils, not this module.";
  // A call stopped by Ctrl-C (Work): KeyboardInterrupt, as Python's own Ctrl-C.
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Stopped&) {
      PyErr_SetNone(PyExc_KeyboardInterrupt);
    }
  });

  py::class_<oracle::TensorReport>(m, "TensorReport",
                                   "The comparison of one tensor, all heads together.")
      .def_readonly("name", &oracle::TensorReport::name)
      .def_readonly("passed", &oracle::TensorReport::passed)
      .def_property_readonly("verdict", [](const oracle::TensorReport& t) { return verdict_text(t.passed); })
      .def_property_readonly("precision", [](const oracle::TensorReport& t) { return to_string(t.precision); },
                             "the rounding unit of the floor: an input or score precision's name (fp32, bf16, ...)")
      .def_readonly("count", &oracle::TensorReport::count, "elements compared")
      .def_readonly("max_abs", &oracle::TensorReport::max_abs, "max |kernel - double|")
      .def_readonly("max_rel", &oracle::TensorReport::max_rel)
      .def_readonly("nmse", &oracle::TensorReport::nmse)
      .def_readonly("worst_where", &oracle::TensorReport::worst_where)
      .def_readonly("worst_kernel", &oracle::TensorReport::worst_kernel)
      .def_readonly("worst_truth", &oracle::TensorReport::worst_truth)
      .def_readonly("baseline_max_abs", &oracle::TensorReport::baseline_max_abs,
                    "max |float reference - double| (the report's float_err)")
      .def_readonly("floor", &oracle::TensorReport::floor)
      .def_readonly("magnitude", &oracle::TensorReport::magnitude)
      .def_readonly("tolerance", &oracle::TensorReport::tolerance)
      .def_readonly("headroom", &oracle::TensorReport::headroom, "max_abs / tolerance; > 1 fails")
      .def_readonly("problems", &oracle::TensorReport::problems)
      .def_readonly("diagnosis", &oracle::TensorReport::diagnosis)
      .def("__repr__", [](const oracle::TensorReport& t) {
        return "<hils.TensorReport " + t.name + " " + verdict_text(t.passed) +
               " headroom=" + std::to_string(t.headroom) + ">";
      });

  py::class_<oracle::SelectionReport>(m, "SelectionReport",
                                      "The comparison of the selections as sets per (query, KV group).")
      .def_readonly("compared", &oracle::SelectionReport::compared)
      .def_readonly("passed", &oracle::SelectionReport::passed)
      .def_readonly("rows", &oracle::SelectionReport::rows)
      .def_readonly("rows_differing", &oracle::SelectionReport::rows_differing)
      .def_readonly("rows_accepted", &oracle::SelectionReport::rows_accepted)
      .def_readonly("bound", &oracle::SelectionReport::bound, "largest per-swap margin bound used")
      .def_readonly("baseline_r_error", &oracle::SelectionReport::baseline_r_error)
      .def_readonly("max_accepted_margin", &oracle::SelectionReport::max_accepted_margin)
      .def_readonly("worst_margin", &oracle::SelectionReport::worst_margin)
      .def_readonly("problems", &oracle::SelectionReport::problems)
      .def("__repr__", [](const oracle::SelectionReport& s) {
        return "<hils.SelectionReport " + std::string(s.compared ? verdict_text(s.passed) : "not compared") +
               " rows=" + std::to_string(s.rows) + " differing=" + std::to_string(s.rows_differing) +
               " accepted=" + std::to_string(s.rows_accepted) + ">";
      });

  py::class_<Report>(m, "Report", "The oracle's verdict; str() is the text `hils verify` prints.")
      .def_property_readonly("passed", [](const Report& r) { return r.verdict.passed; })
      .def_readonly("kernel", &Report::kernel)
      .def_property_readonly("spec", [](const Report& r) { return r.verdict.spec_description; })
      .def_property_readonly("input_precision", [](const Report& r) { return to_string(r.verdict.precision); })
      .def_property_readonly("score_precision",
                             [](const Report& r) { return to_string(r.verdict.score_precision); })
      .def_property_readonly("tensors", [](const Report& r) {
        py::dict d;
        for (const auto& t : r.verdict.tensors) d[py::str(t.name)] = py::cast(t, py::return_value_policy::copy);
        return d;
      }, "name -> TensorReport, for every tensor compared")
      .def_property_readonly("selection", [](const Report& r) { return r.verdict.selection; })
      .def_property_readonly("not_compared", [](const Report& r) { return r.verdict.not_compared; },
                             "what was given but not compared (e.g. do without gradients)")
      .def("__str__", [](const Report& r) { return r.verdict.report(); })
      // `assert hils.verify(...)` held for a failing kernel (any object is true): refused.
      .def("__bool__", [](const Report&) -> bool {
        throw py::type_error(
            "hils.Report: the truth value of a report is ambiguous (a failing report is not "
            "false): use report.passed, or hils.testing.assert_kernel_matches");
      })
      .def("__repr__", [](const Report& r) {
        std::string text = "<hils.Report " + std::string(verdict_text(r.verdict.passed));
        if (!r.kernel.empty()) text += " kernel '" + r.kernel + "'";
        for (const auto& t : r.verdict.tensors) text += " " + t.name + "=" + verdict_text(t.passed);
        if (r.verdict.selection.compared) text += std::string(" selection=") + verdict_text(r.verdict.selection.passed);
        return text + ">";
      });

  py::class_<Verifier>(m, "Verifier", "The oracle for one problem (use hils.Verifier).")
      .def(py::init<const std::string&, const py::dict&, const std::string&, const std::string&,
                    const std::string&, const py::object&, int64_t, int64_t>(),
           py::arg("spec_json"), py::arg("inputs"), py::arg("input_precision"),
           py::arg("score_precision"), py::arg("bf16_rounding"), py::arg("queries"),
           py::arg("max_messages"), py::arg("sequences"))
      .def("verify", &Verifier::verify, py::arg("arrays"), py::arg("kernel"));
  py::class_<KernelArrays>(m, "KernelArrays", "A kernel's arrays, checked (use hils.Verifier.verify).")
      .def(py::init<const py::dict&, const py::object&, const py::object&, const py::dict&>(),
           py::arg("outputs"), py::arg("do"), py::arg("dlse"), py::arg("grads"));
  m.def("hard_cases", &hard_cases, py::arg("spec_json"), py::arg("Hq"), py::arg("Hkv"), py::arg("d"),
        py::arg("dv"), py::arg("precision"), py::arg("length_multiple"), py::arg("max_T"));
  m.attr("hard_case_names") = py::tuple(py::cast(oracle::hard_case_names()));
  // hils.as_numpy's check of a torch bf16 or fp16 tensor before it is widened (a broadcast view of
  // its shape: the size alone), the one every array meets before it is copied.
  m.def("require_fits_in_memory", [](const std::string& name, const py::array& shape_of) {
    require_fits_in_memory(name, shape_of, "float64");
  }, py::arg("name"), py::arg("shape_of"));
  // hils/decoding.py's check of one sequence's inputs before it builds them (broadcast views of
  // their shapes: the sizes alone), the Verifier's own check with the batch's share.
  m.def("require_oracle_inputs_fit", [](const py::dict& shapes_of, int64_t sequences) {
    const SequencesAtOnce share(sequences_at_once(sequences));
    require_oracle_inputs_fit(shapes_of, sequences_at_once(sequences));
  }, py::arg("shapes_of"), py::arg("sequences"));
  // Every field of a spec, as the codec decodes and validates it (hils.verify's checks): what
  // hils.verify_decode, hils.hard_cases and a chunked prefill read (S, the rules, the name)
  // before an oracle is built. JSON text: {"name": "nsa", "fusion": "flat", ..., "S": 64, ...}.
  m.def("spec_fields", [](const std::string& spec_json) {
    return config::spec_to_json(spec_from_text(spec_json)).dump();
  }, py::arg("spec_json"));
  m.def("reference", &reference, py::arg("spec_json"), py::arg("inputs"), py::arg("queries"),
        py::arg("sequences"));
  // The kernel outputs hils.verify judges (oracle::kOutputTensors), in pipeline order: the tests
  // hold hils.layouts and data/verify_format.md against it.
  m.attr("output_names") = py::tuple(py::cast(oracle::output_names()));
  // The precisions hils.verify accepts (oracle::precision_row), in the enum's order: every one as
  // a score precision, the input ones as input_precision.
  m.attr("score_precisions") = py::tuple(py::cast(oracle::precision_names()));
  m.attr("input_precisions") = py::tuple(py::cast(oracle::precision_names(true)));
}
