#include "titan/io/folder_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "titan/core/error.h"

namespace titan {
namespace {

// The note's one line ("host H, pid P, since T"), at most 200 bytes of it, control bytes
// replaced; empty when there is none.
std::string read_note(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return {};
  if (line.size() > 200) line = line.substr(0, 200) + "...";
  for (char& c : line) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
  }
  return line;
}

std::string this_holder() {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) std::strcpy(host, "?");
  const std::time_t now = std::time(nullptr);
  char since[32] = "?";
  std::tm utc{};
  if (::gmtime_r(&now, &utc) != nullptr) std::strftime(since, sizeof(since), "%FT%TZ", &utc);
  std::ostringstream os;
  os << "host " << host << ", pid " << ::getpid() << ", since " << since;
  return os.str();
}

}  // namespace

std::unique_ptr<FolderLock> FolderLock::take(const std::string& folder, std::string_view what) {
  std::unique_ptr<FolderLock> lock(new FolderLock());
  const std::string note = (std::filesystem::path(folder) / kFolderLockNote).string();
  lock->fd_ = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  TITAN_CHECK(lock->fd_ >= 0, what, " ", folder,
              ": cannot open the folder to lock it: ", std::strerror(errno));
  if (::flock(lock->fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err == EWOULDBLOCK) {
      const std::string holder = read_note(note);
      fail(what, " ", folder, " is in use by another titan job (",
           holder.empty() ? std::string("its holder has not written ") + note + " yet" : holder,
           "): wait for it to end or give this run another ", what);
    }
    lock->warning = std::string(what) + " " + folder + ": cannot lock it (" + std::strerror(err) +
                    "); a second job started on it would not be refused";
    return lock;
  }
  const std::string stale = read_note(note);
  if (!stale.empty()) {
    lock->warning = std::string(what) + " " + folder + ": taking over the lock left by " + stale +
                    ", which ended without releasing it";
  }
  {
    std::ofstream out(note, std::ios::trunc);
    out << this_holder() << "\n";
    TITAN_CHECK(out.good(), what, " ", folder, ": cannot write ", note);
  }
  lock->note_ = note;
  return lock;
}

FolderLock::~FolderLock() {
  if (!note_.empty()) {
    std::error_code ec;
    std::filesystem::remove(note_, ec);  // nothing to do about a failure here; the lock is free
  }
  if (fd_ >= 0) ::close(fd_);  // releases the flock
}

}  // namespace titan
