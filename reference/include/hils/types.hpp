// Matrix types shared by the reference: row-major so that one token's vector is contiguous.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

// GCC 12.2 (Debian 12) warns inside its own AVX-512 headers when Eigen's packet code is inlined
// into ours ("'__Y' may be used uninitialized", GCC bug 105593, fixed in 12.3): about a thousand
// false warnings per build that bury real ones. Silence that one warning for Eigen's (and the
// intrinsics') text only; our own code keeps -Wmaybe-uninitialized.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <Eigen/Dense>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

namespace hils {

template <class Scalar>
using Matrix = Eigen::Matrix<Scalar, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class Scalar>
using Vector = Eigen::Matrix<Scalar, Eigen::Dynamic, 1>;
template <class Scalar>
using RowVector = Eigen::Matrix<Scalar, 1, Eigen::Dynamic>;
// Chunk indices; -1 pads a selection row to length K.
using IndexMatrix = Eigen::Matrix<int32_t, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// Every invalid argument, shape or configuration is reported through this type; the message
// names the field, what was found and what was expected.
class InvalidArgument : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// Throws InvalidArgument("<field>: <expected>, got <found>") when `ok` is false.
void require(bool ok, const std::string& field, const std::string& expected,
             const std::string& found);

}  // namespace hils
