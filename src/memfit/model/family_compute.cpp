// The switch over Family for what the step runs: each family's table is in its own folder.
#include "memfit/model/family_compute.h"

#include "memfit/core/error.h"

namespace memfit {

const FamilyCompute& family_compute(Family family) {
  switch (family) {
    case Family::gpt2: return gpt2_compute();
    case Family::llama: return llama_compute();
  }
  MEMFIT_THROW(ConfigError, "model", "no family numbered {}", static_cast<int>(family));
}

}  // namespace memfit
