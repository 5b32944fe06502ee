#include "titan/train/parallelism.h"

#include <algorithm>
#include <functional>

#include "titan/backend/backend.h"
#include "titan/core/allocator.h"
#include "titan/core/error.h"
#include "titan/distributed/data_parallel.h"
#include "titan/io/convert.h"
#include "titan/models/parallelize.h"
#include "titan/models/state_dict_adapter.h"
#include "titan/nn/host_params.h"
#include "titan/nn/shard_runs.h"
#include "titan/train/fsdp_model.h"
#include "titan/train/lora_job.h"

namespace titan {

ParallelAxes Parallelism::axes(const DeviceMesh& mesh, bool sequence_parallel) {
  ParallelAxes axes;
  axes.tp_index = mesh.tp_index();
  axes.tp_degree = mesh.dims().tp;
  axes.sequence_parallel = sequence_parallel;
  axes.ep_index = mesh.ep_index();
  axes.ep_degree = mesh.dims().ep;
  return axes;
}

ParallelizePlan Parallelism::plan(const ModelArgs& args, const ParallelAxes& axes) {
  return parallelize_decoder(args, axes);
}

Residency Parallelism::param_residency(const DeviceMesh& mesh) {
  return mesh.dims().fsdp() ? Residency::released : Residency::committed;
}

Parallelism::Parallelism(CausalLM& model, DeviceMesh& mesh, const ParallelizePlan& plan,
                         const std::string& reshard_after_forward, bool base_in_bf16)
    : model_(model),
      mesh_(mesh),
      plan_(plan),
      cuts_(mesh.dims().tp > 1 || mesh.dims().ep > 1),
      base_in_bf16_(base_in_bf16) {
  TITAN_CHECK(mesh.dims().ep % mesh.dims().tp == 0 || mesh.dims().ep == 1,
              "parallelism: an EP degree of ", mesh.dims().ep, " under a TP degree of ",
              mesh.dims().tp, " (it must be a multiple)");
  LayerCollectives collectives;
  if (mesh.dims().tp > 1) {
    // Both block the compute thread: the next layer needs the sums.
    Communicator& tp = mesh.tp_group();
    collectives.sum_partials = [&tp](float* x, int64_t count) { tp.all_reduce_sum(x, count); };
    collectives.sum_statistics = [&tp](double* x, int64_t count) { tp.all_reduce_sum(x, count); };
    collectives.all_reduce_max = [&tp](float* x, int64_t count) {
      std::vector<double> wide(x, x + count);  // exact both ways
      tp.all_reduce_max(wide.data(), count);
      std::copy(wide.begin(), wide.end(), x);
    };
    // Sequence parallel's, and without it EP x TP's sparse blocks' output rows (the all-gather);
    // expert tensor parallel (EP 1) without sequence parallel all-reduces instead, as dense TP.
    if (plan.axes().sequence_parallel || mesh.dims().ep > 1) {
      // One part per sequence (nn/layers.h): rank r's tokens of sequence p are out[p][r]. A
      // CommPart's `own` is not const because a reduce-scatter writes it; an all-gather only reads.
      const auto parts_of = [&tp](float* whole, float* own, int64_t count, int64_t parts) {
        std::vector<CommPart> p(static_cast<size_t>(parts));
        for (int64_t i = 0; i < parts; ++i) {
          p[static_cast<size_t>(i)].whole = whole + i * tp.size() * count;
          p[static_cast<size_t>(i)].own = own + i * count;
          p[static_cast<size_t>(i)].counts.assign(static_cast<size_t>(tp.size()), count);
        }
        return p;
      };
      collectives.all_gather = [&tp, parts_of](const float* in, float* out, int64_t count,
                                               int64_t parts) {
        tp.all_gather_async(parts_of(out, const_cast<float*>(in), count, parts)).wait();
      };
      collectives.reduce_scatter = [&tp, parts_of](const float* in, float* out, int64_t count,
                                                   int64_t parts) {
        tp.reduce_scatter_sum_async(parts_of(const_cast<float*>(in), out, count, parts)).wait();
      };
    }
  }
  if (mesh.dims().ep > 1) {
    // Blocking on the compute thread: the experts need the rows, the combine their outputs.
    Communicator& ep = *mesh.ep_group();
    collectives.all_to_all_v = [&ep](const void* send, const std::vector<int64_t>& send_counts,
                                     void* recv, const std::vector<int64_t>& recv_counts,
                                     DType dtype) {
      ep.all_to_all_v_async(send, send_counts, recv, recv_counts, dtype).wait();
    };
  }
  if (cuts_) {
    model.set_layer_collectives(std::move(collectives));
    if (mesh.world().rank() == 0) {
      for (const ParamGroupSpec& g : model_param_specs(model.args())) {
        export_whole_.emplace_back(g.name, g.params, Residency::released);
      }
    }
  }
  if (mesh.dims().fsdp()) {
    // Under expert parallel the experts are sharded over the ranks holding the same experts.
    std::function<bool(const ParamSpec&)> expert;
    if (mesh.dims().ep > 1) {
      expert = [this](const ParamSpec& p) { return is_expert(p); };
    }
    fsdp_ = std::make_unique<FullyShardedGroups>(
        model.param_groups(), mesh,
        base_in_bf16 ? bf16_only_param_names(model) : std::vector<std::vector<std::string>>{},
        expert);
    shard_model(model, *fsdp_);
    fsdp_->set_reshard_after_forward(reshard_after_forward);
  } else if (base_in_bf16) {
    hold_lora_base_in_bf16(model);
  }
}

Parallelism::~Parallelism() = default;

void Parallelism::train_only(std::vector<ParamGroup>& groups,
                             const std::vector<ParamGroupSpec>& whole) {
  for (const ParamGroup& g : model_.param_groups()) {
    TITAN_CHECK(g.frozen(), "parallelism: groups trained in place of the model's, but its group ",
                g.name(), " is not frozen");
  }
  TITAN_CHECK(checkpoint_whole_.empty(), "parallelism: train_only after a checkpoint");
  trained_ = &groups;
  trained_whole_ = whole;
  if (cuts_ && mesh_.world().rank() == 0) {
    for (const ParamGroupSpec& g : whole) {
      trained_layout_.emplace_back(g.name, g.params, Residency::released);
    }
  }
}

std::vector<ParamGroupSpec> Parallelism::checkpoint_specs() const {
  return trained_ ? trained_whole_ : model_param_specs(model_.args());
}

std::vector<ParamGroup>& Parallelism::checkpoint_layout() {
  return trained_ ? trained_layout_ : export_whole_;
}

std::vector<ParamGroup>& Parallelism::local_state_groups() {
  return trained_ ? *trained_ : model_.param_groups();
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

Communicator& Parallelism::cut_group_of(const ParamSpec& p) {
  return is_expert(p) ? *mesh_.ep_group() : mesh_.tp_group();
}

Communicator* Parallelism::sum_group_of(const ParamSpec& p) {
  if (plan_.placement_of(p).count == 1) return nullptr;
  if (!is_expert(p)) return &mesh_.tp_group();
  if (!fsdp_) return mesh_.ep_group();
  // FSDP x EP: the shard group of this tp index holds whole the experts of the EP indices with
  // it; the TP group adds the others.
  return mesh_.dims().tp > 1 ? &mesh_.tp_group() : nullptr;
}

bool Parallelism::is_expert(const ParamSpec& p) const {
  return plan_.style_of(module_of_param(p.name)) == ParallelStyle::expert;
}

bool Parallelism::shards_span_cuts() const {
  return fsdp_ && mesh_.dims().ep > 1 && mesh_.dims().tp == 1;
}

CutModelNorm Parallelism::cut_model_norm() {
  if (!cuts_ || shards_span_cuts()) return {};
  const bool tp = mesh_.dims().tp > 1, ep = mesh_.dims().ep > 1;
  CutModelNorm norm;
  norm.group = tp ? &mesh_.tp_group() : mesh_.ep_group();
  norm.cut = [plan = plan_](const ParamView& v) { return plan.placement_of(v.spec).count > 1; };
  if (tp && ep && !fsdp_) {
    // EP x TP without FSDP: the TP cuts' squares over the TP group, the experts' over the EP group.
    norm.expert_group = mesh_.ep_group();
    norm.expert = [this](const ParamView& v) { return is_expert(v.spec); };
  }
  return norm;
}

void Parallelism::initialize(const ModelArgs& args, uint64_t seed) {
  TITAN_CHECK(!base_in_bf16_, "parallelism: a base held in bf16 is loaded, not initialised");
  if (cuts_) {
    const auto init = [&](ParamGroup& g) { initialize_local_group(g, args, seed, plan_); };
    if (fsdp_) {
      fsdp_->initialize(init);
    } else {
      for (ParamGroup& g : model_.param_groups()) init(g);
    }
  } else if (fsdp_) {
    fsdp_->initialize([&](ParamGroup& g) { initialize_param_group(g, args, seed); });
  } else {
    model_.initialize(seed);
  }
}

void Parallelism::widen_bf16_base() {
  TITAN_CHECK(base_in_bf16_, "parallelism: no base held in bf16 to widen");
  if (fsdp_) {
    fsdp_->widen_bf16_shards();
  } else {
    widen_lora_base_to_fp32(model_);
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
  // The frozen model's uses under FSDP left nothing to reduce; the trained groups are the same
  // on every data-parallel rank.
  if (trained_ && mesh_.dims().tp > 1) {
    // The adapter's whole matrices saw only this rank's part of their base (models/lora.h): their
    // gradients summed over the TP group, before the data-parallel sum.
    all_reduce_gradients(*trained_, mesh_.tp_group(), [this](const ParamView& v) {
      return plan_.placement_of(v.spec).count == 1;
    });
  }
  if (fsdp_ && !trained_) {
    fsdp_->finish_gradients();
  } else if (mesh_.dims().ep > 1) {
    // An expert's gradient already holds every rank's tokens (its rows came to this rank): it is
    // summed over the other ranks holding the expert only.
    const auto expert = [this](const ParamView& v) { return is_expert(v.spec); };
    all_reduce_gradients(state_groups(), mesh_.dp_group(),
                         [&](const ParamView& v) { return !expert(v); });
    all_reduce_gradients(state_groups(), *mesh_.same_experts_group(), expert);
  } else {
    all_reduce_gradients(state_groups(), mesh_.dp_group());
  }
}

bool Parallelism::writes_checkpoint() const {
  return fsdp_ && !trained_ && !cuts_ ? mesh_.replicate_index() == 0 : mesh_.world().rank() == 0;
}

Parallelism::CheckpointSource Parallelism::checkpoint_source(bool model_only, bool all_now) {
  if (!cuts_) return {checkpoint_groups(state_groups()), {}};
  if (fsdp_) fsdp_->release_all();
  const bool root = mesh_.world().rank() == 0;
  CheckpointSource source;
  if (root) {
    if (checkpoint_whole_.empty()) {  // address space only: bytes are charged as they are gathered
      for (const ParamGroup& g : checkpoint_layout()) {
        const auto bytes = static_cast<size_t>(g.numel()) * sizeof(float);
        MemorySpace& memory = backend().memory();
        checkpoint_whole_.push_back(
            {Buffer(memory, bytes, MemCategory::parameters, Residency::released),
             Buffer(memory, bytes, MemCategory::optimizer, Residency::released),
             Buffer(memory, bytes, MemCategory::optimizer, Residency::released)});
      }
    }
    for (size_t g = 0; g < checkpoint_layout().size(); ++g) {
      std::array<Buffer, 3>& whole = checkpoint_whole_[g];
      source.groups.push_back({&checkpoint_layout()[g].views(), whole[0].as<float>(),
                               model_only ? nullptr : whole[1].as<float>(),
                               model_only ? nullptr : whole[2].as<float>()});
    }
  }
  // The other replicas hold the same state; without FSDP only rank 0's TP or EP group holds it.
  if (mesh_.replicate_index() != 0 || (!fsdp_ && !mesh_.shares_model_with_rank0())) return source;
  const auto whole_of = [this](const CheckpointTensor& t) {
    return checkpoint_whole_[t.group][t.buffer].as<float>() +
           checkpoint_layout()[t.group].view(t.name).offset;
  };
  if (all_now) {
    for (std::array<Buffer, 3>& whole : checkpoint_whole_) {
      for (Buffer& b : whole) b.recommit();  // held on from the first save
    }
    for (const CheckpointTensor& t : checkpoint_read_order(checkpoint_specs(), model_only)) {
      gather_checkpoint_tensor(t, root ? whole_of(t) : nullptr);
    }
    return source;
  }
  source.gather = [this, root, whole_of](const CheckpointTensor& t) {
    float* whole = nullptr;
    if (root) {  // the tensor before handed back, this one's bytes charged
      end_checkpoint();
      streamed_ = &checkpoint_whole_[t.group][t.buffer];
      streamed_->recommit(static_cast<size_t>(checkpoint_layout()[t.group].view(t.name).numel) *
                          sizeof(float));
      whole = whole_of(t);
    }
    gather_checkpoint_tensor(t, whole);
  };
  return source;
}

void Parallelism::end_checkpoint() {
  if (streamed_ != nullptr) streamed_->decommit();
  streamed_ = nullptr;
}

void Parallelism::gather_checkpoint_tensor(const CheckpointTensor& t, float* whole) {
  const ParamView& local = local_state_groups()[t.group].view(t.name);  // this rank's cut
  // Trained groups are whole on every data-parallel rank: FSDP shards only the frozen model.
  const bool sharded = fsdp_ && !trained_;
  const ParamGroup& held = sharded ? fsdp_->shards()[t.group] : local_state_groups()[t.group];
  float* const buffers[3] = {held.params(), held.exp_avg(), held.exp_avg_sq()};
  const bool takes_part = mesh_.shares_model_with_rank0();
  float* own = buffers[t.buffer] + (sharded ? 0 : local.offset);
  Buffer rows;  // under FSDP: the cut whole, on the ranks of rank 0's TP or EP group
  if (sharded) {
    if (takes_part) {
      rows = Buffer(backend().memory(), static_cast<size_t>(local.numel) * sizeof(float),
                    MemCategory::other);
    }
    fsdp_->gather_param_rows_to_root(t.group, t.name, own, takes_part ? rows.as<float>() : nullptr);
    own = rows.as<float>();
  }
  if (takes_part) gather_cut_param(local, own, whole);
}

Shard Parallelism::checkpoint_cut() const {
  return cuts_ ? Shard{} : state_cut();
}

NonfiniteScan Parallelism::scan_model(const std::string& what) {
  return scan_groups(model_groups(), fsdp_ != nullptr, what);
}

NonfiniteScan Parallelism::scan_trained(const std::string& what) {
  return scan_groups(*trained_, false, what);
}

void Parallelism::gather_trained(size_t group, const std::string& name, float* whole) {
  const ParamGroup& g = (*trained_)[group];
  const ParamView& v = g.view(name);
  gather_cut_param(v, g.params() + v.offset, whole);
}

NonfiniteScan Parallelism::scan_groups(std::vector<ParamGroup>& groups, bool sharded,
                                       const std::string& what) {
  std::vector<double> counts;  // per parameter, in the groups' order
  // A device's parameters are scanned a tensor at a time, copied to the host through the backend.
  const bool on_device = in_device_memory(groups);
  std::vector<float> host;
  for (const ParamGroup& g : groups) {
    for (const ParamView& v : g.views()) {
      const float* values = g.params() + v.offset;
      if (on_device) {
        host.resize(static_cast<size_t>(v.numel));
        backend().copy_to_host(host.data(), values, host.size() * sizeof(float));
        values = host.data();
      }
      counts.push_back(
          static_cast<double>(count_nonfinite(values, DType::f32, static_cast<size_t>(v.numel))));
    }
  }
  if (sharded) {
    mesh_.shard_group().all_reduce_sum(counts.data(), static_cast<int64_t>(counts.size()));
  }
  if (cuts_) {
    // A cut parameter's counts summed over its group (sum_group_of), a replicated one's counted
    // once; one sum per group, in the same order on every rank.
    std::vector<Communicator*> sums = {&mesh_.tp_group()};
    if (mesh_.dims().ep > 1) sums.push_back(mesh_.ep_group());
    for (Communicator* group : sums) {
      std::vector<size_t> summed;  // the parameters this group sums, by index into counts
      std::vector<double> part;
      size_t j = 0;
      for (const ParamGroup& g : groups) {
        for (const ParamView& v : g.views()) {
          if (sum_group_of(v.spec) == group) {
            summed.push_back(j);
            part.push_back(counts[j]);
          }
          ++j;
        }
      }
      if (summed.empty()) continue;  // the same on every rank of the group: the same views
      group->all_reduce_sum(part.data(), static_cast<int64_t>(part.size()));
      for (size_t i = 0; i < summed.size(); ++i) counts[summed[i]] = part[i];
    }
  }
  NonfiniteScan scan;
  size_t i = 0;
  for (const ParamGroup& g : groups) {
    for (const ParamView& v : g.views()) {
      scan.add_count(what, v.spec.name, static_cast<size_t>(counts[i++]));
    }
  }
  return scan;
}

bool Parallelism::takes_part_in_export() const {
  return fsdp_ ? mesh_.replicate_index() == 0 : mesh_.shares_model_with_rank0();
}

std::vector<ParamGroup>& Parallelism::export_groups() {
  return cuts_ ? export_whole_ : model_.param_groups();
}

void Parallelism::gather_for_export(const ExportRun& run) {
  if (fsdp_) fsdp_->gather_to_root(run.group, run.params);
  if (cuts_) gather_cuts(run);
}

void Parallelism::gather_cuts(const ExportRun& run) {
  // FSDP brought each TP or EP rank's cut whole onto the ranks of rank 0's TP or EP group (under
  // EP the experts onto them, the rest onto rank 0).
  if (fsdp_ && !mesh_.shares_model_with_rank0()) return;
  const bool root = mesh_.world().rank() == 0;
  ParamGroup* whole = nullptr;
  if (root) {
    for (ParamGroup& g : export_whole_) g.release_params();
    whole = &export_whole_[run.group];
    whole->acquire_params_where([&](const ParamView& v) {
      return std::find(run.params.begin(), run.params.end(), v.spec.name) != run.params.end();
    });
  }
  const ParamGroup& local = model_.param_groups()[run.group];
  for (const std::string& name : run.params) {
    const ParamView& v = local.view(name);
    gather_cut_param(v, local.params() + v.offset,
                     root ? whole->params() + whole->view(name).offset : nullptr);
  }
}

void Parallelism::gather_cut_param(const ParamView& v, float* own, float* whole) {
  const Shard cut = plan_.placement_of(v.spec);
  if (cut.count == 1) {  // the same on every rank of the group
    if (mesh_.world().rank() == 0) std::copy(own, own + v.numel, whole);
    return;
  }
  // Under EP x TP rank 0's EP group holds several TP groups: a TP cut comes from rank 0's.
  if (!is_expert(v.spec) && mesh_.dp_rank() != 0) return;
  Communicator& group = cut_group_of(v.spec);
  const bool root = group.rank() == 0;
  const auto degree = static_cast<size_t>(group.size());
  // The cuts in rank order: the whole itself for a dim-0 cut; else placed by shard_box.
  Buffer cuts;
  if (root && cut.dim != 0) {
    cuts = Buffer(backend().memory(), degree * static_cast<size_t>(v.numel) * sizeof(float),
                  MemCategory::other);
  }
  CommPart part{cut.dim == 0 ? whole : cuts.as<float>(), own, std::vector<int64_t>(degree, v.numel),
                DType::f32};
  group.gather_async({part}, 0).wait();
  if (!root || cut.dim == 0) return;
  const Shape shape = whole_param_spec(v.spec, plan_).shape;
  for (size_t r = 0; r < degree; ++r) {
    Shard rank_cut = cut;
    rank_cut.index = static_cast<int64_t>(r);
    copy_part_in(shard_box(shape, {rank_cut}), cuts.as<float>() + r * static_cast<size_t>(v.numel),
                 whole);
  }
}

void Parallelism::end_export() {
  if (fsdp_) fsdp_->release_all();
  for (ParamGroup& g : export_whole_) g.release_params();
}

}  // namespace titan
