#include "titan/distributed/heartbeat.h"

namespace titan {

PeerBeats::PeerBeats(int rank, int size, int64_t now_ns)
    : rank_(rank),
      size_(size),
      looked_ns_(now_ns),
      heard_ns_(new std::atomic<int64_t>[static_cast<size_t>(size)]),
      entered_(new std::atomic<int64_t>[static_cast<size_t>(size)]) {
  for (int r = 0; r < size; ++r) {
    heard_ns_[r] = now_ns;
    entered_[r] = 0;
  }
}

void PeerBeats::heard(int peer, int64_t entered, int64_t now_ns) {
  heard_ns_[peer] = now_ns;
  entered_[peer] = entered;
}

void PeerBeats::looked(int64_t now_ns) {
  looked_ns_ = now_ns;
  heard_ns_[rank_] = now_ns;
}

int64_t PeerBeats::enter_collective() {
  return ++entered_[rank_];
}

std::vector<int> PeerBeats::silent(int64_t timeout_ns, int64_t now_ns, int64_t stale_ns) const {
  std::vector<int> ranks;
  const int64_t looked = looked_ns_;
  if (now_ns - looked > stale_ns) return ranks;
  for (int r = 0; r < size_; ++r) {
    if (r != rank_ && looked - heard_ns_[r] >= timeout_ns) ranks.push_back(r);
  }
  return ranks;
}

int64_t PeerBeats::silent_seconds(int peer) const {
  return (looked_ns_ - heard_ns_[peer]) / 1'000'000'000;
}

std::vector<int> PeerBeats::behind() const {
  std::vector<int> ranks;
  const int64_t mine = entered_[rank_];
  for (int r = 0; r < size_; ++r) {
    if (r != rank_ && entered_[r] < mine) ranks.push_back(r);
  }
  return ranks;
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) s += i + 1 == ranks.size() ? " and " : ", ";
    s += std::to_string(ranks[i]);
  }
  return s;
}

}  // namespace titan
