#include "titan/dist/fsdp.h"

#include <algorithm>
#include <cstring>

#include "titan/backend/backend.h"
#include "titan/core/error.h"
#include "titan/io/convert.h"
#include "titan/ops/host_parallel.h"

namespace titan {
namespace {

// The group of one rank's shards: every parameter with dim 0 cut to c rows.
ParamGroup shard_group_of(const ParamGroup& full, RowShard cut) {
  std::vector<ParamSpec> specs;
  for (const ParamView& v : full.views()) specs.push_back(cut.spec_of(v.spec));
  ParamGroup g(full.name(), specs);
  g.allocate_gradients();
  return g;
}

}  // namespace

FullyShardedGroups::FullyShardedGroups(std::vector<ParamGroup>& full, DeviceMesh& mesh)
    : full_(full), mesh_(mesh) {
  const int64_t n = mesh_.dims().dp_shard;
  int64_t largest = 0;
  for (const ParamGroup& g : full_) {
    TITAN_CHECK(g.grads() != nullptr, "FSDP: group ", g.name(), " has no gradients");
    TITAN_CHECK(!g.params_resident(), "FSDP: group ", g.name(),
                " is resident; make the model with Residency::released");
    shards_.push_back(shard_group_of(g, cut()));
    largest = std::max(largest, shards_.back().numel());
  }
  const std::vector<std::vector<ComputeCopyTarget>> none(full_.size());
  gather_in_bf16(none, none);
  staging_ = Buffer(static_cast<size_t>(n * largest) * sizeof(float), MemCategory::other);
  scatter_staging_ = Buffer(static_cast<size_t>(n * largest) * sizeof(float), MemCategory::other);
  reduced_grad_ = Buffer(static_cast<size_t>(largest) * sizeof(float), MemCategory::other);
}

FullyShardedGroups::~FullyShardedGroups() {
  for (CommHandle* h : {&gathered_, &scattered_}) {
    try {
      h->wait();
    } catch (const std::exception&) {  // the error that matters is the one unwinding, if any
    }
  }
}

template <typename Fn>
void FullyShardedGroups::for_each_slice(size_t g, const GatherLayout* gather, Fn&& fn) const {
  const int64_t n = mesh_.dims().dp_shard;
  const ParamGroup &full = full_[g], &shard = shards_[g];
  const int64_t block = gather != nullptr ? gather->block : shard.numel();
  const auto offset_of = [&](size_t i) {
    return gather != nullptr ? gather->slots[i].offset : shard.views()[i].offset;
  };
  const size_t views = full.views().size();
  for (int64_t r = 0; r < n; ++r) {
    const RowShard rank{r, n};
    for (size_t i = 0; i < views; ++i) {
      const ParamView& v = full.views()[i];
      const int64_t d0 = v.spec.shape[0], row = v.numel / d0;
      const int64_t first = rank.first_row(d0), count = rank.rows(d0) * row;
      const int64_t at = offset_of(i), next = i + 1 < views ? offset_of(i + 1) : block;
      fn(i, v.offset + first * row, r * block + at, count, next - at - count);
    }
  }
}

void FullyShardedGroups::pack(float* blocks, size_t g, const float* whole) const {
  for_each_slice(g, nullptr, [&](size_t, int64_t w, int64_t b, int64_t count, int64_t padding) {
    std::memcpy(blocks + b, whole + w, static_cast<size_t>(count) * sizeof(float));
    std::memset(blocks + b + count, 0, static_cast<size_t>(padding) * sizeof(float));
  });
}

void FullyShardedGroups::unpack(float* whole, size_t g, const float* blocks) const {
  for_each_slice(g, nullptr, [&](size_t, int64_t w, int64_t b, int64_t count, int64_t) {
    std::memcpy(whole + w, blocks + b, static_cast<size_t>(count) * sizeof(float));
  });
}

void FullyShardedGroups::keep_own_rows(size_t g) {
  const RowShard own = cut();
  const ParamGroup &full = full_[g], &shard = shards_[g];
  for (size_t i = 0; i < full.views().size(); ++i) {
    const ParamView &v = full.views()[i], &s = shard.views()[i];
    const int64_t d0 = v.spec.shape[0], row = v.numel / d0;
    float* dst = shard.params() + s.offset;
    std::memcpy(dst, full.params() + v.offset + own.first_row(d0) * row,
                static_cast<size_t>(own.rows(d0) * row) * sizeof(float));
    std::fill(dst + own.rows(d0) * row, dst + s.numel, 0.0f);
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
  int64_t largest_rounded = 0;
  for (size_t g = 0; g < full_.size(); ++g) {
    const ParamGroup &full = full_[g], &shard = shards_[g];
    for (size_t kind = 0; kind < 2; ++kind) {
      GatherLayout& layout = layouts_[g][kind];
      layout.slots.resize(full.views().size());
      for (const ComputeCopyTarget& t : (kind == 0 ? parameters : through_copies)[g]) {
        const ParamView& v = full.view(t.param);
        layout.slots[static_cast<size_t>(&v - full.views().data())].copy = t.copy;
      }
      // Views keep their order and 64-byte alignment; a bf16 one takes half the floats.
      for (size_t i = 0; i < layout.slots.size(); ++i) {
        const int64_t numel = shard.views()[i].numel;
        const bool bf16 = layout.slots[i].copy != nullptr;
        layout.slots[i].offset = layout.block;
        layout.block += param_view_span(bf16 ? (numel + 1) / 2 : numel);
        layout.rounds = layout.rounds || bf16;
      }
      if (layout.rounds) largest_rounded = std::max(largest_rounded, layout.block);
    }
  }
  send_ = Buffer(static_cast<size_t>(largest_rounded) * sizeof(float), MemCategory::other);
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
  ParamGroup& full = full_[g];
  if (gradients) full.acquire_grads();
  if (reads == GroupReads::nothing || full.params_resident()) return;  // or kept since its forward
  const GatherLayout& layout = layout_of(static_cast<size_t>(g), reads);
  TITAN_CHECK(gathering_ == -1 || (gathering_ == g && gathering_layout_ == &layout), "FSDP: group ",
              g, " acquired while another prefetch (group ", gathering_, ") is in flight");
  CommHandle gathered =
      gathering_ == g ? std::move(gathered_) : start_gather(static_cast<size_t>(g), layout);
  gathering_ = -1;
  gathering_layout_ = nullptr;
  full.acquire_params_where([&](const ParamView& v) {
    return layout.slots[static_cast<size_t>(&v - full.views().data())].copy == nullptr;
  });
  gathered.wait();
  unpack_gathered(static_cast<size_t>(g), layout);
}

CommHandle FullyShardedGroups::start_gather(size_t g, const GatherLayout& layout) {
  const ParamGroup& shard = shards_[g];
  const float* send = shard.params();
  if (layout.rounds) {  // some views go in bf16: this rank's rows, those rounded
    float* out = send_.as<float>();
    std::memset(out, 0, static_cast<size_t>(layout.block) * sizeof(float));
    for (size_t i = 0; i < layout.slots.size(); ++i) {
      const ParamView& v = shard.views()[i];
      const float* rows = shard.params() + v.offset;
      if (layout.slots[i].copy != nullptr) {
        convert_from_f32(rows, static_cast<size_t>(v.numel), DType::bf16,
                         out + layout.slots[i].offset);
      } else {
        std::memcpy(out + layout.slots[i].offset, rows,
                    static_cast<size_t>(v.numel) * sizeof(float));
      }
    }
    send = out;
  }
  return mesh_.shard_group().all_gather_async(staging_.as<float>(), send, layout.block);
}

void FullyShardedGroups::unpack_gathered(size_t g, const GatherLayout& layout) {
  const ParamGroup& full = full_[g];
  const float* staging = staging_.as<float>();
  for_each_slice(g, &layout, [&](size_t i, int64_t w, int64_t b, int64_t count, int64_t) {
    // bf16 values from the block's start, the copy's own layout.
    if (layout.slots[i].copy != nullptr) {
      std::memcpy(layout.slots[i].copy + (w - full.views()[i].offset), staging + b,
                  static_cast<size_t>(count) * sizeof(uint16_t));
    } else {
      std::memcpy(full.params() + w, staging + b, static_cast<size_t>(count) * sizeof(float));
    }
  });
}

void FullyShardedGroups::prefetch(int64_t g, GroupReads reads) {
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
  ParamGroup &full = full_[g], &shard = shards_[g];
  if (end == GroupUseEnd::gradients) {
    finish_scatter();  // its staging is reused now
    pack(scatter_staging_.as<float>(), static_cast<size_t>(g), full.grads());
    full.release_grads();
    scattered_ = mesh_.shard_group().reduce_scatter_sum_async(
        reduced_grad_.as<float>(), scatter_staging_.as<float>(), shard.numel());
    scattering_ = g;
  } else if (keeps_whole(reshard_, end)) {
    return;
  }
  full.release_params();
}

void FullyShardedGroups::finish_scatter() {
  if (scattering_ == -1) return;
  scattered_.wait();
  ParamGroup& shard = shards_[scattering_];
  scattering_ = -1;
  float* grads = shard.grads();
  const float* reduced = reduced_grad_.as<float>();
  const int64_t n = shard.numel();
  constexpr int64_t kChunk = int64_t{1} << 14;
  const VecKernels& v = backend().vec();
#pragma omp parallel for schedule(static) if (n >= kMinParallelElements)
  for (int64_t i = 0; i < n; i += kChunk)
    v.axpy(grads + i, 1.0f, reduced + i, std::min(kChunk, n - i));
}

void FullyShardedGroups::zero_gradients() {
  finish_scatter();
  for (ParamGroup& s : shards_)
    std::memset(s.grads(), 0, static_cast<size_t>(s.numel()) * sizeof(float));
}

void FullyShardedGroups::finish_gradients() {
  finish_scatter();
  if (mesh_.dims().dp_replicate == 1) return;
  for (ParamGroup& s : shards_) mesh_.replicate_group().all_reduce_sum(s.grads(), s.numel());
}

void FullyShardedGroups::gather_all() {
  finish_scatter();
  if (gathering_ != -1) gathered_.wait();  // a prefetch nothing used: its staging is reused now
  gathering_ = -1;
  gathering_layout_ = nullptr;
  for (size_t g = 0; g < full_.size(); ++g) {
    ParamGroup& full = full_[g];
    // Every master in fp32, those gathered in bf16 too (a kept unit's were never written).
    full.release_params();
    full.acquire_params();
    mesh_.shard_group().all_gather(staging_.as<float>(), shards_[g].params(), shards_[g].numel());
    unpack(full.params(), g, staging_.as<float>());
  }
}

void FullyShardedGroups::release_all() {
  for (ParamGroup& g : full_) {
    g.release_params();
    g.release_grads();
  }
}

}  // namespace titan
