// FSDP over the shard group of a data-parallel mesh, one unit per parameter group (the embedding;
// each transformer block; [norm, lm_head]; the three one unit when tied: models/causal_lm.h). Each
// rank keeps a dim-0 shard of every parameter -- rows [r*c, (r+1)*c) of a parameter with d0 rows,
// c = ceil(d0 / N), the last ranks' missing rows zero padding -- with the matching shards of its
// gradient and of the AdamW moments (what the optimizer updates). A unit's whole parameters exist
// only while the model uses it (ParamGroupHooks, models/causal_lm.h): all-gathered into the
// group's buffer, handed back to the OS at release; when the use computed gradients, the release
// reduce-scatters them into the shards' gradients (summed over uses and micro-batches) and the
// whole gradients go back once that is done. Under HSDP the shards' gradients are then
// all-reduced over the replicas (finish_gradients).
//
// The collectives overlap compute (torchtitan's FSDP2): they run on the communication stream
// (distributed/comm_stream.h). The model names the group it will use next
// (ParamGroupHooks::prefetch) and its all-gather is queued then, to run under the current unit's
// compute; a release queues its reduce-scatter and returns, and the sum into the shards' gradients
// is made at the next release with gradients (under the next unit's backward) or at
// finish_gradients. At most one all-gather and one reduce-scatter are in flight. Each moves every
// parameter straight between its place in the whole group and its shard, one part per parameter
// (Communicator's CommPart: an all-gather-v and a reduce-scatter-v over its dim-0 rows), so nothing
// is staged: a prefetched unit's destination is committed when its gather is queued, and a unit's
// whole gradients stay until their reduce-scatter is summed in. (FSDP2 gathers into one flat buffer
// per unit and copies out; a staging buffer of N x the largest shard -- the whole vocabulary matrix
// for Qwen3 -- for each direction cost more than a unit.)
//
// A frozen group (LoRA's base weights: ParamGroup::freeze) is sharded and gathered the same way,
// but has no gradients: its uses with gradients acquire none and reduce-scatter nothing.
//
// Mixed precision (torchtitan's mixed_precision_param = "bfloat16"): the parameters the model
// reads only through bf16 copies (gather_in_bf16) are gathered in bf16 -- each rank rounds its
// shard's rows into a send buffer as the all-gather is queued, and the gathered rows land in the
// model's copies (which must be resident from the prefetch on), their fp32 masters left unwritten
// and not even committed (a unit in flight: its
// fp32-read masters and its bf16 copies; ParamGroup::acquire_params_where); the rest (norms,
// biases, the router, an embedding the lookup reads) are gathered in fp32 as before. A use that
// reads through_copies (GroupReads: the final norm and loss) has a tied embedding gathered in bf16
// straight into the lm_head's copy too, its fp32 master not committed; a use that reads nothing
// (the embedding's backward) gathers nothing. Rounding is elementwise, so the copies hold exactly
// the whole masters rounded. Gradients stay fp32 (mixed_precision_reduce).
//
// A frozen base held only in bf16 (LoRA's lora.base_dtype = "bfloat16", train/lora_job.h): the
// shards of the parameters the model reads only in bf16 are bf16 rows (the constructor's
// bf16_shards), their fp32 master rows never committed; loaded straight into bf16, they are sent
// by the gathers as they are (no rounding, no send buffer), and widened into fp32 master rows only
// for a merged export (widen_bf16_shards).
//
// FSDP x expert parallel (torchtitan's mesh): the model's groups hold the rank's experts whole (the
// EP cut) and every other parameter whole; the experts are sharded over the ranks of the replica
// holding the same experts (the mesh's expert_shard_group, dp_shard / ep ranks), the rest over the
// whole shard group, as two kinds of views of one unit. A unit with both kinds queues two
// collectives per gather and per reduce-scatter (the shard group's first, then the experts'
// group's, in that order on every rank), one handle each; the experts' gradients, which already
// hold every EP rank's tokens, are summed over the ranks holding the same experts only. Under
// HSDP x EP the replicate group (the ranks with this shard index) holds the same rows of both
// kinds, and the all-reduce over it is as without EP.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "titan/core/allocator.h"
#include "titan/distributed/mesh.h"
#include "titan/nn/param_group.h"
#include "titan/nn/shard.h"

namespace titan {

class FullyShardedGroups {
 public:
  // `full` (with gradients allocated, both released: make_model's Residency::released) and `mesh`
  // must outlive this. `bf16_shards`, per group (or empty: none), the parameters of a frozen group
  // whose shards are held only in bf16: in the shard group's compute copy (each view with a
  // copy_offset: its c rows in its layout, padding rows zero), where weights are loaded; the model
  // must read them only in bf16 (gather_in_bf16).
  // `expert` (under FSDP x expert parallel; else empty): which parameters are a sparse layer's
  // experts, sharded over mesh.expert_shard_group() instead of the shard group.
  FullyShardedGroups(std::vector<ParamGroup>& full, DeviceMesh& mesh,
                     const std::vector<std::vector<std::string>>& bf16_shards = {},
                     const std::function<bool(const ParamSpec&)>& expert = {});
  // Waits for the collectives in flight (they write into this object's buffers), even when an
  // error is unwinding the trainer.
  ~FullyShardedGroups();

  // Per group, this rank's shard of every parameter (same names, dim 0 = c), with gradients; the
  // cut they hold (the experts': expert_cut()). Checkpoints and weights load into them directly
  // (train/checkpoint.h).
  std::vector<ParamGroup>& shards() { return shards_; }
  Shard cut() const { return {mesh_.shard_index(), mesh_.dims().dp_shard}; }
  Shard expert_cut() const { return expert_cut_; }
  // Initialises the shards a unit at a time: `init` fills the whole group (committed for the
  // call), this rank keeps its rows, and the group is handed back, so a rank never holds more
  // than one whole unit while starting (random init is keyed by parameter name, so every rank
  // computes the same whole values).
  // Not for shards held in bf16 (they are loaded, never initialised in fp32).
  void initialize(const std::function<void(ParamGroup&)>& init);
  // Before a merged export of a base held in bf16: the fp32 master rows of the shards held in bf16
  // committed and set to their bf16 values widened exactly, so the export's scan, gathers and
  // merge read fp32 shards as they do without it (gather_to_root refuses them before this).
  void widen_bf16_shards();
  // parallelism.fsdp_reshard_after_forward: which units keep their whole parameters after a
  // forward use until their next use (the backward) instead of gathering them again
  // (parse_reshard_policy and keeps_whole, nn/param_group.h).
  void set_reshard_after_forward(const std::string& policy);
  // Per group, the parameters to gather in bf16 straight into their copies (empty: fp32, the
  // default) for a use that reads `parameters` (CausalLM::bf16_only_params) and for one that reads
  // through_copies (CausalLM::copied_params). The copies are written from the prefetch (or the
  // acquire, without one) on; they must be resident then.
  void gather_in_bf16(const std::vector<std::vector<ComputeCopyTarget>>& parameters,
                      const std::vector<std::vector<ComputeCopyTarget>>& through_copies);
  // The model's uses of group g (install as its ParamGroupHooks).
  void acquire(int64_t g, bool gradients, GroupReads reads = GroupReads::parameters);
  void prefetch(int64_t g, GroupReads reads = GroupReads::parameters);
  void release(int64_t g, GroupUseEnd end);
  void zero_gradients();  // the shards' gradients, before a step's micro-batches
  // After the backward of the step's last micro-batch: the last reduce-scatter summed in, and
  // under HSDP the all-reduce over the replicas.
  void finish_gradients();
  // The export at the end of training, a run of one group's parameters at a time: `params` of
  // group g whole in fp32 in its buffer on rank 0 of the shard group (only those committed; the
  // rest of g released), the other ranks sending their rows and holding nothing more (a gather,
  // not an all-gather). Every shard rank calls it with the same arguments; the collectives in
  // flight are finished and every other unit handed back first.
  void gather_to_root(size_t g, const std::vector<std::string>& params);
  // For a checkpoint of cut parameters (train/parallelism.h): parameter `name` of group g gathered
  // from this rank's rows in `own` (laid out as its shard group: the shards' parameters or an
  // AdamW moment) into `whole` (the parameter's elements; null where this rank is not rank 0 of
  // the parameter's group) on rank 0 of its group. Every shard rank calls it; the caller has
  // finished the collectives in flight (release_all).
  void gather_param_rows_to_root(size_t g, const std::string& name, float* own, float* whole);
  // Every group's whole parameters and gradients handed back (the collectives in flight finished).
  void release_all();

 private:
  // The two kinds of views: sharded over the shard group, or (experts) over expert_shard_group.
  enum Kind : size_t { kRest = 0, kExperts = 1 };
  using Handles = std::array<CommHandle, 2>;  // one collective per kind in flight
  static void wait(Handles& handles);
  Communicator& group_of(Kind kind);
  Shard cut_of(Kind kind) const { return kind == kExperts ? expert_cut() : cut(); }
  Kind kind_of(size_t g, size_t view) const { return kinds_[g][view]; }
  // `parts` (one per view of group g) queued as one collective per kind over its group.
  Handles queue(size_t g, std::vector<CommPart> parts,
                const std::function<CommHandle(Communicator&, std::vector<CommPart>)>& collective);
  // This rank's rows of the whole group g -> its shard (padding rows zero).
  void keep_own_rows(size_t g);
  // A group's all-gather for one kind of use: per view, its bf16 copy (null: gathered in fp32 into
  // its master; only those masters are committed in flight) and where its rounded rows go in
  // send_ (elements); the send buffer's elements.
  struct GatherLayout {
    std::vector<uint16_t*> copies;
    std::vector<int64_t> send_at;
    int64_t send_numel = 0;
  };
  // The layout of group g's gathers for a use that reads `reads` (parameters or through_copies).
  const GatherLayout& layout_of(size_t g, GroupReads reads) const;
  // Per view of group g, its rows cut between the ranks: whole at `whole` + the view's offset (none
  // with `whole` null), this rank's at `own` + its shard view's offset (both f32).
  std::vector<CommPart> parts_of(size_t g, float* whole, float* own) const;
  // Commits what group g's all-gather in `layout` writes (its fp32 masters), rounds this rank's
  // bf16 rows into send_ (a shard held in bf16 is sent as it is), and queues the gather straight
  // into the masters and the copies.
  Handles start_gather(size_t g, const GatherLayout& layout);
  // Each of `parts` (one per view of group g) for which `wanted` holds gathered onto rank 0 of its
  // view's group; `wanted` must name `count` views.
  void gather_parts_to_root(size_t g, std::vector<CommPart> parts,
                            const std::function<bool(const ParamView&)>& wanted, size_t count);
  // Waits for the reduce-scatter in flight, if any, adds it into its shards' gradients and hands
  // the whole gradients it read back.
  void finish_scatter();

  std::vector<ParamGroup>& full_;
  DeviceMesh& mesh_;
  std::vector<ParamGroup> shards_;
  std::vector<std::vector<Kind>> kinds_;  // per group, per view
  Shard expert_cut_;                      // over expert_shard_group, when experts are sharded apart
  ReshardPolicy reshard_ = ReshardPolicy::except_next;  // fsdp_reshard_after_forward
  // Per group, the gather layouts of a use reading parameters [0] and through_copies [1].
  std::vector<std::array<GatherLayout, 2>> layouts_;
  bool bf16_widened_ = false;  // widen_bf16_shards was called
  Buffer send_;  // bf16: this rank's rows rounded, for the largest layout (none held in bf16)
  Buffer reduced_grad_;     // the largest shard: one reduce-scatter's result
  int64_t gathering_ = -1;  // the group whose all-gather (prefetch) is in flight, else -1
  const GatherLayout* gathering_layout_ = nullptr;  // and its layout
  Handles gathered_;
  int64_t scattering_ = -1;  // the group whose reduce-scatter is in flight, else -1
  Handles scattered_;
};

}  // namespace titan
