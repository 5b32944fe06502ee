#include "titan/io/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "titan/core/error.h"

namespace titan {

MappedFile MappedFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  TITAN_CHECK(fd >= 0, path, ": cannot open: ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(path, ": not a regular file");
  }
  MappedFile file;
  file.path_ = path;
  file.size_ = static_cast<size_t>(st.st_size);
  if (file.size_ > 0) {
    void* p = ::mmap(nullptr, file.size_, PROT_READ, MAP_PRIVATE, fd, 0);
    const int err = errno;
    ::close(fd);  // the mapping keeps the file alive
    TITAN_CHECK(p != MAP_FAILED, path, ": cannot map ", file.size_, " bytes: ", std::strerror(err));
    file.data_ = static_cast<const unsigned char*>(p);
  } else {
    ::close(fd);
  }
  return file;
}

void MappedFile::advise_willneed(size_t offset, size_t length) const {
  if (data_ == nullptr || length == 0) return;
  // madvise wants a page-aligned start; widening the range to the page is harmless.
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t start = offset / page * page;
  void* addr = const_cast<unsigned char*>(data_ + start);
  // Advice only: a failure costs speed, not correctness. (Not MADV_SEQUENTIAL: it lets the
  // kernel drop pages behind the reader, which a second load of the same file then pays for.)
  (void)::madvise(addr, offset + length - start, MADV_WILLNEED);
}

void MappedFile::unmap() {
  if (data_ != nullptr) ::munmap(const_cast<unsigned char*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

MappedFile::~MappedFile() {
  unmap();
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    unmap();
    path_ = std::move(other.path_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

}  // namespace titan
