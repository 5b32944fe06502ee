#include "titan/data/bpe.h"

#include <atomic>
#include <bit>
#include <queue>

namespace titan {
namespace {

// Words up to this many bytes are merged by rescanning a rank array (cheap for short words);
// longer ones (long CJK runs, whitespace runs) use a heap so the cost stays O(n log n).
constexpr size_t kShortWord = 48;
// Per-thread cache bound: cleared when full, which keeps memory flat on endless new words.
constexpr size_t kCacheEntries = 1 << 16;
// Longer words are rare and not worth caching.
constexpr size_t kMaxCachedBytes = 256;

struct WordCache {
  uint64_t owner = 0;
  StringMap<std::vector<int32_t>> words;
};

std::atomic<uint64_t> next_serial{1};

}  // namespace

BpeModel::BpeModel(const std::array<int32_t, 256>& byte_ids, const std::vector<BpeMerge>& merges,
                   StringMap<int32_t> whole_words)
    : byte_ids_(byte_ids), whole_words_(std::move(whole_words)), serial_(next_serial++) {
  size_t capacity = 16;
  while (capacity < 2 * merges.size()) capacity *= 2;
  slots_.assign(capacity, Slot{kEmpty, -1, -1});
  mask_ = capacity - 1;
  shift_ = 64 - std::countr_zero(capacity);
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const BpeMerge& m = merges[rank];
    const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(m.left)) << 32) |
                         static_cast<uint32_t>(m.right);
    size_t i = (key * 0x9E3779B97F4A7C15ull) >> shift_;
    while (slots_[i].key != kEmpty && slots_[i].key != key) i = (i + 1) & mask_;
    // A pair listed twice takes its last rank, as in Hugging Face tokenizers' merge map.
    slots_[i] = Slot{key, static_cast<int32_t>(rank), m.merged};
  }
}

void BpeModel::merge_short(std::vector<int32_t>& ids) const {
  // rank[i]: rank of merging ids[i] with ids[i + 1], INT32_MAX when no merge applies.
  int32_t rank[kShortWord];
  int32_t merged[kShortWord];
  const auto set_rank = [&](size_t i) {
    const Slot* s = find(ids[i], ids[i + 1]);
    rank[i] = s ? s->rank : INT32_MAX;
    merged[i] = s ? s->merged : -1;
  };
  size_t n = ids.size();
  for (size_t i = 0; i + 1 < n; ++i) set_rank(i);
  while (n > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < n; ++i) {
      if (rank[i] < rank[best]) best = i;
    }
    if (rank[best] == INT32_MAX) break;
    ids[best] = merged[best];
    for (size_t i = best + 1; i + 1 < n; ++i) {
      ids[i] = ids[i + 1];
      rank[i] = rank[i + 1];
      merged[i] = merged[i + 1];
    }
    --n;
    if (best + 1 < n) set_rank(best);
    if (best > 0) set_rank(best - 1);
  }
  ids.resize(n);
}

void BpeModel::merge_long(std::vector<int32_t>& ids) const {
  // Symbols form a linked list; a merge keeps the left symbol and unlinks the right one. Heap
  // entries go stale when either side changes, which the id check on pop detects.
  const auto n = static_cast<int32_t>(ids.size());
  std::vector<int32_t> next(n), prev(n);
  for (int32_t i = 0; i < n; ++i) {
    next[i] = i + 1 < n ? i + 1 : -1;
    prev[i] = i - 1;
  }
  struct Candidate {
    int32_t rank, pos, left, right;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  const auto push = [&](int32_t pos) {
    if (pos < 0 || next[pos] < 0) return;
    if (const Slot* s = find(ids[pos], ids[next[pos]])) {
      heap.push({s->rank, pos, ids[pos], ids[next[pos]]});
    }
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  std::vector<bool> alive(n, true);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    const int32_t right = next[c.pos];
    if (!alive[c.pos] || right < 0 || ids[c.pos] != c.left || ids[right] != c.right) continue;
    ids[c.pos] = find(c.left, c.right)->merged;
    alive[right] = false;
    next[c.pos] = next[right];
    if (next[right] >= 0) prev[next[right]] = c.pos;
    push(prev[c.pos]);
    push(c.pos);
  }
  size_t out = 0;
  for (int32_t i = 0; i >= 0 && i < n; i = next[i]) ids[out++] = ids[i];
  ids.resize(out);
}

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.size() == 1) {
    out.push_back(byte_ids_[static_cast<uint8_t>(word[0])]);
    return;
  }
  thread_local WordCache cache;
  const bool cacheable = word.size() <= kMaxCachedBytes;
  if (cacheable) {
    if (cache.owner != serial_) {
      cache.words.clear();
      cache.owner = serial_;
    }
    if (const auto it = cache.words.find(word); it != cache.words.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids;
  if (const auto it = whole_words_.find(word); it != whole_words_.end()) {
    ids.push_back(it->second);
  } else {
    ids.reserve(word.size());
    for (char c : word) ids.push_back(byte_ids_[static_cast<uint8_t>(c)]);
    if (ids.size() <= kShortWord) {
      merge_short(ids);
    } else {
      merge_long(ids);
    }
  }
  out.insert(out.end(), ids.begin(), ids.end());
  if (cacheable) {
    if (cache.words.size() >= kCacheEntries) cache.words.clear();
    cache.words.emplace(word, std::move(ids));
  }
}

}  // namespace titan
