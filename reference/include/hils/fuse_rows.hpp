// fuse for many rows of one query head at once (the oracle's forced fusion): the same bits as
// `fuse` row by row, faster where rows share chunks.
#pragma once

#include <vector>

#include "hils/attention.hpp"

namespace hils {

// rows[i] fused into row i of o [n x dv], lse [n] and weights [n x (K+2)], each row the bits
// `fuse` gives it alone (reference/SEMANTICS.md §5: a row's bits depend on that row only). Each
// (row, selected chunk) is attended by the same one-row products as in `fuse`, taken chunk by
// chunk across the rows, so that a chunk's keys and values are read from memory once for the
// rows that selected it instead of once per row. Throws InvalidArgument as `fuse` does, for the
// first bad row, or when o, lse or weights do not have one row per fusion row.
template <class Scalar>
void fuse_rows(const MechanismSpec& spec, const std::vector<FusionRow<Scalar>>& rows,
               const Matrix<Scalar>& k, const Matrix<Scalar>& v, const Geometry& geometry,
               Scalar scale, Eigen::Ref<Matrix<Scalar>> o, Eigen::Ref<Vector<Scalar>> lse,
               Eigen::Ref<Matrix<Scalar>> weights);

}  // namespace hils
