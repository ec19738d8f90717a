// Optimizer settings and their validation. Kept apart from the optimizer classes so that a
// caller (the CLI, the planner) can check a configuration and list the known optimizers without
// linking any optimizer's kernels.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "memfit/core/dtype.h"

namespace memfit {

struct OptimConfig {
  // adamw | adamw8bit | adamw4bit | lion | lion8bit | adam-mini | apollo | apollo-mini | galore |
  // galore8bit | sgd
  std::string name = "adamw";
  float beta1 = 0.9f;          // Lion: interpolation for the update sign; sgd: unused
  float beta2 = 0.95f;         // Lion: momentum decay (the paper uses 0.99); sgd: unused
  float eps = 1e-8f;           // Adam family only
  float weight_decay = 0.1f;   // applied to ParamInfo::decay tensors only
  int n_head = 1;              // for partitions that follow attention heads (Adam-mini)
  uint64_t seed = 0;           // stochastic rounding of pure bf16 weights (AdamW on bf16 params);
                               // APOLLO's projections (Note [APOLLO], docs/notes/apollo.md)
  // --optim-state-dtype: AdamW's moments in f32, or bf16 (rounded to nearest even after each
  // update; Note [bf16 optimizer state]). Other optimizers take f32 only.
  DType state_dtype = DType::f32;
  // APOLLO and GaLore only (--optim-rank, --optim-proj-gap): the projection's rank, 0 for the
  // optimizer's default (256 for apollo, 1 for apollo-mini, 128 for galore and galore8bit; capped
  // at each matrix's smaller side), and the steps between new projections (the papers'
  // update_proj_gap: APOLLO's random matrices, GaLore's SVDs).
  int rank = 0;
  int proj_gap = 200;
};

// "f32" | "bf16" -> the DType (ConfigError otherwise); and back.
DType optim_state_dtype_from_name(std::string_view name);
std::string_view optim_state_dtype_name(DType dtype);
// Whether `name` is one of the APOLLO optimizers (apollo, apollo-mini).
bool is_apollo(const std::string& name);
// The rank an APOLLO optimizer projects to before the cap: config.rank, or its default.
int apollo_rank(const OptimConfig& config);
// Whether `name` is one of the GaLore optimizers (galore, galore8bit).
bool is_galore(const std::string& name);
// The rank a GaLore optimizer projects to before the cap: config.rank, or 128 (galore_torch's
// README and torchrun_main.py default).
int galore_rank(const OptimConfig& config);

// The names make_optimizer accepts, in a stable order.
const std::vector<std::string>& optimizer_names();

// Throws ConfigError naming the field at fault: an unknown name (the message lists the known
// ones), a beta outside [0, 1), eps <= 0 for the Adam family, a negative weight decay,
// n_head < 1, a bf16 state_dtype for an optimizer other than adamw, a negative rank or a
// projection gap < 1, or a rank set for an optimizer other than APOLLO's and GaLore's.
// make_optimizer calls this first.
void check_optim_config(const OptimConfig& config);
// A copy of `config` named `name`, checked: what an optimizer class constructed directly (not
// through make_optimizer) holds, so that its own rules (e.g. eps for the Adam family) apply.
OptimConfig checked_optim_config(const OptimConfig& config, std::string_view name);

}  // namespace memfit
