#include "titan/io/atomic_dir.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "titan/core/error.h"
#include "titan/io/atomic_file.h"
#include "titan/io/file_checksum.h"
#include "titan/io/json_util.h"

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

// Why the existing folder `dir` is not one titan may replace with `content`, or "" when it is:
// its marker names titan, `content` and every entry in it.
std::string why_not_replaceable(const fs::path& dir, const std::string& content) {
  const fs::path marker = dir / kTitanMarker;
  if (!fs::is_regular_file(marker))
    return "titan did not write it (no " + std::string(kTitanMarker) + ")";
  nlohmann::json meta;
  try {
    meta = read_json_file(marker.string(), "titan folder marker", 4);
  } catch (const Error& e) {
    return e.what();
  }
  if (!meta.is_object() || meta.value("written_by", nlohmann::json()) != "titan" ||
      !meta.value("content", nlohmann::json()).is_string() ||
      !meta.value("files", nlohmann::json()).is_array()) {
    return marker.string() + " is not a titan marker";
  }
  if (meta["content"] != content) {
    return "it holds a " + meta["content"].get<std::string>() + ", not a " + content;
  }
  std::set<std::string> files = {std::string(kTitanMarker)};
  for (const nlohmann::json& f : meta["files"]) {
    if (f.is_string()) files.insert(f.get<std::string>());
  }
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (!files.contains(name) || !entry.is_regular_file()) {
      return "it holds " + json_quote(name) + ", which titan did not write there";
    }
  }
  if (ec) return "it cannot be listed: " + ec.message();
  return "";
}

// The marker naming `content` and every file in `staging`, with each file's checksum (read back
// from the page cache: about 0.5 s per GiB).
void write_marker(const std::string& staging, const std::string& content) {
  std::set<std::string> files;  // sorted: the same marker for the same files
  nlohmann::json checksums = nlohmann::json::object();
  for (const fs::directory_entry& entry : fs::directory_iterator(staging)) {
    const std::string name = entry.path().filename().string();
    files.insert(name);
    checksums[name] = file_checksum(entry.path().string());
  }
  const nlohmann::json meta = {
      {"written_by", "titan"}, {"content", content}, {"files", files}, {"checksums", checksums}};
  write_file_atomic((fs::path(staging) / kTitanMarker).string(), meta.dump(2) + "\n");
}

// `path` made absolute, with symbolic links resolved as far as it exists.
fs::path resolved(const std::string& path) {
  std::error_code ec;
  fs::path p = fs::weakly_canonical(fs::absolute(fs::path(path)), ec);
  if (ec) p = fs::absolute(fs::path(path)).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  return p;
}

// True when `inner` is `outer` or lies under it, component by component.
bool contains(const fs::path& outer, const fs::path& inner) {
  auto o = outer.begin(), i = inner.begin();
  for (; o != outer.end(); ++o, ++i) {
    if (i == inner.end() || *o != *i) return false;
  }
  return true;
}

}  // namespace

void check_destination_apart(const std::string& destination, const std::string& source,
                             std::string_view what) {
  if (source.empty()) return;
  const fs::path dst = resolved(destination), src = resolved(source);
  TITAN_CHECK(dst != src, destination, ": is ", what, " ", source,
              "; writing there would replace what is being read: choose another destination");
  TITAN_CHECK(!contains(src, dst), destination, ": lies inside ", what, " ", source,
              "; choose a destination outside it");
  TITAN_CHECK(!contains(dst, src), destination, ": holds ", what, " ", source,
              "; choose a destination that does not contain it");
}

AtomicDir::AtomicDir(std::string path, std::string content, bool replace)
    : path_(normalized(path).string()), content_(std::move(content)), replace_(replace) {
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

void check_atomic_dir_destination(const std::string& path, const std::string& content,
                                  bool replace) {
  const std::string dir = normalized(path).string();
  std::error_code ec;
  const fs::file_status st = fs::symlink_status(dir, ec);
  if (!fs::exists(st)) return;
  const bool folder = fs::is_directory(st);
  if (folder && fs::is_empty(dir, ec) && !ec) return;
  TITAN_CHECK(replace, dir,
              ": already exists and is not an empty folder; choose a new destination or ask to "
              "overwrite it");
  TITAN_CHECK(folder, dir, ": already exists and is not a folder, so it is not replaced");
  const std::string why = why_not_replaceable(dir, content);
  TITAN_CHECK(why.empty(), dir, ": already exists and is not an empty folder, and ", why,
              ", so it is not replaced (titan replaces only a ", content,
              " folder it wrote itself, as its ", kTitanMarker, " lists)");
}

void AtomicDir::check_destination() const {
  check_atomic_dir_destination(path_, content_, replace_);
}

void ensure_writable_folder(const std::string& path, std::string_view what) {
  std::error_code ec;
  TITAN_CHECK(!fs::exists(path, ec) || fs::is_directory(path, ec), what, " ", path,
              ": is a file, not a folder");
  fs::create_directories(path, ec);
  TITAN_CHECK(!ec, what, " ", path, ": cannot create the folder: ", ec.message());
  const fs::path probe = sibling_name(fs::path(path) / "write-probe", ".tmp-");
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  TITAN_CHECK(fd >= 0, what, " ", path, ": cannot create a file in it: ", std::strerror(errno));
  ::close(fd);
  fs::remove(probe, ec);
  TITAN_CHECK(!ec, what, " ", path, ": cannot remove the probe file ", probe.string(), ": ",
              ec.message());
}

void AtomicDir::commit() {
  write_marker(staging_, content_);
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

void check_titan_folder_checksums(const std::string& dir, const std::vector<std::string>& names) {
  const fs::path marker = fs::path(dir) / kTitanMarker;
  if (!fs::is_regular_file(marker)) return;  // not written by titan
  const nlohmann::json meta = read_json_file(marker.string(), "titan folder marker", 4);
  if (!meta.is_object() || meta.value("written_by", nlohmann::json()) != "titan") return;
  if (!meta.contains("checksums")) return;  // written by a titan from before checksums
  const nlohmann::json& checksums = meta["checksums"];
  TITAN_CHECK(checksums.is_object(), marker.string(),
              ": \"checksums\" is not an object of file names");
  for (const std::string& name : names) {
    const std::string path = (fs::path(dir) / name).string();
    const auto it = checksums.find(name);
    TITAN_CHECK(it != checksums.end() && it->is_string(), path, ": not among the files ",
                marker.string(), " records checksums for: the folder was changed after titan ",
                "wrote it (a folder re-saved by other tools: remove its ", kTitanMarker, ")");
    const std::string sum = file_checksum_cached(path);
    TITAN_CHECK(sum == it->get<std::string>(), path, ": checksum mismatch (", sum, ", ",
                kTitanMarker, " records ", it->get<std::string>(),
                "): the file was changed or damaged after titan wrote it (a folder re-saved by ",
                "other tools: remove its ", kTitanMarker, ")");
  }
}

}  // namespace titan
