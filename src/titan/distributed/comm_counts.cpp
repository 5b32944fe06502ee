#include "titan/distributed/comm_counts.h"

namespace titan {

const char* collective_name(Collective kind) {
  switch (kind) {
    case Collective::all_reduce:
      return "all_reduce";
    case Collective::all_gather:
      return "all_gather";
    case Collective::reduce_scatter:
      return "reduce_scatter";
    case Collective::gather:
      return "gather";
    case Collective::all_to_all_v:
      return "all_to_all_v";
    case Collective::all_to_all_counts:
      return "all_to_all_counts";
    case Collective::broadcast:
      return "broadcast";
    case Collective::barrier:
      return "barrier";
  }
  return "?";
}

CommCounts CommCounts::since(const CommCounts& earlier) const {
  CommCounts d;
  for (int k = 0; k < kCollectiveKinds; ++k) {
    d.of[k].calls = of[k].calls - earlier.of[k].calls;
    d.of[k].bytes = of[k].bytes - earlier.of[k].bytes;
  }
  return d;
}

CommCounts& CommCounts::operator+=(const CommCounts& more) {
  for (int k = 0; k < kCollectiveKinds; ++k) {
    of[k].calls += more.of[k].calls;
    of[k].bytes += more.of[k].bytes;
  }
  return *this;
}

bool CommCounts::empty() const {
  for (const CollectiveCount& c : of) {
    if (c.calls != 0) return false;
  }
  return true;
}

}  // namespace titan
