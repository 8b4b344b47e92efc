#include "hils/analysis/needle.hpp"

namespace hils::analysis {

// k, g, slot, aim, scale, logit -> k[g] row slot replaced by the needle key.
void plant_needle(std::vector<Matrix<double>>& k, int64_t g, int64_t slot,
                  const RowVector<double>& aim, double scale, double logit,
                  const std::string& field) {
  const double norm2 = aim.squaredNorm();
  require(norm2 > 0.0, field, "a non-zero query to aim the needle at", "a zero vector");
  k[static_cast<size_t>(g)].row(slot) = (logit / (scale * norm2)) * aim;
}

}  // namespace hils::analysis
