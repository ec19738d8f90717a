// Ranks that disagree about the run (an option, the model, the data, the checkpoint they start
// from) would train different things and exchange gradients that do not belong together, or
// hang in collectives of different sizes. check_ranks_agree compares named values across ranks
// before the first step and fails on every rank alike, naming the first value that differs with
// rank 0's and the other rank's: cheap (one hash per field is exchanged; only the first differing
// field's two values are sent) and collective. Note [Failures] in docs/notes/zero.md.
#pragma once

#include <string>
#include <vector>

#include "memfit/dist/communicator.h"

namespace memfit::dist {

struct AgreedField {
  std::string name;   // "--lr", "model", "train data"
  std::string value;  // as the message shows it
};

// Collective. Returns when every rank's fields equal rank 0's (same names, same values, same
// order); otherwise throws DisagreementError on every rank: "ranks disagree about --lr: rank 0
// has 0.0006, rank 1 has 0.001 (also: --seed)".
void check_ranks_agree(Communicator& comm, const std::vector<AgreedField>& fields);

}  // namespace memfit::dist
