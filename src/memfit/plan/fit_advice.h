// The planner's advice for a run that does not fit its budget: the sets of changes that make
// it fit, each faster than any of its subsets that fits, among the checkpoint policy, the
// micro-batch (same global batch), bf16, an 8-bit optimizer, compressed activations
// (--act-compress int8) and, in bf16, the search's precision levers (--grad-dtype bf16,
// --master-weights none), each searched as --ckpt auto and --auto-batch search
// (plan/search.h); or, when none does, the smallest footprint of them all and its largest
// part. memfit train attaches it to an out-of-memory error (the pool's, or --ckpt auto's own
// when nothing fits) and prints it after the message.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "memfit/memory/pool.h"
#include "memfit/plan/search.h"
#include "memfit/plan/run_spec.h"

namespace memfit {

struct FitOption {
  std::string change;  // the options to give: "--ckpt full", "--precision bf16 --optim adamw8bit"
  RunSpec run;         // the run with the change made
  Candidate plan;      // its predicted peak and step time
};

struct FitAdvice {
  size_t limit = 0;
  size_t planned = 0;       // the run as configured (0 when it asks the planner to choose)
  bool fits_as_is = false;  // the run as configured is predicted to fit
  // The changes that fit and are faster than every smaller set of them that fits (a change
  // is named only if it buys time), fastest first.
  std::vector<FitOption> options;
  FitOption smallest;  // the least footprint of every set of changes tried
  std::string levers;  // what was tried, for the message: "checkpoint policy, bf16, ..."
  std::string text() const;
};

// Resuming restricts the advice to the checkpoint policy: a resumed run must keep its
// micro-batch, precision, optimizer and activation compression. Throws what plan_training throws for a bad config.
FitAdvice advise_fit(const RunSpec& spec, size_t limit);

// e with the advice for `spec` as its advice(); message and numbers stay e's.
OutOfMemoryError with_fit_advice(const OutOfMemoryError& e, const RunSpec& spec);

}  // namespace memfit
