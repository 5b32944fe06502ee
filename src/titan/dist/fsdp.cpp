#include "titan/dist/fsdp.h"

#include <algorithm>
#include <cstring>

#include "titan/backend/backend.h"
#include "titan/core/error.h"

namespace titan {
namespace {

int64_t rows_per_shard(const ParamView& v, int64_t shards) {
  return RowShard{0, shards}.rows_per_shard(v.spec.shape[0]);
}

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
  kept_after_forward_.assign(full_.size(), false);
  staging_ = Buffer(static_cast<size_t>(n * largest) * sizeof(float), MemCategory::other);
  reduced_grad_ = Buffer(static_cast<size_t>(largest) * sizeof(float), MemCategory::other);
}

void FullyShardedGroups::pack(float* blocks, size_t g, const float* whole) const {
  const int64_t n = mesh_.dims().dp_shard;
  const ParamGroup &full = full_[g], &shard = shards_[g];
  std::memset(blocks, 0, static_cast<size_t>(n * shard.numel()) * sizeof(float));
  for (int64_t r = 0; r < n; ++r) {
    float* block = blocks + r * shard.numel();
    for (size_t i = 0; i < full.views().size(); ++i) {
      const ParamView& v = full.views()[i];
      const int64_t d0 = v.spec.shape[0], row = v.numel / d0, c = rows_per_shard(v, n);
      const int64_t first = std::min(r * c, d0), rows = std::min(c, d0 - first);
      std::memcpy(block + shard.views()[i].offset, whole + v.offset + first * row,
                  static_cast<size_t>(rows * row) * sizeof(float));
    }
  }
}

void FullyShardedGroups::unpack(float* whole, size_t g, const float* blocks) const {
  const int64_t n = mesh_.dims().dp_shard;
  const ParamGroup &full = full_[g], &shard = shards_[g];
  for (int64_t r = 0; r < n; ++r) {
    const float* block = blocks + r * shard.numel();
    for (size_t i = 0; i < full.views().size(); ++i) {
      const ParamView& v = full.views()[i];
      const int64_t d0 = v.spec.shape[0], row = v.numel / d0, c = rows_per_shard(v, n);
      const int64_t first = std::min(r * c, d0), rows = std::min(c, d0 - first);
      std::memcpy(whole + v.offset + first * row, block + shard.views()[i].offset,
                  static_cast<size_t>(rows * row) * sizeof(float));
    }
  }
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

void FullyShardedGroups::set_reshard_after_forward(const std::string& policy) {
  TITAN_CHECK(policy == "default" || policy == "always" || policy == "never",
              "parallelism.fsdp_reshard_after_forward '", policy,
              "' is not one of default, always, never");
  const size_t last = full_.size() - 1;
  for (size_t g = 0; g < full_.size(); ++g) {
    kept_after_forward_[g] = policy == "never" || (policy == "default" && g == last && g > 0);
  }
}

void FullyShardedGroups::acquire(int64_t g, bool gradients) {
  ParamGroup& full = full_[g];
  if (gradients) full.acquire_grads();
  if (full.params_resident()) return;  // kept since its forward
  full.acquire_params();
  mesh_.shard_group().all_gather(staging_.as<float>(), shards_[g].params(), shards_[g].numel());
  unpack(full.params(), static_cast<size_t>(g), staging_.as<float>());
}

void FullyShardedGroups::release(int64_t g, bool gradients) {
  ParamGroup &full = full_[g], &shard = shards_[g];
  if (gradients) {
    pack(staging_.as<float>(), static_cast<size_t>(g), full.grads());
    float* reduced = reduced_grad_.as<float>();
    mesh_.shard_group().reduce_scatter_sum(reduced, staging_.as<float>(), shard.numel());
    backend().vec().axpy(shard.grads(), 1.0f, reduced, shard.numel());
    full.release_grads();
  } else if (kept_after_forward_[static_cast<size_t>(g)]) {
    return;
  }
  full.release_params();
}

void FullyShardedGroups::zero_gradients() {
  for (ParamGroup& s : shards_)
    std::memset(s.grads(), 0, static_cast<size_t>(s.numel()) * sizeof(float));
}

void FullyShardedGroups::finish_gradients() {
  if (mesh_.dims().dp_replicate == 1) return;
  for (ParamGroup& s : shards_) mesh_.replicate_group().all_reduce_sum(s.grads(), s.numel());
}

void FullyShardedGroups::gather_all() {
  for (size_t g = 0; g < full_.size(); ++g) acquire(static_cast<int64_t>(g), false);
}

void FullyShardedGroups::release_all() {
  for (ParamGroup& g : full_) {
    g.release_params();
    g.release_grads();
  }
}

}  // namespace titan
