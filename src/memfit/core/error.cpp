#include "memfit/core/error.h"

namespace memfit {

Error::Error(std::string_view where, std::string_view op, std::string_view detail)
    : std::runtime_error(fmt::format("[{}] {} ({})", op, detail, where)),
      where_(where), op_(op), detail_(detail) {}

namespace detail {
std::string where(const char* file, int line) {
  std::string_view path(file);
  // Quote the path from src/ or tests/ on, not the builder's absolute checkout path.
  for (std::string_view root : {"src/memfit/", "tests/", "bench/"}) {
    if (auto pos = path.rfind(root); pos != std::string_view::npos) {
      path = path.substr(pos);
      break;
    }
  }
  return fmt::format("{}:{}", path, line);
}
}  // namespace detail

}  // namespace memfit
