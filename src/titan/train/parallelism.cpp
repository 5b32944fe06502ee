#include "titan/train/parallelism.h"

#include "titan/core/error.h"
#include "titan/distributed/data_parallel.h"
#include "titan/io/convert.h"
#include "titan/models/parallelize.h"
#include "titan/models/state_dict_adapter.h"
#include "titan/train/fsdp_model.h"

namespace titan {

ParallelizePlan Parallelism::plan(const ModelArgs& args) {
  return parallelize_decoder(args, ParallelAxes{});
}

Residency Parallelism::param_residency(const DeviceMesh& mesh) {
  return mesh.dims().dp_shard > 1 ? Residency::released : Residency::committed;
}

Parallelism::Parallelism(CausalLM& model, DeviceMesh& mesh,
                         const std::string& reshard_after_forward)
    : model_(model), mesh_(mesh) {
  if (mesh.dims().dp_shard > 1) {
    fsdp_ = std::make_unique<FullyShardedGroups>(model.param_groups(), mesh);
    shard_model(model, *fsdp_);
    fsdp_->set_reshard_after_forward(reshard_after_forward);
  }
}

Parallelism::~Parallelism() = default;

void Parallelism::train_only(std::vector<ParamGroup>& groups) {
  for (const ParamGroup& g : model_.param_groups()) {
    TITAN_CHECK(g.frozen(), "parallelism: groups trained in place of the model's, but its group ",
                g.name(), " is not frozen");
  }
  trained_ = &groups;
}

std::vector<ParamGroup>& Parallelism::model_groups() {
  return fsdp_ ? fsdp_->shards() : model_.param_groups();
}

Shard Parallelism::model_cut() const {
  return fsdp_ ? fsdp_->cut() : Shard{};
}

std::vector<ParamGroup>& Parallelism::state_groups() {
  return trained_ ? *trained_ : model_groups();
}

Shard Parallelism::state_cut() const {
  return trained_ ? Shard{} : model_cut();
}

Communicator* Parallelism::grad_norm_group() {
  return fsdp_ && !trained_ ? &mesh_.shard_group() : nullptr;
}

void Parallelism::initialize(const ModelArgs& args, uint64_t seed) {
  if (fsdp_) {
    fsdp_->initialize([&](ParamGroup& g) { initialize_param_group(g, args, seed); });
  } else {
    model_.initialize(seed);
  }
}

void Parallelism::zero_gradients() {
  if (trained_) {
    for (ParamGroup& g : *trained_) g.zero_gradients();
  } else if (fsdp_) {
    fsdp_->zero_gradients();
  } else {
    model_.zero_gradients();
  }
}

void Parallelism::finish_gradients() {
  // The frozen model's uses under FSDP left nothing to reduce; the trained groups are whole on
  // every rank.
  if (fsdp_ && !trained_) {
    fsdp_->finish_gradients();
  } else {
    all_reduce_gradients(state_groups(), mesh_.world());
  }
}

bool Parallelism::writes_checkpoint() const {
  return fsdp_ && !trained_ ? mesh_.replicate_index() == 0 : mesh_.world().rank() == 0;
}

NonfiniteScan Parallelism::scan_model(const std::string& what) {
  std::vector<double> counts;  // per parameter, in the groups' order
  for (const ParamGroup& g : model_groups()) {
    for (const ParamView& v : g.views()) {
      counts.push_back(static_cast<double>(
          count_nonfinite(g.params() + v.offset, DType::f32, static_cast<size_t>(v.numel))));
    }
  }
  if (fsdp_) mesh_.shard_group().all_reduce_sum(counts.data(), static_cast<int64_t>(counts.size()));
  NonfiniteScan scan;
  size_t i = 0;
  for (const ParamGroup& g : model_groups()) {
    for (const ParamView& v : g.views()) {
      scan.add_count(what, v.spec.name, static_cast<size_t>(counts[i++]));
    }
  }
  return scan;
}

bool Parallelism::takes_part_in_export() const {
  return fsdp_ ? mesh_.replicate_index() == 0 : mesh_.world().rank() == 0;
}

void Parallelism::gather_for_export(const ExportRun& run) {
  if (fsdp_) fsdp_->gather_to_root(run.group, run.params);
}

void Parallelism::end_export() {
  if (fsdp_) fsdp_->release_all();
}

}  // namespace titan
