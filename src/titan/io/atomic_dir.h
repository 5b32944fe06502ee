// A folder that appears complete or not at all: its files are written into a hidden sibling
// (.NAME.tmp-PID-N) that is renamed onto the final name once everything in it is complete. An
// error or a crash before commit() leaves the destination as it was.
//
// Every folder committed holds a marker, titan.json ({"written_by": "titan", "content": KIND,
// "files": [...], "checksums": {NAME: "crc32c:..."}}), naming what it holds and every file titan
// wrote there with its checksum (io/file_checksum.h), which loads verify. Replacing an existing
// folder is allowed only when its marker says titan wrote it, with the same kind of content, and
// the folder holds nothing else: what titan did not write is never removed.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace titan {

// The marker's file name.
inline constexpr std::string_view kTitanMarker = "titan.json";

class AtomicDir {
 public:
  // `content` is the kind of folder ("model", "tokenizer"). Refuses (titan::Error naming `path`)
  // a destination that exists and is not an empty folder, unless `replace` is set and the
  // destination is a folder titan wrote with that content and nothing added. Creates the staging
  // folder.
  AtomicDir(std::string path, std::string content, bool replace);
  // Removes the staging folder unless commit() succeeded.
  ~AtomicDir();
  AtomicDir(const AtomicDir&) = delete;
  AtomicDir& operator=(const AtomicDir&) = delete;

  // Where the files go until commit().
  const std::string& staging() const { return staging_; }
  // Writes the marker, renames the staging folder onto the destination; a replaceable old folder
  // is first moved aside and removed afterwards. The parent folder is synced so the rename is
  // durable. Every file inside must already be synced (AtomicFile, write_file_atomic).
  void commit();

 private:
  void check_destination() const;

  std::string path_;
  std::string content_;
  bool replace_ = false;
  std::string staging_;
  bool committed_ = false;
};

// What the constructor checks, for a caller that must know before its work begins whether the
// folder it will commit at the end can go to `path`.
void check_atomic_dir_destination(const std::string& path, const std::string& content,
                                  bool replace);

// Creates the folder `path` (and its parents) if needed and proves it writable by creating and
// removing a file in it; otherwise a titan::Error naming `what` ("job.dump_folder") and `path`.
void ensure_writable_folder(const std::string& path, std::string_view what);

// When the folder `dir` holds a titan marker recording checksums, each of `names` (files in `dir`)
// must hold the bytes it records: titan::Error naming the file otherwise ("checksum mismatch", or
// a file the marker does not record). A folder without a marker, or whose marker predates
// checksums, passes; an unreadable marker is an error naming it.
void check_titan_folder_checksums(const std::string& dir, const std::vector<std::string>& names);

// Refuses (titan::Error) a `destination` that is the `source` path, lies inside it, or holds it:
// writing there would replace or remove what is being read. `what` names the source in the
// message ("the source model folder"). Symbolic links are resolved for the parts that exist.
void check_destination_apart(const std::string& destination, const std::string& source,
                             std::string_view what);

}  // namespace titan
