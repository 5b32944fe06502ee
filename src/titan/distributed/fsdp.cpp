#include "titan/distributed/fsdp.h"

#include <algorithm>
#include <cstring>

#include "titan/backend/backend.h"
#include "titan/core/error.h"
#include "titan/core/profile.h"
#include "titan/dispatch/device_ops.h"

namespace titan {
namespace {

// The group of one rank's shards: every parameter with dim 0 cut to c rows.
ParamGroup shard_group_of(const ParamGroup& full, Shard cut) {
  std::vector<ParamSpec> specs;
  for (const ParamView& v : full.views()) specs.push_back(cut.spec_of(v.spec));
  ParamGroup g(full.name(), specs);
  if (full.frozen()) g.freeze();  // LoRA's base: sharded parameters, no gradients
  g.allocate_gradients();
  return g;
}

}  // namespace

FullyShardedGroups::FullyShardedGroups(std::vector<ParamGroup>& full, DeviceMesh& mesh)
    : full_(full), mesh_(mesh) {
  int64_t largest = 0;
  for (const ParamGroup& g : full_) {
    TITAN_CHECK(g.frozen() || g.grads() != nullptr, "FSDP: group ", g.name(), " has no gradients");
    TITAN_CHECK(!g.params_resident(), "FSDP: group ", g.name(),
                " is resident; make the model with Residency::released");
    shards_.push_back(shard_group_of(g, cut()));
    if (!g.frozen()) largest = std::max(largest, shards_.back().numel());
  }
  const std::vector<std::vector<ComputeCopyTarget>> none(full_.size());
  gather_in_bf16(none, none);
  reduced_grad_ =
      Buffer(backend().memory(), static_cast<size_t>(largest) * sizeof(float), MemCategory::other);
}

FullyShardedGroups::~FullyShardedGroups() {
  for (CommHandle* h : {&gathered_, &scattered_}) {
    try {
      h->wait();
    } catch (const std::exception&) {  // the error that matters is the one unwinding, if any
    }
  }
}

std::vector<CommPart> FullyShardedGroups::parts_of(size_t g, float* whole, float* own) const {
  const int64_t n = mesh_.dims().dp_shard;
  const ParamGroup &full = full_[g], &shard = shards_[g];
  std::vector<CommPart> parts;
  for (size_t i = 0; i < full.views().size(); ++i) {
    const ParamView &v = full.views()[i], &s = shard.views()[i];
    const int64_t d0 = v.spec.shape[0], row = v.numel / d0;
    CommPart part{whole + v.offset, own + s.offset, {}, DType::f32};
    for (int64_t r = 0; r < n; ++r) part.counts.push_back(Shard{r, n}.size(d0) * row);
    parts.push_back(std::move(part));
  }
  return parts;
}

void FullyShardedGroups::keep_own_rows(size_t g) {
  const Shard own = cut();
  const ParamGroup &full = full_[g], &shard = shards_[g];
  for (size_t i = 0; i < full.views().size(); ++i) {
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
    gathered_.wait();
    return;
  }
  if (full.params_resident()) return;  // kept since its forward
  TITAN_CHECK(gathering_ == -1, "FSDP: group ", g, " acquired while another prefetch (group ",
              gathering_, ") is in flight");
  start_gather(static_cast<size_t>(g), layout).wait();
}

CommHandle FullyShardedGroups::start_gather(size_t g, const GatherLayout& layout) {
  ParamGroup &full = full_[g], &shard = shards_[g];
  full.acquire_params_where([&](const ParamView& v) {
    return layout.copies[static_cast<size_t>(&v - full.views().data())] == nullptr;
  });
  std::vector<CommPart> parts = parts_of(g, full.params(), shard.params());
  auto* send = send_.as<uint16_t>();
  const auto rank = static_cast<size_t>(mesh_.shard_index());
  for (size_t i = 0; i < parts.size(); ++i) {
    if (layout.copies[i] == nullptr) continue;
    // This rank's rows rounded; the copy is whole in its own layout.
    CommPart& part = parts[i];
    uint16_t* rows = send + layout.send_at[i];
    device_ops().round_to_bf16(rows, static_cast<const float*>(part.own), part.counts[rank]);
    part = {layout.copies[i], rows, std::move(part.counts), DType::bf16};
  }
  return mesh_.shard_group().all_gather_async(std::move(parts));
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
    scattered_ = mesh_.shard_group().reduce_scatter_sum_async(
        parts_of(static_cast<size_t>(g), full.grads(), reduced_grad_.as<float>()));
    scattering_ = g;
  } else if (keeps_whole(reshard_, end)) {
    return;
  }
  full.release_params();
}

void FullyShardedGroups::finish_scatter() {
  if (scattering_ == -1) return;
  scattered_.wait();
  const auto g = static_cast<size_t>(scattering_);
  scattering_ = -1;
  full_[g].release_grads();
  // Each view's rows this rank holds (the reduce-scatter wrote those; padding stays zero).
  const ParamGroup& shard = shards_[g];
  const auto rank = static_cast<size_t>(mesh_.shard_index());
  const std::vector<CommPart> parts = parts_of(g, full_[g].grads(), reduced_grad_.as<float>());
  const DeviceOps& ops = device_ops();
  for (size_t i = 0; i < parts.size(); ++i) {
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

void FullyShardedGroups::gather_to_root(size_t g, const std::vector<std::string>& params) {
  release_all();
  ParamGroup& full = full_[g];
  const auto wanted = [&](const ParamView& v) {
    return std::find(params.begin(), params.end(), v.spec.name) != params.end();
  };
  const bool root = mesh_.shard_group().rank() == 0;
  if (root) full.acquire_params_where(wanted);
  std::vector<CommPart> all = parts_of(g, full.params(), shards_[g].params());
  std::vector<CommPart> parts;
  for (size_t i = 0; i < all.size(); ++i) {
    if (wanted(full.views()[i])) parts.push_back(std::move(all[i]));
  }
  TITAN_CHECK(parts.size() == params.size(), "FSDP: group ", full.name(), " lacks a parameter of ",
              params.size(), " to gather");
  mesh_.shard_group().gather_async(std::move(parts), 0).wait();
}

void FullyShardedGroups::release_all() {
  finish_scatter();                        // the gradients it reads go back here
  if (gathering_ != -1) gathered_.wait();  // a prefetch nothing used
  gathering_ = -1;
  gathering_layout_ = nullptr;
  for (ParamGroup& g : full_) {
    g.release_params();
    g.release_grads();
  }
}

}  // namespace titan
