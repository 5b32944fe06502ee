#include "titan/nn/host_params.h"

#include "titan/backend/backend.h"
#include "titan/core/error.h"

namespace titan {

bool in_device_memory(const std::vector<ParamGroup>& groups) {
  size_t on_device = 0;
  for (const ParamGroup& g : groups) on_device += &g.space() != &host_memory() ? 1 : 0;
  TITAN_CHECK(on_device == 0 || on_device == groups.size(), on_device, " of ", groups.size(),
              " parameter groups are device memory and the others host memory");
  return on_device > 0;
}

void read_through_backend(SafetensorsWriteOptions& options) {
  options.copy_to_host = [](void* host_dst, const void* src, size_t bytes) {
    backend().copy_to_host(host_dst, src, bytes);
  };
  options.staging_memory = &backend().host_staging_memory();
}

void write_params_on_host(std::vector<ParamGroup>& groups, bool with_optimizer_state,
                          const std::function<void(std::vector<ParamGroup>&)>& write) {
  if (!in_device_memory(groups)) {
    write(groups);
    return;
  }
  std::vector<ParamGroup> host;
  host.reserve(groups.size());
  for (const ParamGroup& g : groups) {
    TITAN_CHECK(g.params_resident(), "group ", g.name(),
                ": its parameters are not resident, so there is nothing to write on the host");
    std::vector<ParamSpec> specs;
    for (const ParamView& v : g.views()) specs.push_back(v.spec);
    host.emplace_back(g.name(), specs, Residency::committed, &host_memory());
    if (with_optimizer_state && g.exp_avg() != nullptr) host.back().allocate_optimizer_state();
  }
  write(host);
  for (size_t i = 0; i < groups.size(); ++i) {
    const ParamGroup& from = host[i];
    ParamGroup& to = groups[i];
    const size_t bytes = static_cast<size_t>(to.numel()) * sizeof(float);
    backend().copy_from_host(to.params(), from.params(), bytes);
    if (from.exp_avg() != nullptr) {
      backend().copy_from_host(to.exp_avg(), from.exp_avg(), bytes);
      backend().copy_from_host(to.exp_avg_sq(), from.exp_avg_sq(), bytes);
    }
  }
}

}  // namespace titan
