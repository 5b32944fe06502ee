// One job per folder: an advisory lock a training run holds on its job.dump_folder for its whole
// life, so a second run started on the same folder is refused at start-up instead of interleaving
// its checkpoints and export with the first's.
//
// The lock is flock(2) on the folder itself (nothing is created to take it), released by the
// kernel when the process ends however it ends -- a crash or SIGKILL included, so a stale lock
// cannot block a later run. Beside it the holder writes `.titan.lock` in the folder (host, pid,
// start time), which a refused run quotes, and removes it when it lets go; one left by a holder
// that was killed is recognised (the lock is free) and taken over with a warning. Where the
// file system cannot flock a folder (some network file systems), the run goes on with a warning
// saying a second job would not be refused.
#pragma once

#include <memory>
#include <string>
#include <string_view>

namespace titan {

// The holder's note beside the lock.
inline constexpr std::string_view kFolderLockNote = ".titan.lock";

class FolderLock {
 public:
  // Locks `folder` (an existing folder) for this process, or throws titan::Error "<what> <folder>
  // is in use by another titan job (<the holder's note>): ..." when another process holds it.
  // `warning` is set (one line) when a stale note was taken over or the folder cannot be locked.
  static std::unique_ptr<FolderLock> take(const std::string& folder, std::string_view what);
  ~FolderLock();  // removes the note, then unlocks
  FolderLock(const FolderLock&) = delete;
  FolderLock& operator=(const FolderLock&) = delete;

  std::string warning;

 private:
  FolderLock() = default;
  int fd_ = -1;
  std::string note_;  // the note's path, empty when none was written
};

}  // namespace titan
