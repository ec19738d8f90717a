// MEMFIT_CHECK_COLLECTIVES=1: a debug mode in which every collective first agrees on what it is.
// Ranks that issue different collectives (a different kind, size or element type, or one rank
// issuing one that another does not) otherwise wait for each other forever, or worse, exchange
// the wrong bytes; here each collective is preceded by an all-gather of a small record (its
// number in this rank's sequence, kind, element count, element size, root, the per-rank counts),
// and the first record that differs from rank 0's becomes a DisagreementError on every rank,
// naming both ranks' records, before the collective itself is issued. Every rank throws at the
// same point, so the job ends cleanly instead of hanging. It costs one small collective per
// collective and takes the overlap away: a debug mode, off by default. Note [Failures] in
// docs/notes/zero.md.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "memfit/dist/communicator.h"

namespace memfit::dist {

// What a rank says it is about to issue. All fields are int64 so a record is 64 plain bytes.
struct CollectiveRecord {
  enum Kind : int64_t {
    reduce_scatter = 1, all_gather, all_reduce, broadcast, barrier, end, split
  };
  int64_t seq = 0;         // 1 for this rank's first collective
  int64_t kind = 0;
  int64_t count = 0;       // elements over all ranks (a broadcast's bytes)
  int64_t elem_bytes = 0;  // 4 for the float reductions
  int64_t root = -1;       // a broadcast's
  uint64_t counts_hash = 0;  // the per-rank counts, which every rank must pass alike
  int64_t reserved[2] = {0, 0};

  bool operator==(const CollectiveRecord&) const = default;
  // "collective 12: all_reduce of 1024 x f32" (end: "the end of the run (no more collectives)").
  std::string describe() const;
};

// The first rank whose record differs from rank 0's, or -1 when all agree.
int first_divergent(const CollectiveRecord* records, int ranks);

// Whether MEMFIT_CHECK_COLLECTIVES is set to something other than "" or "0".
bool check_collectives_requested();

// `inner` with every collective checked first; make_world_communicator wraps the MPI world in
// it when check_collectives_requested(). A split is checked too (the ranks agree that they all
// split here; their colors may differ), and the group it makes is checked in turn.
std::unique_ptr<Communicator> make_checked_communicator(std::unique_ptr<Communicator> inner);

}  // namespace memfit::dist
