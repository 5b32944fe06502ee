#include "titan/distributed/data_parallel.h"

namespace titan {

void all_reduce_gradients(std::vector<ParamGroup>& groups, Communicator& group) {
  if (group.size() == 1) return;
  for (ParamGroup& g : groups) group.all_reduce_sum(g.grads(), g.numel());
}

void all_reduce_gradients(std::vector<ParamGroup>& groups, Communicator& group,
                          const std::function<bool(const ParamView&)>& which) {
  if (group.size() == 1) return;
  for (ParamGroup& g : groups) {
    bool open = false;           // a run of selected views is being collected
    int64_t begin = 0, end = 0;  // its [begin, end) of the group's buffer (padding included)
    const auto close = [&] {
      if (open) group.all_reduce_sum(g.grads() + begin, end - begin);
      open = false;
    };
    for (const ParamView& v : g.views()) {
      if (!which(v)) {
        close();
        continue;
      }
      if (!open) begin = v.offset;
      open = true;
      end = v.offset + v.numel;
    }
    close();
  }
}

}  // namespace titan
