// Data parallelism with replicated parameters (HSDP's replicate dimension; DDP when the shard
// degree is 1): every rank holds the whole model, runs its own micro-batches of the global batch,
// and sums the gradients over the group before the (identical) optimizer step on every rank.
#pragma once

#include <functional>
#include <vector>

#include "titan/distributed/communicator.h"
#include "titan/nn/param_group.h"

namespace titan {

// Every group's gradients summed over `group`, in place (the flat buffer of each group in one
// all-reduce). The gradients are already scaled by the global batch's token count.
void all_reduce_gradients(std::vector<ParamGroup>& groups, Communicator& group);
// The same for the parameters `which` selects only (expert parallel: the experts over the ranks
// holding the same ones, the rest over every data-parallel rank): one all-reduce per run of
// selected parameters with no other between them in their group's buffer.
void all_reduce_gradients(std::vector<ParamGroup>& groups, Communicator& group,
                          const std::function<bool(const ParamView&)>& which);

}  // namespace titan
