#include "titan/dist/fsdp.h"

#include <algorithm>
#include <cstring>

#include "titan/core/error.h"

namespace titan {
namespace {

int64_t rows_per_shard(const ParamView& v, int64_t shards) {
  return (v.spec.shape[0] + shards - 1) / shards;
}

// The group of one rank's shards: every parameter with dim 0 cut to c rows.
ParamGroup shard_group_of(const ParamGroup& full, int64_t shards) {
  std::vector<ParamSpec> specs;
  for (const ParamView& v : full.views()) {
    ParamSpec s = v.spec;
    s.shape[0] = rows_per_shard(v, shards);
    specs.push_back(std::move(s));
  }
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
    shards_.push_back(shard_group_of(g, n));
    largest = std::max(largest, shards_.back().numel());
  }
  staging_ = Buffer(static_cast<size_t>(n * largest) * sizeof(float), MemCategory::other);
}

void FullyShardedGroups::pack(float* blocks, const ParamGroup& full, const float* whole) const {
  const int64_t n = mesh_.dims().dp_shard;
  const ParamGroup& shard = shards_[&full - full_.data()];
  for (int64_t r = 0; r < n; ++r) {
    float* block = blocks + r * shard.numel();
    std::memset(block, 0, static_cast<size_t>(shard.numel()) * sizeof(float));
    for (size_t i = 0; i < full.views().size(); ++i) {
      const ParamView& v = full.views()[i];
      const int64_t row = v.numel / v.spec.shape[0], c = rows_per_shard(v, n);
      const int64_t first = std::min(r * c, v.spec.shape[0]);
      const int64_t rows = std::min(c, v.spec.shape[0] - first);
      std::memcpy(block + shard.views()[i].offset, whole + v.offset + first * row,
                  static_cast<size_t>(rows * row) * sizeof(float));
    }
  }
}

void FullyShardedGroups::unpack(float* whole, const ParamGroup& full, const float* blocks) const {
  const int64_t n = mesh_.dims().dp_shard;
  const ParamGroup& shard = shards_[&full - full_.data()];
  for (int64_t r = 0; r < n; ++r) {
    const float* block = blocks + r * shard.numel();
    for (size_t i = 0; i < full.views().size(); ++i) {
      const ParamView& v = full.views()[i];
      const int64_t row = v.numel / v.spec.shape[0], c = rows_per_shard(v, n);
      const int64_t first = std::min(r * c, v.spec.shape[0]);
      const int64_t rows = std::min(c, v.spec.shape[0] - first);
      std::memcpy(whole + v.offset + first * row, block + shard.views()[i].offset,
                  static_cast<size_t>(rows * row) * sizeof(float));
    }
  }
}

void FullyShardedGroups::shard_parameters() {
  const int64_t rank = mesh_.shard_index();
  for (size_t g = 0; g < full_.size(); ++g) {
    pack(staging_.as<float>(), full_[g], full_[g].params());
    std::memcpy(shards_[g].params(), staging_.as<float>() + rank * shards_[g].numel(),
                static_cast<size_t>(shards_[g].numel()) * sizeof(float));
  }
}

void FullyShardedGroups::reduce_gradients() {
  for (size_t g = 0; g < full_.size(); ++g) {
    pack(staging_.as<float>(), full_[g], full_[g].grads());
    mesh_.shard_group().reduce_scatter_sum(shards_[g].grads(), staging_.as<float>(),
                                           shards_[g].numel());
    if (mesh_.dims().dp_replicate > 1) {
      mesh_.replicate_group().all_reduce_sum(shards_[g].grads(), shards_[g].numel());
    }
  }
}

void FullyShardedGroups::gather_parameters() {
  for (size_t g = 0; g < full_.size(); ++g) {
    mesh_.shard_group().all_gather(staging_.as<float>(), shards_[g].params(), shards_[g].numel());
    unpack(full_[g].params(), full_[g], staging_.as<float>());
  }
}

}  // namespace titan
