// A folder that appears complete or not at all: its files are written into a hidden sibling
// (.NAME.tmp-PID-N) that is renamed onto the final name once everything in it is complete. An
// error or a crash before commit() leaves the destination as it was.
#pragma once

#include <string>

namespace titan {

class AtomicDir {
 public:
  // Refuses (titan::Error naming `path`) a destination that exists and is not an empty folder,
  // unless `replace_if` names a file whose presence marks it as replaceable (for a model folder:
  // "config.json"); "" replaces nothing. Creates the staging folder.
  AtomicDir(std::string path, std::string replace_if);
  // Removes the staging folder unless commit() succeeded.
  ~AtomicDir();
  AtomicDir(const AtomicDir&) = delete;
  AtomicDir& operator=(const AtomicDir&) = delete;

  // Where the files go until commit().
  const std::string& staging() const { return staging_; }
  // Renames the staging folder onto the destination; a replaceable old folder is first moved aside
  // and removed afterwards. The parent folder is synced so the rename is durable. Every file inside
  // must already be synced (AtomicFile, write_file_atomic).
  void commit();

 private:
  void check_destination() const;

  std::string path_;
  std::string replace_if_;
  std::string staging_;
  bool committed_ = false;
};

}  // namespace titan
