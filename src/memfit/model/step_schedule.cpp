#include "memfit/model/step_schedule.h"

#include <fmt/format.h>

#include <algorithm>


namespace memfit {

std::string Phase::name() const {
  switch (kind) {
    case PhaseKind::embedding: return "embedding";
    case PhaseKind::forward: return fmt::format("forward of block {}", layer);
    case PhaseKind::final_norm: return "final norm";
    case PhaseKind::lm_head: return "LM head";
    case PhaseKind::final_norm_backward: return "backward of the final norm";
    case PhaseKind::recompute: return fmt::format("recomputation of block {}", layer);
    case PhaseKind::backward: return fmt::format("backward of block {}", layer);
    case PhaseKind::embedding_backward: return "embedding backward";
  }
  return "?";
}

void PhaseUses::use(const std::string& tag, Access access) {
  auto seen = [&](const auto& u) { return u.first == tag; };
  if (std::none_of(uses.begin(), uses.end(), seen)) uses.emplace_back(tag, access);
}

const char* phase_kind_name(PhaseKind k) {
  switch (k) {
    case PhaseKind::embedding: return "embedding";
    case PhaseKind::forward: return "forward";
    case PhaseKind::final_norm: return "final_norm";
    case PhaseKind::lm_head: return "lm_head";
    case PhaseKind::final_norm_backward: return "final_norm_backward";
    case PhaseKind::recompute: return "recompute";
    case PhaseKind::backward: return "backward";
    case PhaseKind::embedding_backward: return "embedding_backward";
  }
  return "?";
}

}  // namespace memfit
