// The LLaMA family's answers to what model/model_family.h asks of a family.
#pragma once

#include "memfit/model/model_family.h"

namespace memfit {

const ModelFamily& llama_family();

}  // namespace memfit
