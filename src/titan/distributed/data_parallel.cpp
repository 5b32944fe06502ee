#include "titan/distributed/data_parallel.h"

namespace titan {

void all_reduce_gradients(std::vector<ParamGroup>& groups, Communicator& group) {
  if (group.size() == 1) return;
  for (ParamGroup& g : groups) group.all_reduce_sum(g.grads(), g.numel());
}

}  // namespace titan
