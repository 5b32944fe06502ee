#include "titan/nn/host_params.h"

#include "titan/backend/backend.h"
#include "titan/core/error.h"

namespace titan {

void write_params_on_host(std::vector<ParamGroup>& groups, bool with_optimizer_state,
                          const std::function<void(std::vector<ParamGroup>&)>& write) {
  bool on_host = true;
  for (const ParamGroup& g : groups) on_host = on_host && &g.space() == &host_memory();
  if (on_host) {
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
