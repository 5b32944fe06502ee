#include "titan/nn/param_group.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "titan/backend/backend.h"
#include "titan/core/error.h"
#include "titan/core/rng.h"
#include "titan/dispatch/device_ops.h"

namespace titan {

int64_t param_view_span(int64_t numel) {
  constexpr int64_t kAlignFloats = 16;
  return (numel + kAlignFloats - 1) / kAlignFloats * kAlignFloats;
}

int64_t param_group_numel(const std::vector<ParamSpec>& specs) {
  int64_t numel = 0;
  for (const ParamSpec& spec : specs) numel += param_view_span(shape_numel(spec.shape));
  return numel;
}

ReshardPolicy parse_reshard_policy(const std::string& policy) {
  if (policy == "default") return ReshardPolicy::except_next;
  if (policy == "always") return ReshardPolicy::always;
  TITAN_CHECK(policy == "never", "parallelism.fsdp_reshard_after_forward '", policy,
              "' is not one of default, always, never");
  return ReshardPolicy::never;
}

bool keeps_whole(ReshardPolicy policy, GroupUseEnd end) {
  return (end == GroupUseEnd::used_next && policy != ReshardPolicy::always) ||
         (end == GroupUseEnd::used_later && policy == ReshardPolicy::never);
}

ParamGroup::ParamGroup(std::string name, const std::vector<ParamSpec>& specs, Residency residency,
                       MemorySpace* space)
    : name_(std::move(name)),
      space_(space != nullptr ? space : &backend().memory()),
      residency_(residency) {
  for (const ParamSpec& spec : specs) {
    const int64_t n = shape_numel(spec.shape);
    TITAN_CHECK(n > 0, "parameter ", spec.name, " has an empty shape ", shape_str(spec.shape));
    views_.push_back({spec, numel_, n});
    numel_ += param_view_span(n);
  }
  params_ = Buffer(*space_, static_cast<size_t>(numel_) * sizeof(float), MemCategory::parameters,
                   residency);
  if (residency == Residency::committed) params_.zero();  // padding stays zero through updates
}

const ParamView* ParamGroup::find(const std::string& param_name) const {
  for (const ParamView& v : views_) {
    if (v.spec.name == param_name) return &v;
  }
  return nullptr;
}

const ParamView& ParamGroup::view(const std::string& param_name) const {
  const ParamView* v = find(param_name);
  TITAN_CHECK(v != nullptr, "no parameter named '", param_name, "' in group ", name_);
  return *v;
}

void ParamGroup::allocate_gradients() {
  if (frozen_ || grads_.data() != nullptr) return;
  grads_ = Buffer(*space_, static_cast<size_t>(numel_) * sizeof(float), MemCategory::gradients,
                  residency_);
  if (residency_ == Residency::committed) grads_.zero();
}

void ParamGroup::zero_gradients() {
  if (frozen_) return;
  TITAN_CHECK(grads() != nullptr, "group ", name_, ": zero_gradients before allocate_gradients");
  device_ops().zero(grads(), numel_);
}

void ParamGroup::allocate_optimizer_state() {
  if (frozen_ || exp_avg_.data() != nullptr) return;
  exp_avg_ = Buffer(*space_, static_cast<size_t>(numel_) * sizeof(float), MemCategory::optimizer);
  exp_avg_sq_ =
      Buffer(*space_, static_cast<size_t>(numel_) * sizeof(float), MemCategory::optimizer);
  exp_avg_.zero();
  exp_avg_sq_.zero();
}

void ParamGroup::allocate_compute_copy(const std::function<bool(const ParamView&)>& copied,
                                       Residency residency) {
  TITAN_CHECK(compute_copy_.data() == nullptr && compute_copy_numel_ == 0, "group ", name_,
              ": its compute copy is already laid out");
  for (ParamView& v : views_) {
    if (!copied(v)) continue;
    v.copy_offset = compute_copy_numel_;
    compute_copy_numel_ += v.numel;
  }
  compute_copy_ = Buffer(*space_, static_cast<size_t>(compute_copy_numel_) * sizeof(uint16_t),
                         MemCategory::parameters, residency);
}

void ParamGroup::move_storage() {
  for (Buffer* b : {&params_, &grads_}) {
    if (b->data() == nullptr) continue;
    Buffer moved(*b->space(), b->bytes(), b->category(),
                 b->committed() ? Residency::committed : Residency::released);
    if (b->committed()) backend().copy_on_device(moved.data(), b->data(), b->bytes());
    *b = std::move(moved);
  }
}

void ParamGroup::acquire_params() {
  acquire_params_where([](const ParamView&) { return true; });
}

void ParamGroup::acquire_params_where(const std::function<bool(const ParamView&)>& held) {
  if (params_.committed()) return;
  const auto next_offset = [&](size_t i) {
    return i + 1 < views_.size() ? views_[i + 1].offset : numel_;
  };
  std::vector<bool> chosen(views_.size());
  int64_t charged = 0;
  for (size_t i = 0; i < views_.size(); ++i) {
    chosen[i] = held(views_[i]);
    if (chosen[i]) charged += next_offset(i) - views_[i].offset;
  }
  params_.recommit(static_cast<size_t>(charged) * sizeof(float));
  // The padding after each chosen view zeroed by its memory space (a device's memory is not the
  // host's to store into).
  for (size_t i = 0; i < views_.size(); ++i) {
    const int64_t end = views_[i].offset + views_[i].numel;
    if (chosen[i] && end < next_offset(i)) {
      params_.space()->zero(params() + end,
                            static_cast<size_t>(next_offset(i) - end) * sizeof(float));
    }
  }
}

void ParamGroup::acquire_grads() {
  if (grads_.committed()) return;
  grads_.recommit();
  device_ops().zero(grads(), numel_);
}

Tensor ParamGroup::param(const std::string& param_name) const {
  const ParamView& v = view(param_name);
  return Tensor::view(params() + v.offset, v.spec.shape, DType::f32);
}

Tensor ParamGroup::grad(const std::string& param_name) const {
  TITAN_CHECK(grads() != nullptr, "group ", name_, " has no gradients allocated");
  const ParamView& v = view(param_name);
  return Tensor::view(grads() + v.offset, v.spec.shape, DType::f32);
}

void initialize_param(const ParamSpec& spec, float* p, uint64_t seed, float std) {
  const int64_t numel = shape_numel(spec.shape);
  if (spec.init == ParamInit::ones || spec.init == ParamInit::zeros) {
    std::fill(p, p + numel, spec.init == ParamInit::ones ? 1.0f : 0.0f);
  } else if (spec.init == ParamInit::kaiming_uniform) {
    TITAN_CHECK(spec.shape.size() == 2, spec.name, ": Kaiming-uniform needs a matrix");
    const double bound = 1.0 / std::sqrt(static_cast<double>(spec.shape[1]));
    Rng rng(seed, spec.name);
    for (int64_t j = 0; j < numel; ++j) {
      p[j] = static_cast<float>((2.0 * rng.uniform() - 1.0) * bound);
    }
  } else {
    Rng(seed, spec.name).fill_normal(p, numel, 0.0f, std);
  }
}

void ParamGroup::initialize(uint64_t seed, float std) {
  const bool on_host = space_ == &host_memory();
  std::vector<float> staged(on_host ? 0 : static_cast<size_t>(numel_));  // zero padding too
  float* values = on_host ? params() : staged.data();
#pragma omp parallel for schedule(dynamic)
  for (size_t i = 0; i < views_.size(); ++i) {
    initialize_param(views_[i].spec, values + views_[i].offset, seed, std);
  }
  if (!on_host) backend().copy_from_host(params(), values, staged.size() * sizeof(float));
}

}  // namespace titan
