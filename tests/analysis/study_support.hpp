// Helpers shared by the study tests.
#pragma once

#include "case_inputs.hpp"
#include "hils/analysis/study.hpp"

namespace hils::analysis::testing {

// The study geometry of a case of the table.
inline StudyGeometry geometry_of_case(const cases::Case& c) {
  StudyGeometry g;
  g.S = c.S, g.W = c.W, g.K = c.K, g.landmarks = c.landmarks;
  return g;
}

}  // namespace hils::analysis::testing
