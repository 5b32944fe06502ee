#include "titan/distributed/fsdp.h"

#include <algorithm>
#include <cstring>

#include "titan/backend/backend.h"
#include "titan/core/error.h"
#include "titan/core/profile.h"
#include "titan/dispatch/device_ops.h"

namespace titan {
namespace {

// The group of one rank's shards: every parameter with dim 0 cut to c rows by its cut (per view);
// those `bf16` names held only in bf16 (the group's compute copy), their fp32 rows never committed.
ParamGroup shard_group_of(const ParamGroup& full, const std::vector<Shard>& cuts,
                          const std::vector<std::string>& bf16) {
  std::vector<ParamSpec> specs;
  for (size_t i = 0; i < full.views().size(); ++i) {
    specs.push_back(cuts[i].spec_of(full.views()[i].spec));
  }
  if (bf16.empty()) {
    ParamGroup g(full.name(), specs);
    if (full.frozen()) g.freeze();  // LoRA's base: sharded parameters, no gradients
    g.allocate_gradients();
    return g;
  }
  TITAN_CHECK(full.frozen(), "FSDP: group ", full.name(),
              " trains, but only a frozen group's shards may be held in bf16 only");
  for (const std::string& name : bf16) full.view(name);  // each names a parameter
  const auto held = [&](const ParamView& v) {
    return std::find(bf16.begin(), bf16.end(), v.spec.name) != bf16.end();
  };
  ParamGroup g(full.name(), specs, Residency::released);
  g.freeze();
  g.acquire_params_where([&](const ParamView& v) { return !held(v); });
  for (const ParamView& v : g.views()) {
    if (!held(v)) std::fill(g.params() + v.offset, g.params() + v.offset + v.numel, 0.0f);
  }
  g.allocate_compute_copy(held, Residency::committed);
  std::fill(g.compute_copy(), g.compute_copy() + g.compute_copy_numel(), uint16_t{0});
  return g;
}

}  // namespace

FullyShardedGroups::FullyShardedGroups(std::vector<ParamGroup>& full, DeviceMesh& mesh,
                                       const std::vector<std::vector<std::string>>& bf16_shards,
                                       const std::function<bool(const ParamSpec&)>& expert)
    : full_(full), mesh_(mesh) {
  TITAN_CHECK(bf16_shards.empty() || bf16_shards.size() == full_.size(), "FSDP: bf16 shards for ",
              bf16_shards.size(), " groups, the model has ", full_.size());
  TITAN_CHECK(!expert || mesh.expert_shard_group() != nullptr,
              "FSDP: experts sharded apart need FSDP x expert parallel");
  if (expert) expert_cut_ = {mesh.expert_shard_group()->rank(), mesh.expert_shard_group()->size()};
  int64_t largest = 0;
  for (size_t i = 0; i < full_.size(); ++i) {
    const ParamGroup& g = full_[i];
    TITAN_CHECK(g.frozen() || g.grads() != nullptr, "FSDP: group ", g.name(), " has no gradients");
    TITAN_CHECK(!g.params_resident(), "FSDP: group ", g.name(),
                " is resident; make the model with Residency::released");
    kinds_.emplace_back();
    std::vector<Shard> cuts;
    for (const ParamView& v : g.views()) {
      kinds_.back().push_back(expert && expert(v.spec) ? kExperts : kRest);
      cuts.push_back(cut_of(kinds_.back().back()));
    }
    shards_.push_back(
        shard_group_of(g, cuts, bf16_shards.empty() ? std::vector<std::string>{} : bf16_shards[i]));
    if (!g.frozen()) largest = std::max(largest, shards_.back().numel());
  }
  const std::vector<std::vector<ComputeCopyTarget>> none(full_.size());
  gather_in_bf16(none, none);
  reduced_grad_ =
      Buffer(backend().memory(), static_cast<size_t>(largest) * sizeof(float), MemCategory::other);
}

FullyShardedGroups::~FullyShardedGroups() {
  for (Handles* handles : {&gathered_, &scattered_}) {
    for (CommHandle& h : *handles) {
      try {
        h.wait();
      } catch (const std::exception&) {  // the error that matters is the one unwinding, if any
      }
    }
  }
}

Communicator& FullyShardedGroups::group_of(Kind kind) {
  return kind == kExperts ? *mesh_.expert_shard_group() : mesh_.shard_group();
}

void FullyShardedGroups::wait(Handles& handles) {
  for (CommHandle& h : handles) h.wait();
}

FullyShardedGroups::Handles FullyShardedGroups::queue(
    size_t g, std::vector<CommPart> parts,
    const std::function<CommHandle(Communicator&, std::vector<CommPart>)>& collective) {
  std::array<std::vector<CommPart>, 2> by_kind;
  for (size_t i = 0; i < parts.size(); ++i) by_kind[kind_of(g, i)].push_back(std::move(parts[i]));
  Handles handles;
  for (Kind kind : {kRest, kExperts}) {  // the same order on every rank
    if (!by_kind[kind].empty())
      handles[kind] = collective(group_of(kind), std::move(by_kind[kind]));
  }
  return handles;
}

std::vector<CommPart> FullyShardedGroups::parts_of(size_t g, float* whole, float* own) const {
  const ParamGroup &full = full_[g], &shard = shards_[g];
  std::vector<CommPart> parts;
  for (size_t i = 0; i < full.views().size(); ++i) {
    const ParamView &v = full.views()[i], &s = shard.views()[i];
    const int64_t n = cut_of(kind_of(g, i)).count;
    const int64_t d0 = v.spec.shape[0], row = v.numel / d0;
    CommPart part{whole == nullptr ? nullptr : whole + v.offset, own + s.offset, {}, DType::f32};
    for (int64_t r = 0; r < n; ++r) part.counts.push_back(Shard{r, n}.size(d0) * row);
    parts.push_back(std::move(part));
  }
  return parts;
}

void FullyShardedGroups::keep_own_rows(size_t g) {
  const ParamGroup &full = full_[g], &shard = shards_[g];
  for (size_t i = 0; i < full.views().size(); ++i) {
    const Shard own = cut_of(kind_of(g, i));
    const ParamView &v = full.views()[i], &s = shard.views()[i];
    const int64_t d0 = v.spec.shape[0], row = v.numel / d0;
    float* dst = shard.params() + s.offset;
    std::memcpy(dst, full.params() + v.offset + own.first(d0) * row,
                static_cast<size_t>(own.size(d0) * row) * sizeof(float));
    std::fill(dst + own.size(d0) * row, dst + s.numel, 0.0f);
  }
}

void FullyShardedGroups::initialize(const std::function<void(ParamGroup&)>& init) {
  for (size_t g = 0; g < full_.size(); ++g) {
    TITAN_CHECK(shards_[g].compute_copy_numel() == 0, "FSDP: group ", shards_[g].name(),
                " holds shards in bf16 only: they are loaded, not initialised");
    full_[g].acquire_params();
    init(full_[g]);
    keep_own_rows(g);
    full_[g].release_params();
  }
}

void FullyShardedGroups::gather_in_bf16(
    const std::vector<std::vector<ComputeCopyTarget>>& parameters,
    const std::vector<std::vector<ComputeCopyTarget>>& through_copies) {
  for (const auto* targets : {&parameters, &through_copies}) {
    TITAN_CHECK(targets->size() == full_.size(), "FSDP: bf16 gather targets for ", targets->size(),
                " groups, the model has ", full_.size());
  }
  layouts_.assign(full_.size(), {});
  int64_t largest_send = 0;
  for (size_t g = 0; g < full_.size(); ++g) {
    const ParamGroup &full = full_[g], &shard = shards_[g];
    for (size_t kind = 0; kind < 2; ++kind) {
      GatherLayout& layout = layouts_[g][kind];
      layout.copies.assign(full.views().size(), nullptr);
      layout.send_at.assign(full.views().size(), 0);
      for (const ComputeCopyTarget& t : (kind == 0 ? parameters : through_copies)[g]) {
        const ParamView& v = full.view(t.param);
        const auto i = static_cast<size_t>(&v - full.views().data());
        layout.copies[i] = t.copy;
        if (shard.views()[i].copy_offset >= 0) continue;  // held in bf16: sent as it is
        layout.send_at[i] = layout.send_numel;
        layout.send_numel += shard.views()[i].numel;
      }
      largest_send = std::max(largest_send, layout.send_numel);
    }
  }
  send_ = Buffer(backend().memory(), static_cast<size_t>(largest_send) * sizeof(uint16_t),
                 MemCategory::other);
}

const FullyShardedGroups::GatherLayout& FullyShardedGroups::layout_of(size_t g,
                                                                      GroupReads reads) const {
  TITAN_CHECK(reads != GroupReads::nothing, "FSDP: a use that reads nothing gathers nothing");
  return layouts_[g][reads == GroupReads::through_copies ? 1 : 0];
}

void FullyShardedGroups::set_reshard_after_forward(const std::string& policy) {
  reshard_ = parse_reshard_policy(policy);
}

void FullyShardedGroups::acquire(int64_t g, bool gradients, GroupReads reads) {
  // Its pages committed (madvise), gathers queued and waited for: work a profile shows beside
  // the kernels and collective waits it holds.
  const ProfileSpan span("fsdp.acquire", SpanKind::phase);
  ParamGroup& full = full_[g];
  if (gradients && !full.frozen()) {
    if (scattering_ == g) finish_scatter();  // its last gradients are still being reduced
    full.acquire_grads();
  }
  if (reads == GroupReads::nothing) return;
  const GatherLayout& layout = layout_of(static_cast<size_t>(g), reads);
  if (gathering_ == g) {  // prefetched: its destination is committed, the gather queued
    TITAN_CHECK(gathering_layout_ == &layout, "FSDP: group ", g,
                " acquired for another use than its prefetch gathered for");
    gathering_ = -1;
    gathering_layout_ = nullptr;
    wait(gathered_);
    return;
  }
  if (full.params_resident()) return;  // kept since its forward
  TITAN_CHECK(gathering_ == -1, "FSDP: group ", g, " acquired while another prefetch (group ",
              gathering_, ") is in flight");
  Handles gathered = start_gather(static_cast<size_t>(g), layout);
  wait(gathered);
}

FullyShardedGroups::Handles FullyShardedGroups::start_gather(size_t g, const GatherLayout& layout) {
  ParamGroup &full = full_[g], &shard = shards_[g];
  full.acquire_params_where([&](const ParamView& v) {
    return layout.copies[static_cast<size_t>(&v - full.views().data())] == nullptr;
  });
  std::vector<CommPart> parts = parts_of(g, full.params(), shard.params());
  auto* send = send_.as<uint16_t>();
  for (size_t i = 0; i < parts.size(); ++i) {
    const ParamView& own = shard.views()[i];
    const auto rank = static_cast<size_t>(cut_of(kind_of(g, i)).index);
    if (layout.copies[i] == nullptr) {
      TITAN_CHECK(own.copy_offset < 0, "FSDP: ", own.spec.name,
                  "'s shard is held in bf16 only, but a use gathers it in fp32");
      continue;
    }
    // This rank's rows in bf16 (rounded, unless held so); the copy is whole in its own layout.
    CommPart& part = parts[i];
    uint16_t* rows =
        own.copy_offset >= 0 ? shard.compute_copy() + own.copy_offset : send + layout.send_at[i];
    if (own.copy_offset < 0) {
      device_ops().round_to_bf16(rows, static_cast<const float*>(part.own), part.counts[rank]);
    }
    part = {layout.copies[i], rows, std::move(part.counts), DType::bf16};
  }
  return queue(g, std::move(parts), [](Communicator& group, std::vector<CommPart> p) {
    return group.all_gather_async(std::move(p));
  });
}

void FullyShardedGroups::prefetch(int64_t g, GroupReads reads) {
  const ProfileSpan span("fsdp.prefetch", SpanKind::phase);
  // Kept since its forward, or a use that reads nothing: nothing to gather.
  if (reads == GroupReads::nothing || full_[g].params_resident()) return;
  TITAN_CHECK(gathering_ == -1, "FSDP: prefetch of group ", g, " while group ", gathering_,
              "'s is in flight");
  const GatherLayout& layout = layout_of(static_cast<size_t>(g), reads);
  gathered_ = start_gather(static_cast<size_t>(g), layout);
  gathering_ = g;
  gathering_layout_ = &layout;
}

void FullyShardedGroups::release(int64_t g, GroupUseEnd end) {
  const ProfileSpan span("fsdp.release", SpanKind::phase);
  ParamGroup& full = full_[g];
  if (end == GroupUseEnd::gradients && !full.frozen()) {
    finish_scatter();  // reduced_grad_ is reused now
    scattered_ = queue(static_cast<size_t>(g),
                       parts_of(static_cast<size_t>(g), full.grads(), reduced_grad_.as<float>()),
                       [](Communicator& group, std::vector<CommPart> p) {
                         return group.reduce_scatter_sum_async(std::move(p));
                       });
    scattering_ = g;
  } else if (keeps_whole(reshard_, end)) {
    return;
  }
  full.release_params();
}

void FullyShardedGroups::finish_scatter() {
  if (scattering_ == -1) return;
  wait(scattered_);
  const auto g = static_cast<size_t>(scattering_);
  scattering_ = -1;
  full_[g].release_grads();
  // Each view's rows this rank holds (the reduce-scatter wrote those; padding stays zero).
  const ParamGroup& shard = shards_[g];
  const std::vector<CommPart> parts = parts_of(g, full_[g].grads(), reduced_grad_.as<float>());
  const DeviceOps& ops = device_ops();
  for (size_t i = 0; i < parts.size(); ++i) {
    const auto rank = static_cast<size_t>(cut_of(kind_of(g, i)).index);
    ops.add(shard.grads() + shard.views()[i].offset, static_cast<const float*>(parts[i].own),
            parts[i].counts[rank]);
  }
}

void FullyShardedGroups::zero_gradients() {
  finish_scatter();
  for (ParamGroup& s : shards_) s.zero_gradients();
}

void FullyShardedGroups::finish_gradients() {
  finish_scatter();
  if (mesh_.dims().dp_replicate == 1) return;
  for (ParamGroup& s : shards_) {
    if (!s.frozen()) mesh_.replicate_group().all_reduce_sum(s.grads(), s.numel());
  }
}

void FullyShardedGroups::widen_bf16_shards() {
  const DeviceOps& ops = device_ops();
  for (ParamGroup& shard : shards_) {
    if (shard.compute_copy_numel() == 0) continue;
    // The rows held in fp32 kept across the recommit, which hands every view back.
    std::vector<std::vector<float>> kept(shard.views().size());
    for (size_t i = 0; i < shard.views().size(); ++i) {
      const ParamView& v = shard.views()[i];
      if (v.copy_offset < 0)
        kept[i].assign(shard.params() + v.offset, shard.params() + v.offset + v.numel);
    }
    shard.release_params();
    shard.acquire_params();
    for (size_t i = 0; i < shard.views().size(); ++i) {
      const ParamView& v = shard.views()[i];
      float* rows = shard.params() + v.offset;
      if (v.copy_offset < 0) {
        std::copy(kept[i].begin(), kept[i].end(), rows);
      } else {
        ops.widen_bf16(rows, shard.compute_copy() + v.copy_offset, v.numel);
      }
    }
  }
  bf16_widened_ = true;
}

void FullyShardedGroups::gather_to_root(size_t g, const std::vector<std::string>& params) {
  release_all();
  ParamGroup& full = full_[g];
  const auto wanted = [&](const ParamView& v) {
    return std::find(params.begin(), params.end(), v.spec.name) != params.end();
  };
  for (const ParamView& v : shards_[g].views()) {
    TITAN_CHECK(v.copy_offset < 0 || bf16_widened_ || !wanted(v), "FSDP: ", v.spec.name,
                "'s shard is held in bf16 only: widen_bf16_shards before gathering it in fp32");
  }
  // Each view whole on rank 0 of its kind's group.
  const auto root = [&](const ParamView& v) {
    return cut_of(kind_of(g, static_cast<size_t>(&v - full.views().data()))).index == 0;
  };
  full.acquire_params_where([&](const ParamView& v) { return wanted(v) && root(v); });
  gather_parts_to_root(g, parts_of(g, full.params(), shards_[g].params()), wanted, params.size());
}

void FullyShardedGroups::gather_param_rows_to_root(size_t g, const std::string& name, float* own,
                                                   float* whole) {
  std::vector<CommPart> parts = parts_of(g, nullptr, own);
  const std::vector<ParamView>& views = full_[g].views();
  for (size_t i = 0; i < views.size(); ++i) {
    if (views[i].spec.name == name) parts[i].whole = whole;
  }
  gather_parts_to_root(
      g, std::move(parts), [&](const ParamView& v) { return v.spec.name == name; }, 1);
}

void FullyShardedGroups::gather_parts_to_root(size_t g, std::vector<CommPart> parts,
                                              const std::function<bool(const ParamView&)>& wanted,
                                              size_t count) {
  const ParamGroup& full = full_[g];
  std::array<std::vector<CommPart>, 2> by_kind;
  size_t found = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (!wanted(full.views()[i])) continue;
    by_kind[kind_of(g, i)].push_back(std::move(parts[i]));
    ++found;
  }
  TITAN_CHECK(found == count, "FSDP: group ", full.name(), " lacks a parameter of ", count,
              " to gather");
  for (Kind kind : {kRest, kExperts}) {
    if (!by_kind[kind].empty()) group_of(kind).gather_async(std::move(by_kind[kind]), 0).wait();
  }
}

void FullyShardedGroups::release_all() {
  finish_scatter();                       // the gradients it reads go back here
  if (gathering_ != -1) wait(gathered_);  // a prefetch nothing used
  gathering_ = -1;
  gathering_layout_ = nullptr;
  for (ParamGroup& g : full_) {
    g.release_params();
    g.release_grads();
  }
}

}  // namespace titan
