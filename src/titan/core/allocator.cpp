#include "titan/core/allocator.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "titan/core/error.h"

namespace titan {
namespace {

constexpr size_t kAlignment = 64;
// Buffers of a huge page or more are huge-page aligned and advised as transparent huge pages
// before their first touch, so their faults map 2 MiB pages where the kernel allows it (THP in
// "madvise" mode needs the advice). Streaming a decode step's weights through 4 KiB pages
// measured 25-30% slower here (TLB misses; docs/PERFORMANCE.md, Generation).
constexpr size_t kHugePage = size_t{2} << 20;

std::atomic<size_t> g_current[kMemCategoryCount];
std::atomic<size_t> g_peak[kMemCategoryCount];
std::atomic<size_t> g_total_current{0};
std::atomic<size_t> g_total_peak{0};

void raise_peak(std::atomic<size_t>& peak, size_t value) {
  size_t seen = peak.load(std::memory_order_relaxed);
  while (value > seen && !peak.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}

}  // namespace

std::string_view mem_category_name(MemCategory c) {
  switch (c) {
    case MemCategory::parameters:
      return "parameters";
    case MemCategory::gradients:
      return "gradients";
    case MemCategory::optimizer:
      return "optimizer";
    case MemCategory::activations:
      return "activations";
    case MemCategory::other:
      return "other";
  }
  return "?";
}

namespace {

void charge(size_t bytes, MemCategory category) {
  const int c = static_cast<int>(category);
  raise_peak(g_peak[c], g_current[c].fetch_add(bytes, std::memory_order_relaxed) + bytes);
  raise_peak(g_total_peak, g_total_current.fetch_add(bytes, std::memory_order_relaxed) + bytes);
}

void uncharge(size_t bytes, MemCategory category) {
  g_current[static_cast<int>(category)].fetch_sub(bytes, std::memory_order_relaxed);
  g_total_current.fetch_sub(bytes, std::memory_order_relaxed);
}

}  // namespace

namespace {

class HostMemory final : public MemorySpace {
 public:
  const char* name() const override { return "host"; }
  void* reserve(size_t bytes, MemCategory category) override {
    if (bytes == 0) return nullptr;
    const size_t alignment = bytes >= kHugePage ? kHugePage : kAlignment;
    const size_t rounded = (bytes + alignment - 1) / alignment * alignment;
    void* ptr = std::aligned_alloc(alignment, rounded);
    TITAN_CHECK(ptr != nullptr, "out of memory: could not allocate ", bytes, " bytes for ",
                mem_category_name(category));
    // Advice only: where it fails (no THP), the buffer works the same with 4 KiB pages.
    if (alignment == kHugePage) madvise(ptr, rounded, MADV_HUGEPAGE);
    return ptr;
  }
  void unreserve(void* ptr, size_t /*bytes*/) override { std::free(ptr); }
  void release_pages(void* ptr, size_t bytes) override {
    // Only whole pages go back; the partial pages at either end (of a buffer under 2 MiB) stay.
    const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    const auto begin = reinterpret_cast<uintptr_t>(ptr);
    const uintptr_t first = (begin + page - 1) / page * page;
    const uintptr_t last = (begin + bytes) / page * page;
    if (last > first) madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
  }
  void zero(void* ptr, size_t bytes) override {
    // A step's gradients (hundreds of MB) are zeroed every step: one thread's stores reach about
    // half of what the machine's memory takes, so large buffers are split over the team.
    constexpr size_t kPiece = size_t{1} << 20;
    const auto pieces = static_cast<int64_t>((bytes + kPiece - 1) / kPiece);
    auto* data = static_cast<char*>(ptr);
#pragma omp parallel for schedule(static) if (pieces > 1)
    for (int64_t i = 0; i < pieces; ++i) {
      const size_t at = static_cast<size_t>(i) * kPiece;
      std::memset(data + at, 0, std::min(kPiece, bytes - at));
    }
  }
};

}  // namespace

MemorySpace& host_memory() {
  static HostMemory host;
  return host;
}

void* mem_allocate(size_t bytes, MemCategory category) {
  void* ptr = host_memory().reserve(bytes, category);
  if (ptr != nullptr) charge(bytes, category);
  return ptr;
}

void mem_release(void* ptr, size_t bytes, MemCategory category) {
  if (ptr == nullptr) return;
  host_memory().unreserve(ptr, bytes);
  uncharge(bytes, category);
}

MemoryStats memory_stats() {
  MemoryStats s;
  for (int c = 0; c < kMemCategoryCount; ++c) {
    s.current[c] = g_current[c].load(std::memory_order_relaxed);
    s.peak[c] = g_peak[c].load(std::memory_order_relaxed);
  }
  s.total_current = g_total_current.load(std::memory_order_relaxed);
  s.total_peak = g_total_peak.load(std::memory_order_relaxed);
  return s;
}

void memory_reset_peak() {
  for (int c = 0; c < kMemCategoryCount; ++c) g_peak[c].store(g_current[c].load());
  g_total_peak.store(g_total_current.load());
}

Buffer::Buffer(MemorySpace& space, size_t bytes, MemCategory category, Residency residency)
    : space_(&space), data_(space.reserve(bytes, category)), bytes_(bytes), category_(category) {
  if (residency == Residency::committed) {
    charge(bytes, category);
    charged_ = bytes;
  } else {
    committed_ = false;
  }
}

Buffer::~Buffer() {
  free_storage();
}

void Buffer::free_storage() {
  if (data_ == nullptr) return;
  space_->unreserve(data_, bytes_);
  // A decommitted buffer is no longer charged: only its address space went.
  if (committed_) uncharge(charged_, category_);
}

Buffer::Buffer(Buffer&& other) noexcept
    : space_(std::exchange(other.space_, nullptr)),
      data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      category_(other.category_),
      committed_(std::exchange(other.committed_, true)),
      charged_(std::exchange(other.charged_, 0)) {}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    free_storage();
    space_ = std::exchange(other.space_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    category_ = other.category_;
    committed_ = std::exchange(other.committed_, true);
    charged_ = std::exchange(other.charged_, 0);
  }
  return *this;
}

void Buffer::decommit() {
  if (data_ == nullptr || !committed_) return;
  space_->release_pages(data_, bytes_);
  uncharge(charged_, category_);
  committed_ = false;
  charged_ = 0;
}

void Buffer::recommit(size_t bytes) {
  if (data_ == nullptr || committed_) return;
  charged_ = std::min(bytes, bytes_);
  charge(charged_, category_);
  committed_ = true;
}

void Buffer::zero() {
  if (data_ != nullptr) space_->zero(data_, bytes_);
}

}  // namespace titan
