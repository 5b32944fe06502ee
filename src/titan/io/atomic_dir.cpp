#include "titan/io/atomic_dir.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "titan/core/error.h"

namespace titan {
namespace fs = std::filesystem;
namespace {

// A sibling of `path` named .NAME.TAG-PID-N, distinct across threads and processes.
std::string sibling_name(const fs::path& path, const char* tag) {
  static std::atomic<unsigned> counter{0};
  std::string name = ".";
  name += path.filename().string();
  name += tag;
  name += std::to_string(::getpid());
  name += '-';
  name += std::to_string(counter++);
  return (path.parent_path() / name).string();
}

// "out/", "./out" and "out" are the same folder; the last component must be a real name.
fs::path normalized(const std::string& path) {
  fs::path p = fs::absolute(fs::path(path)).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  TITAN_CHECK(!p.filename().empty() && p.filename() != "..", path, ": not a folder name");
  return p;
}

void sync_folder(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  TITAN_CHECK(fd >= 0, dir.string(), ": cannot open to sync: ", std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  TITAN_CHECK(rc == 0, dir.string(), ": cannot sync: ", std::strerror(err));
}

}  // namespace

AtomicDir::AtomicDir(std::string path, std::string replace_if)
    : path_(normalized(path).string()), replace_if_(std::move(replace_if)) {
  check_destination();
  const fs::path final_path(path_);
  std::error_code ec;
  fs::create_directories(final_path.parent_path(), ec);
  TITAN_CHECK(!ec, final_path.parent_path().string(), ": cannot create the folder: ", ec.message());
  staging_ = sibling_name(final_path, ".tmp-");
  fs::create_directory(staging_, ec);
  TITAN_CHECK(!ec, path_, ": cannot create the staging folder ", staging_, ": ", ec.message());
}

AtomicDir::~AtomicDir() {
  if (committed_) return;
  std::error_code ec;  // best effort: a destructor must not throw
  fs::remove_all(staging_, ec);
}

void AtomicDir::check_destination() const {
  std::error_code ec;
  const fs::file_status st = fs::symlink_status(path_, ec);
  if (!fs::exists(st)) return;
  const bool folder = fs::is_directory(st);
  if (folder && fs::is_empty(path_, ec) && !ec) return;
  const bool replaceable =
      folder && !replace_if_.empty() && fs::is_regular_file(fs::path(path_) / replace_if_);
  TITAN_CHECK(replaceable, path_, ": already exists and is not an empty folder",
              replace_if_.empty() ? "; choose a new destination or ask to overwrite it"
                                  : " holding " + replace_if_ + ", so it is not replaced");
}

void AtomicDir::commit() {
  check_destination();  // again: the destination may have appeared since the constructor
  const fs::path final_path(path_);
  std::error_code ec;
  std::string old;
  if (fs::exists(fs::symlink_status(final_path, ec)) && !fs::is_empty(final_path, ec)) {
    old = sibling_name(final_path, ".old-");
    fs::rename(final_path, old, ec);
    TITAN_CHECK(!ec, path_, ": cannot move the old folder aside: ", ec.message());
  }
  // rename(2) replaces an empty folder in one step.
  fs::rename(staging_, final_path, ec);
  if (ec && !old.empty()) {
    std::error_code restore;
    fs::rename(old, final_path, restore);
  }
  TITAN_CHECK(!ec, path_, ": cannot rename ", staging_, " into place: ", ec.message());
  committed_ = true;
  sync_folder(final_path.parent_path());
  if (!old.empty()) {
    fs::remove_all(old, ec);
    TITAN_CHECK(!ec, path_, ": replaced, but the old folder ", old,
                " could not be removed: ", ec.message());
  }
}

}  // namespace titan
