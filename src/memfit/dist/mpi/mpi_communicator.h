// The Communicator over MPI (OpenMPI here; any MPI-3 library): nonblocking collectives
// (MPI_Ialltoallv, MPI_Iallgatherv) on a duplicate of MPI_COMM_WORLD (or a group split from it,
// MPI_Comm_split), with errors returned, not fatal, and every return code turned into a
// DistError that quotes the call and MPI's message. MPI is initialised on first use
// (MPI_THREAD_FUNNELED: only the thread that runs the step calls MPI; OpenMP's workers never
// do; SERIALIZED where `serialized`: --tp-overlap's communication thread calls it too, never at
// the same time, dist/comm_thread.h) and finalised at exit.
#pragma once

#include <memory>

#include "memfit/dist/communicator.h"

namespace memfit::dist::mpi {

std::unique_ptr<Communicator> make_mpi_communicator(bool serialized = false);

// MPI_Abort(MPI_COMM_WORLD, code) when MPI is initialised and not finalised; else nothing.
void abort_world(int code);

}  // namespace memfit::dist::mpi
