// The one switch over Family in model/: each family's table is in its own folder.
#include "memfit/model/model_family.h"

#include "memfit/core/error.h"
#include "memfit/model/gpt2/gpt2_family.h"
#include "memfit/model/llama/llama_family.h"

namespace memfit {

const ModelFamily& model_family(Family family) {
  switch (family) {
    case Family::gpt2: return gpt2_family();
    case Family::llama: return llama_family();
  }
  MEMFIT_THROW(ConfigError, "model", "no family numbered {}", static_cast<int>(family));
}

}  // namespace memfit
