// Errors: every failure in memfit is an exception that says where it came from, which
// operation failed (in brackets) and the values at fault. Library code never exits or aborts;
// only the CLI's main catches, prints and exits. Typed subclasses exist where a caller can act.
#pragma once

#include <fmt/format.h>

#include <array>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>

namespace memfit {

class Error : public std::runtime_error {
 public:
  Error(std::string_view where, std::string_view op, std::string_view detail);
  const std::string& op() const { return op_; }
  const std::string& detail() const { return detail_; }
  const std::string& where() const { return where_; }

 private:
  std::string where_, op_, detail_;
};

// Tensor shapes that do not fit an operation: "[matmul] inner dims differ: (8, 768) x (512, 768)".
class ShapeError : public Error {
  using Error::Error;
};
// A tensor of the wrong element type for an operation.
class DTypeError : public Error {
  using Error::Error;
};
// A file that cannot be read or written, or whose contents are not what they claim.
class IoError : public Error {
  using Error::Error;
};
// A configuration value or key that is not acceptable.
class ConfigError : public Error {
  using Error::Error;
};
// A collective or process-group failure.
class DistError : public Error {
  using Error::Error;
};

namespace detail {
std::string where(const char* file, int line);
}  // namespace detail

}  // namespace memfit

// Throw an error of type T: MEMFIT_THROW(ShapeError, "matmul", "inner dims differ: {} x {}", a, b).
#define MEMFIT_THROW(T, op, ...) \
  throw ::memfit::T(::memfit::detail::where(__FILE__, __LINE__), op, ::fmt::format(__VA_ARGS__))

// Check a condition and throw a memfit::Error (or a typed one) with a formatted message.
#define MEMFIT_CHECK(cond, op, ...)          \
  do {                                       \
    if (!(cond)) MEMFIT_THROW(Error, op, __VA_ARGS__); \
  } while (0)
#define MEMFIT_CHECK_SHAPE(cond, op, ...)    \
  do {                                       \
    if (!(cond)) MEMFIT_THROW(ShapeError, op, __VA_ARGS__); \
  } while (0)
#define MEMFIT_CHECK_DTYPE(cond, op, ...)    \
  do {                                       \
    if (!(cond)) MEMFIT_THROW(DTypeError, op, __VA_ARGS__); \
  } while (0)
