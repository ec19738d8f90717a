// Validation of OptimConfig, independent of the optimizer implementations (see optim_config.h).
#include "memfit/optim/optim_config.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "memfit/core/error.h"

namespace memfit {

const std::vector<std::string>& optimizer_names() {
  static const std::vector<std::string> names = {
      "adamw",  "adamw8bit",  "adamw4bit", "lion", "lion8bit", "adam-mini", "apollo", "apollo-mini",
      "galore", "galore8bit", "sgd"};
  return names;
}

void check_optim_config(const OptimConfig& c) {
  const auto& names = optimizer_names();
  if (std::find(names.begin(), names.end(), c.name) == names.end())
    MEMFIT_THROW(ConfigError, "optim", "unknown optimizer '{}'; known: {}", c.name,
                 fmt::join(names, ", "));
  auto unit = [&](float b, const char* field) {
    // Written so that NaN fails too.
    if (!(b >= 0.0f && b < 1.0f))
      MEMFIT_THROW(ConfigError, "optim", "{}: {} must be in [0, 1), got {}", c.name, field, b);
  };
  if (c.name != "sgd") {
    unit(c.beta1, "beta1");
    unit(c.beta2, "beta2");
  }
  bool adam_family = c.name == "adamw" || c.name == "adamw8bit" || c.name == "adamw4bit" ||
                     c.name == "adam-mini" || is_apollo(c.name) || is_galore(c.name);
  if (adam_family && !(c.eps > 0.0f))
    MEMFIT_THROW(ConfigError, "optim", "{}: eps must be positive, got {}", c.name, c.eps);
  if (!(c.weight_decay >= 0.0f))
    MEMFIT_THROW(ConfigError, "optim", "{}: weight_decay must be >= 0, got {}", c.name,
                 c.weight_decay);
  if (c.state_dtype != DType::f32 && c.state_dtype != DType::bf16)
    MEMFIT_THROW(ConfigError, "optim", "{}: the state dtype must be f32 or bf16, got {}", c.name,
                 dtype_name(c.state_dtype));
  if (c.state_dtype == DType::bf16 && c.name != "adamw")
    MEMFIT_THROW(ConfigError, "optim",
                 "--optim-state-dtype bf16 stores AdamW's two moments in bf16; only --optim adamw "
                 "has it (got {}, whose state {}); use --optim-state-dtype f32 with it",
                 c.name,
                 c.name.ends_with("8bit") || c.name.ends_with("4bit") ? "is already quantised"
                                                                       : "stays f32");
  if (c.n_head < 1)
    MEMFIT_THROW(ConfigError, "optim", "{}: n_head must be positive, got {}", c.name, c.n_head);
  if (is_apollo(c.name) || is_galore(c.name)) {
    if (c.rank < 0)
      MEMFIT_THROW(ConfigError, "optim",
                   "{}: --optim-rank must be >= 1 (or 0 for the default, {}), got {}", c.name,
                   is_galore(c.name) ? 128 : c.name == "apollo" ? 256 : 1, c.rank);
    if (c.proj_gap < 1)
      MEMFIT_THROW(ConfigError, "optim", "{}: --optim-proj-gap must be >= 1 step, got {}", c.name,
                   c.proj_gap);
  } else if (c.rank != 0) {
    MEMFIT_THROW(ConfigError, "optim",
                 "{}: --optim-rank {} applies to apollo, apollo-mini, galore and galore8bit only",
                 c.name, c.rank);
  }
}

bool is_apollo(const std::string& name) { return name == "apollo" || name == "apollo-mini"; }

bool is_galore(const std::string& name) { return name == "galore" || name == "galore8bit"; }

int galore_rank(const OptimConfig& c) { return c.rank > 0 ? c.rank : 128; }

int apollo_rank(const OptimConfig& c) {
  if (c.rank > 0) return c.rank;
  return c.name == "apollo" ? 256 : 1;
}

DType optim_state_dtype_from_name(std::string_view name) {
  if (name == "f32") return DType::f32;
  if (name == "bf16") return DType::bf16;
  MEMFIT_THROW(ConfigError, "config", "--optim-state-dtype must be f32 or bf16, got '{}'", name);
}

std::string_view optim_state_dtype_name(DType dtype) {
  return dtype == DType::bf16 ? "bf16" : "f32";
}

OptimConfig checked_optim_config(const OptimConfig& config, std::string_view name) {
  OptimConfig c = config;
  c.name = std::string(name);
  check_optim_config(c);
  return c;
}

}  // namespace memfit
