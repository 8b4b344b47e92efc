// Stopping a long call early (hils/threads.hpp, StopScope): with the scope's flag unset nothing
// changes, bit for bit; with it set, every stage and the backward end with Stopped; without a
// scope the flag is not read. A command's Ctrl-C uses this (analysis::run_unit_work), so that a
// long `hils run` unit stops at its next query block (tests/experiments/test_cli_interrupt.cpp).
#include <catch2/catch.hpp>

#include <atomic>
#include <csignal>

#include "hils/backward.hpp"
#include "hils/hils.hpp"
#include "hils/threads.hpp"
#include "support.hpp"

namespace hils {
namespace {

void require_same_bits(const MechanismOutputs<double>& a, const MechanismOutputs<double>& b) {
  REQUIRE(a.heads.size() == b.heads.size());
  for (size_t h = 0; h < a.heads.size(); ++h) {
    CHECK((a.heads[h].o.array() == b.heads[h].o.array()).all());
    CHECK((a.heads[h].lse.array() == b.heads[h].lse.array()).all());
  }
  REQUIRE(a.selection.size() == b.selection.size());
  for (size_t g = 0; g < a.selection.size(); ++g)
    CHECK((a.selection[g].array() == b.selection[g].array()).all());
}

// Runs `call`, which must end with Stopped carrying `value`.
template <class Call>
void require_stopped(Call call, int value) {
  try {
    call();
    FAIL("the call ran to its end with the stop flag set");
  } catch (const Stopped& stopped) {
    CHECK(stopped.value == value);
  }
}

}  // namespace

TEST_CASE("a StopScope's flag: unset, the same bits, and set, every stage ends with Stopped",
          "[stop]") {
  const auto& c = cases::case_named("gqa_group4");
  const auto inputs = cases::make_inputs<double>(c);
  const MechanismSpec spec = cases::with_case_geometry(preset("hils"), c);
  const auto plain = run_mechanism(spec, inputs);
  std::atomic<int> flag{0};
  {
    const StopScope scope(&flag);
    require_same_bits(run_mechanism(spec, inputs), plain);
    flag.store(SIGTERM);
    require_stopped([&] { run_mechanism(spec, inputs); }, SIGTERM);
    require_stopped([&] { run_mechanism(cases::with_case_geometry(preset("full"), c), inputs); },
                    SIGTERM);
    const Geometry geometry(c.T, c.S, c.W, c.landmarks);
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.d));
    require_stopped([&] { full_attention(inputs.q[0], inputs.k[0], inputs.v[0], geometry, scale, plain.queries); },
                    SIGTERM);
    OutputGradients<double> grads;
    for (const auto& head : plain.heads)
      grads.d_o.push_back(Matrix<double>::Ones(head.o.rows(), head.o.cols()));
    require_stopped([&] { run_mechanism_backward(spec, inputs, plain.selection, grads); }, SIGTERM);
    {
      const StopScope inner(nullptr);  // an inner scope without a flag: nothing is read
      require_same_bits(run_mechanism(spec, inputs), plain);
    }
    require_stopped([&] { run_mechanism(spec, inputs); }, SIGTERM);  // the outer flag again
  }
  // Outside every scope the flag is not read.
  require_same_bits(run_mechanism(spec, inputs), plain);
}

}  // namespace hils
