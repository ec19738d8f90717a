#include "memfit/model/block_family.h"

#include "memfit/core/error.h"
#include "memfit/model/gpt2/gpt2_block.h"
#include "memfit/model/llama/llama_block.h"

namespace memfit {

const BlockFamily& block_family(Family family) {
  static const BlockFamily kGpt2{gpt2_block_forward, gpt2_block_backward};
  static const BlockFamily kLlama{llama_block_forward, llama_block_backward};
  switch (family) {
    case Family::gpt2: return kGpt2;
    case Family::llama: return kLlama;
  }
  MEMFIT_THROW(ConfigError, "model", "no block for the {} family", family_name(family));
}

}  // namespace memfit
