// FSDP over the shard group of a data-parallel mesh, one unit per parameter group (the embedding;
// each transformer block; [norm, lm_head]; the three one unit when tied: models/causal_lm.h). Each
// rank keeps a dim-0 shard of every parameter -- rows [r*c, (r+1)*c) of a parameter with d0 rows,
// c = ceil(d0 / N), the last ranks' missing rows zero padding -- with the matching shards of its
// gradient and of the AdamW moments (what the optimizer updates). A unit's whole parameters exist
// only while the model uses it (ParamGroupHooks, models/causal_lm.h): all-gathered into the
// group's buffer at acquire, handed back to the OS at release; when the use computed gradients,
// the release reduce-scatters them into the shards' gradients (summed over uses and
// micro-batches) and hands the whole gradients back too. Under HSDP the shards' gradients are
// then all-reduced over the replicas (finish_gradients).
//
// The collectives overlap compute (torchtitan's FSDP2): they run on the communication stream
// (dist/comm_stream.h). The model names the group it will use next (ParamGroupHooks::prefetch)
// and its all-gather is queued then, to run under the current unit's compute; a release queues its
// reduce-scatter and returns, and the sum into the shards' gradients is made at the next release
// with gradients (under the next unit's backward) or at finish_gradients. At most one all-gather
// and one reduce-scatter are in flight, each with its own staging buffer.
//
// Mixed precision (torchtitan's mixed_precision_param = "bfloat16"): the parameters the model
// reads only through bf16 copies (gather_in_bf16) are gathered in bf16 -- each rank rounds its
// shard's rows into a send buffer as the all-gather is queued, and the gathered rows land in the
// model's copies, their fp32 masters left unwritten and, laid out last in the group, not even
// committed (a unit in flight: its fp32-read masters and its bf16 copies); the rest (norms, biases,
// the router, an embedding the lookup reads) are gathered in fp32 as before. Rounding is
// elementwise, so the copies hold exactly the whole masters rounded. Gradients stay fp32
// (mixed_precision_reduce).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "titan/core/allocator.h"
#include "titan/dist/mesh.h"
#include "titan/nn/param_group.h"
#include "titan/nn/row_shard.h"

namespace titan {

class FullyShardedGroups {
 public:
  // `full` (with gradients allocated, both released: make_model's Residency::released) and `mesh`
  // must outlive this.
  FullyShardedGroups(std::vector<ParamGroup>& full, DeviceMesh& mesh);
  // Waits for the collectives in flight (they write into this object's buffers), even when an
  // error is unwinding the trainer.
  ~FullyShardedGroups();

  // Per group, this rank's shard of every parameter (same names, dim 0 = c), with gradients; the
  // cut they hold. Checkpoints and weights load into them directly (train/checkpoint.h).
  std::vector<ParamGroup>& shards() { return shards_; }
  RowShard cut() const { return {mesh_.shard_index(), mesh_.dims().dp_shard}; }
  // Initialises the shards a unit at a time: `init` fills the whole group (committed for the
  // call), this rank keeps its rows, and the group is handed back, so a rank never holds more
  // than one whole unit while starting (random init is keyed by parameter name, so every rank
  // computes the same whole values).
  void initialize(const std::function<void(ParamGroup&)>& init);
  // parallelism.fsdp_reshard_after_forward: which units keep their whole parameters after a
  // forward use until their next use (the backward) instead of gathering them again
  // (parse_reshard_policy and keeps_whole, nn/param_group.h).
  void set_reshard_after_forward(const std::string& policy);
  // Per group, the parameters to gather in bf16 straight into their copies (empty: fp32, the
  // default). The copies are written at acquire; they must be resident then.
  void gather_in_bf16(const std::vector<std::vector<ComputeCopyTarget>>& targets);
  // The model's uses of group g (install as its ParamGroupHooks).
  void acquire(int64_t g, bool gradients);
  void prefetch(int64_t g);
  void release(int64_t g, GroupUseEnd end);
  void zero_gradients();  // the shards' gradients, before a step's micro-batches
  // After the backward of the step's last micro-batch: the last reduce-scatter summed in, and
  // under HSDP the all-reduce over the replicas.
  void finish_gradients();
  // Every group whole and resident, every master written in fp32 (the export at the end of
  // training), or released again.
  void gather_all();
  void release_all();

 private:
  // This rank's rows of the whole group g -> its shard (padding rows zero).
  void keep_own_rows(size_t g);
  // A rank's block of group g in a collective: its shard's layout (fp32 gathers, reduce-scatters)
  // or the gather layout of gather_in_bf16 (bf16 views in half the floats).
  enum class BlockLayout { shard, gather };
  // fn(view, whole offset, block offset (floats), elements, padding) for every rank's rows of
  // every parameter of group g: the whole group's layout against each rank's block (N x the
  // block); padding (shard layout), the floats after them up to the block's next parameter (the
  // last ranks' missing rows and the alignment gap), which the blocks must hold as zeros.
  template <typename Fn>
  void for_each_slice(size_t g, BlockLayout layout, Fn&& fn) const;
  void pack(float* blocks, size_t g, const float* whole) const;
  void unpack(float* whole, size_t g, const float* blocks) const;
  // Queues group g's all-gather into staging_ in its gather layout (bf16 parameters rounded into
  // send_ first), and writes what it brought into the whole masters and the bf16 copies.
  CommHandle start_gather(size_t g);
  void unpack_gathered(size_t g);
  // Waits for the reduce-scatter in flight, if any, and adds it into its shards' gradients.
  void finish_scatter();

  std::vector<ParamGroup>& full_;
  DeviceMesh& mesh_;
  std::vector<ParamGroup> shards_;
  ReshardPolicy reshard_ = ReshardPolicy::except_next;  // fsdp_reshard_after_forward
  // Each group's all-gather: per view its offset in a rank's block (floats; a bf16 view takes
  // half its shard's floats) and its bf16 copy (null: gathered in fp32 into the master), and the
  // floats of a rank's block (the shard's numel when every view is fp32).
  struct GatherSlot {
    int64_t offset = 0;
    uint16_t* copy = nullptr;
  };
  std::vector<std::vector<GatherSlot>> gather_slots_;
  std::vector<int64_t> gather_block_;
  // Per group, the views whose masters a gather writes: those before the first view gathered in
  // bf16 when every later one is too (the model lays them out last), else all. Only they are
  // committed in flight: the unit's masters of the rest are never needed.
  std::vector<size_t> master_views_;
  Buffer send_;             // the largest block with bf16 views: this rank's rows, rounded
  Buffer staging_;          // N x the largest shard: the all-gathers' whole side
  Buffer scatter_staging_;  // the same for the reduce-scatters: one of each may be in flight
  Buffer reduced_grad_;     // the largest shard: one reduce-scatter's result
  int64_t gathering_ = -1;  // the group whose all-gather (prefetch) is in flight, else -1
  CommHandle gathered_;
  int64_t scattering_ = -1;  // the group whose reduce-scatter is in flight, else -1
  CommHandle scattered_;
};

}  // namespace titan
