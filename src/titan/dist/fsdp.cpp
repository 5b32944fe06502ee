#include "titan/dist/fsdp.h"

#include <algorithm>
#include <cstring>

#include "titan/backend/backend.h"
#include "titan/core/error.h"
#include "titan/ops/host_parallel.h"

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
void FullyShardedGroups::for_each_slice(size_t g, Fn&& fn) const {
  const int64_t n = mesh_.dims().dp_shard;
  const ParamGroup &full = full_[g], &shard = shards_[g];
  for (int64_t r = 0; r < n; ++r) {
    for (size_t i = 0; i < full.views().size(); ++i) {
      const ParamView& v = full.views()[i];
      const int64_t d0 = v.spec.shape[0], row = v.numel / d0, c = rows_per_shard(v, n);
      const int64_t first = std::min(r * c, d0), rows = std::min(c, d0 - first);
      const int64_t at = shard.views()[i].offset;
      const int64_t next =
          i + 1 < shard.views().size() ? shard.views()[i + 1].offset : shard.numel();
      fn(v.offset + first * row, r * shard.numel() + at, rows * row, next - at - rows * row);
    }
  }
}

void FullyShardedGroups::pack(float* blocks, size_t g, const float* whole) const {
  for_each_slice(g, [&](int64_t w, int64_t b, int64_t count, int64_t padding) {
    std::memcpy(blocks + b, whole + w, static_cast<size_t>(count) * sizeof(float));
    std::memset(blocks + b + count, 0, static_cast<size_t>(padding) * sizeof(float));
  });
}

void FullyShardedGroups::unpack(float* whole, size_t g, const float* blocks) const {
  for_each_slice(g, [&](int64_t w, int64_t b, int64_t count, int64_t) {
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
  TITAN_CHECK(gathering_ == -1 || gathering_ == g, "FSDP: group ", g,
              " acquired while the prefetch of group ", gathering_, " is in flight");
  CommHandle gathered = gathering_ == g
                            ? std::move(gathered_)
                            : mesh_.shard_group().all_gather_async(
                                  staging_.as<float>(), shards_[g].params(), shards_[g].numel());
  gathering_ = -1;
  full.acquire_params();
  gathered.wait();
  unpack(full.params(), static_cast<size_t>(g), staging_.as<float>());
}

void FullyShardedGroups::prefetch(int64_t g) {
  if (full_[g].params_resident()) return;  // kept since its forward: nothing to gather
  TITAN_CHECK(gathering_ == -1, "FSDP: prefetch of group ", g, " while group ", gathering_,
              "'s is in flight");
  gathered_ = mesh_.shard_group().all_gather_async(staging_.as<float>(), shards_[g].params(),
                                                   shards_[g].numel());
  gathering_ = g;
}

void FullyShardedGroups::release(int64_t g, bool gradients) {
  ParamGroup &full = full_[g], &shard = shards_[g];
  if (gradients) {
    finish_scatter();  // its staging is reused now
    pack(scatter_staging_.as<float>(), static_cast<size_t>(g), full.grads());
    full.release_grads();
    scattered_ = mesh_.shard_group().reduce_scatter_sum_async(
        reduced_grad_.as<float>(), scatter_staging_.as<float>(), shard.numel());
    scattering_ = g;
  } else if (kept_after_forward_[static_cast<size_t>(g)]) {
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
  for (size_t g = 0; g < full_.size(); ++g) acquire(static_cast<int64_t>(g), false);
}

void FullyShardedGroups::release_all() {
  for (ParamGroup& g : full_) {
    g.release_params();
    g.release_grads();
  }
}

}  // namespace titan
