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

// Address space only: no page is touched, nothing is charged.
void* allocate_uncharged(size_t bytes, MemCategory category) {
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

}  // namespace

void* mem_allocate(size_t bytes, MemCategory category) {
  void* ptr = allocate_uncharged(bytes, category);
  if (ptr != nullptr) charge(bytes, category);
  return ptr;
}

void mem_release(void* ptr, size_t bytes, MemCategory category) {
  if (ptr == nullptr) return;
  std::free(ptr);
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

Buffer::Buffer(size_t bytes, MemCategory category, Residency residency)
    : bytes_(bytes), category_(category) {
  if (residency == Residency::committed) {
    data_ = mem_allocate(bytes, category);
    charged_ = bytes;
  } else {
    data_ = allocate_uncharged(bytes, category);
    committed_ = false;
  }
}

Buffer::~Buffer() {
  free_storage();
}

void Buffer::free_storage() {
  // A decommitted buffer is no longer charged: only its address space goes.
  if (committed_) {
    mem_release(data_, charged_, category_);
  } else {
    std::free(data_);
  }
}

Buffer::Buffer(Buffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      category_(other.category_),
      committed_(std::exchange(other.committed_, true)),
      charged_(std::exchange(other.charged_, 0)) {}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    free_storage();
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
  // Only whole pages go back; the partial pages at either end (of a buffer under 2 MiB) stay.
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<uintptr_t>(data_);
  const uintptr_t first = (begin + page - 1) / page * page;
  const uintptr_t last = (begin + bytes_) / page * page;
  if (last > first) madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
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
  if (data_ == nullptr) return;
  // A step's gradients (hundreds of MB) are zeroed every step: one thread's stores reach about
  // half of what the machine's memory takes, so large buffers are split over the team.
  constexpr size_t kPiece = size_t{1} << 20;
  const auto pieces = static_cast<int64_t>((bytes_ + kPiece - 1) / kPiece);
  auto* bytes = static_cast<char*>(data_);
#pragma omp parallel for schedule(static) if (pieces > 1)
  for (int64_t i = 0; i < pieces; ++i) {
    const size_t at = static_cast<size_t>(i) * kPiece;
    std::memset(bytes + at, 0, std::min(kPiece, bytes_ - at));
  }
}

}  // namespace titan
