// The processes of one job: the MPI world when mpirun (or another MPI launcher) started this
// process, else a world of one rank without MPI at all. Initialised once at start-up by the
// command line, before any thread starts; everything distributed goes through `world()`.
#pragma once

#include "titan/distributed/communicator.h"

namespace titan {

struct WorldInfo {
  int rank = 0, size = 1;
  int local_rank = 0, local_size = 1;  // among the ranks on this machine
};

// Whether an MPI launcher started this process (its environment says so).
bool launched_by_mpi();
// Joins the MPI world when launched_by_mpi(), else makes the world of one rank.
void init_world(int* argc, char*** argv);
// Leaves MPI (every rank must reach it); nothing for a world of one.
void finalize_world();
const WorldInfo& world_info();
Communicator& world();
// The communication stream's times since start-up or the last reset (distributed/comm_stream.h):
// the collectives' seconds on its thread and the part the compute thread waited for. Zero in a
// world of one.
CommTimes collective_times();
void reset_collective_times();
// Ends every rank of the job with `code` (MPI_Abort), or this process in a world of one.
[[noreturn]] void abort_world(int code);
// A collective that waits longer than `seconds` for the other ranks ends the job: a watchdog
// prints one line naming the collective, `key` (the config key that sets the limit) and the ranks
// that have not reached it (by their heartbeats' counts of collectives) and exits this rank, and
// mpirun ends the others. For a rank that hangs without dying (a rank that dies
// ends the job through mpirun at once). No effect in a world of one.
void set_collective_timeout(int64_t seconds, const char* key);
// A rank whose heartbeats (distributed/heartbeat.h: one a second from its communication thread,
// computing or waiting) stop for `seconds` ends the job: every other rank prints one line naming
// it and `key` and exits, whatever it was doing and however long a step takes. 0 (the default
// until set) turns the check off. No effect in a world of one.
void set_heartbeat_timeout(int64_t seconds, const char* key);

}  // namespace titan
