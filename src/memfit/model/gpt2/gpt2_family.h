// GPT-2's answers to what model/model_family.h asks of a family.
#pragma once

#include "memfit/model/model_family.h"

namespace memfit {

const ModelFamily& gpt2_family();

}  // namespace memfit
