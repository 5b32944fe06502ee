// Host memory with accounting: every byte the engine holds is charged to a category, so the
// trainer can report current and peak memory of parameters, gradients, optimizer state and
// activations separately.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace titan {

enum class MemCategory : int { parameters, gradients, optimizer, activations, other };
constexpr int kMemCategoryCount = 5;

std::string_view mem_category_name(MemCategory c);

struct MemoryStats {
  std::array<size_t, kMemCategoryCount> current{};  // bytes held now
  std::array<size_t, kMemCategoryCount> peak{};     // per-category high-water mark
  size_t total_current = 0;
  size_t total_peak = 0;  // high-water mark of the sum, not the sum of the peaks
};

// 64-byte aligned allocation charged to `category`; throws titan::Error when out of memory.
void* mem_allocate(size_t bytes, MemCategory category);
void mem_release(void* ptr, size_t bytes, MemCategory category);
MemoryStats memory_stats();
void memory_reset_peak();

// Where a Buffer's bytes live: the host's memory (host_memory()), or a device's (its backend's
// Backend::memory(), backend/backend.h). The accounting is the Buffer's, the same in every space.
class MemorySpace {
 public:
  virtual ~MemorySpace() = default;
  virtual const char* name() const = 0;
  // `bytes` of address space (null for 0), aligned for any element type; throws titan::Error
  // naming `category` when out of memory. Whether its pages are backed before first use is the
  // space's own matter: nothing here reads them.
  virtual void* reserve(size_t bytes, MemCategory category) = 0;
  virtual void unreserve(void* ptr, size_t bytes) = 0;
  // Hands the pages of [ptr, ptr + bytes) back, the address range staying reserved: a later use
  // writes before it reads (Buffer::decommit).
  virtual void release_pages(void* ptr, size_t bytes) = 0;
  virtual void zero(void* ptr, size_t bytes) = 0;
};

// The host's memory: huge-page aligned and advised above 2 MiB, pages handed back with
// madvise(MADV_DONTNEED), zeroed by the OpenMP team.
MemorySpace& host_memory();

// Whether a new Buffer is charged and usable at once, or starts as if decommitted (FSDP's whole
// units, which exist only while in flight: not one of their pages is touched before recommit).
enum class Residency { committed, released };

// Owning, move-only block of accounted memory in one MemorySpace.
class Buffer {
 public:
  Buffer() = default;
  Buffer(MemorySpace& space, size_t bytes, MemCategory category,
         Residency residency = Residency::committed);
  ~Buffer();
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  MemCategory category() const { return category_; }
  MemorySpace* space() const { return space_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  void zero();
  // Hands the buffer's pages back to the OS and stops charging them: FSDP's whole parameters and
  // gradients of a unit exist only while it is in flight. The contents are lost, the address
  // stays valid; recommit charges the bytes again (write before reading: the contents are
  // undefined, zero pages or what the partial end pages held).
  void decommit();
  // `bytes` (default all): only that many are charged, for the parts of the buffer the caller
  // touches until the next decommit -- the parameters a unit in flight or bf16 inference reads in
  // fp32 (ParamGroup::acquire_params_where); the other pages stay unbacked.
  void recommit(size_t bytes = SIZE_MAX);
  bool committed() const { return committed_; }

 private:
  void free_storage();

  MemorySpace* space_ = nullptr;
  void* data_ = nullptr;
  size_t bytes_ = 0;
  MemCategory category_ = MemCategory::other;
  bool committed_ = true;
  size_t charged_ = 0;  // while committed: the bytes charged (bytes_ but after a partial recommit)
};

}  // namespace titan
