// Asynchronous training checkpoints (checkpoint.async_mode = "async" or "async_with_pinned_mem",
// torchtitan's values): a save copies this rank's checkpoint state into a host staging copy on
// the training thread -- the only stall -- and a background thread writes the checkpoint folder
// from that copy (train/checkpoint.h: the same writer, so the same files) while training goes on.
//
// The save protocol is the synchronous one's, split at the write:
//   start (training thread, every rank): rank 0 begins the checkpoint (its temporary folder), a
//     barrier, the staging copy, the background thread started;
//   background: each writer rank writes its shard files into the temporary folder (each file
//     appears under its name only when complete: io/atomic_file.h); rank 0 writes the record
//     files (run_record.h), waits until every writer's shard files are there and commits:
//     trainer_state.json, rename to step-<N>, keep_latest_k pruning (never the one just written);
//   finish (training thread, every rank; at the next save and at the end of training): waits for
//     this rank's write, agrees over all ranks that every write succeeded (one all-reduce), rank 0
//     waits for its commit, a barrier. A failed write is one titan::Error there, on the rank that
//     failed (with MPI its error ends the job), never swallowed.
// MPI collectives are issued only by the training thread, at start and finish: the communicator is
// MPI_THREAD_SERIALIZED (distributed/mpi_communicator.cpp), so the background thread must issue
// none. It learns that the other ranks' shards are complete from the files themselves.
//
// One staging copy is kept for the run and reused by every save (what torchtitan's
// async_with_pinned_mem buys), in pinned memory under async_with_pinned_mem where the backend has
// some (CUDA: faster device-to-host copies; on the CPU it is host memory either way).
// Under tensor or expert parallel a save's state is gathered whole onto rank 0 first -- the
// gathers are collectives, so on the training thread, as a synchronous save makes them -- into
// buffers the parallelism keeps until its next gathers (after finish()), and written from there:
// those buffers are the staging copy (start_gathered).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "titan/core/allocator.h"
#include "titan/distributed/communicator.h"
#include "titan/train/checkpoint.h"

namespace titan {

// The test-only environment variable that makes every background write wait this many
// milliseconds after this rank's tensor files, before rank 0's record files and the commit, so
// that a test can kill the process (or spoil the folder) while the checkpoint is half-written.
// Not for use outside tests.
inline constexpr const char* kCheckpointWriteDelayEnv = "TITAN_TEST_CHECKPOINT_WRITE_DELAY_MS";

class AsyncCheckpointer {
 public:
  // What one save writes: the synchronous save's arguments.
  struct Save {
    std::string folder;  // the checkpoint folder (job.dump_folder/checkpoint.folder)
    std::vector<ParamGroupSpec> specs;
    Shard cut;                  // the cut of the state this rank's groups hold
    bool writes_shard = false;  // this rank writes its cut (Parallelism::writes_checkpoint)
    TrainerState state;
    int64_t keep_latest_k = 0;
    // Rank 0, on the background thread, into the temporary folder: the files a checkpoint
    // carries besides its tensors (train/run_record.h).
    std::function<void(const std::string& temp_dir)> write_record;
  };

  // `staging`: where the staging copy is made -- host_memory(), or the backend's pinned host memory
  // (Backend::host_staging_memory) under async_with_pinned_mem.
  explicit AsyncCheckpointer(Communicator& world, MemorySpace& staging = host_memory());
  // Waits for a write still running (an error path: finish() was not reached); what it could not
  // do is printed as a warning. A commit that still needs other ranks' files is abandoned.
  ~AsyncCheckpointer();
  AsyncCheckpointer(const AsyncCheckpointer&) = delete;
  AsyncCheckpointer& operator=(const AsyncCheckpointer&) = delete;

  // At start-up, on a rank that writes a shard: allocates the staging copy for `groups` and
  // touches every page, so that no save step pays for faulting it in (seconds for a GiB on a
  // loaded machine; the first save would otherwise).
  void prepare(const std::vector<ParamGroup>& groups);
  // Every rank, on the training thread, with no save pending (finish() first): begins the save of
  // `groups` (this rank's state, `save.cut` of the model) and returns once they are staged.
  void start(Save save, const std::vector<ParamGroup>& groups);
  // start() for a state already gathered into buffers of the caller's (Parallelism::
  // checkpoint_source under TP and EP: whole on rank 0, empty elsewhere), which must stay unchanged
  // until finish(): written from there without a staging copy.
  void start_gathered(Save save, std::vector<CheckpointGroup> gathered);
  // Every rank, on the training thread: waits until the save started last is written by every
  // rank and committed; titan::Error when this rank's write or rank 0's commit failed. Nothing
  // when no save is pending.
  void finish();

 private:
  // start()'s halves around the staging: the temporary folder begun (rank 0) with every rank
  // past it; the background write launched.
  void begin(Save save);
  void launch();
  void stage(const std::vector<ParamGroup>& groups, bool model_only);
  void write_in_background();
  // Rank 0: true once every writer's shard files are in the temporary folder; false when
  // abandoned first; titan::Error when one is still missing after finish() learnt that every
  // rank has written.
  bool wait_for_shards() const;
  void abandon_and_join();

  Communicator& world_;
  MemorySpace& staging_memory_;
  std::vector<Buffer> staging_;  // per group: params, then exp_avg and exp_avg_sq (numel each)
  std::vector<CheckpointGroup> staged_;
  Save save_;
  std::string temp_dir_;
  double started_s_ = 0.0;
  bool pending_ = false;
  std::thread thread_;
  std::mutex mutex_;
  std::condition_variable written_cv_;
  bool written_ = false;      // this rank's part is written (or failed): guarded by mutex_
  std::string write_error_;   // set before written_
  std::string commit_error_;  // rank 0; read after join
  std::atomic<bool> abandon_{false};
  std::atomic<bool> all_written_{false};  // finish(): every rank's write succeeded
};

}  // namespace titan
