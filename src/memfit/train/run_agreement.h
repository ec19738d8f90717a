// What the ranks of a data-parallel run must agree on before the first step (dist/agreement.h):
// every resolved option that changes what is computed (the model, shapes, precision, checkpoint
// policy, optimizer and schedule, seed, data order, stopping), the training and validation
// shards by name and size, and the checkpoint the run starts from by its files' names and sizes.
// Not compared, because they may differ per rank or host: paths (--data, --save, --log,
// --profile), --threads and --mem-limit (only the policy and micro-batch it resolves to count),
// --collective-timeout. A new option that changes what a rank computes or exchanges belongs
// in run_agreement_fields.
#pragma once

#include <vector>

#include "memfit/dist/agreement.h"
#include "memfit/train/train_spec.h"

namespace memfit {

// `spec` as resolved (no "auto" left), with the checkpoint the run loads.
std::vector<dist::AgreedField> run_agreement_fields(const TrainSpec& spec);

}  // namespace memfit
