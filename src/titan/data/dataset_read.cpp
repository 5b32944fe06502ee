#include "titan/data/dataset_read.h"

#include <glob.h>
#include <zlib.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <new>
#include <set>

#include "titan/core/error.h"
#include "titan/io/byte_size.h"

namespace titan {

namespace fs = std::filesystem;

namespace {

bool is_glob(const std::string& s) {
  return s.find_first_of("*?[") != std::string::npos;
}

bool hidden(const fs::path& p) {
  const std::string name = p.filename().string();
  return !name.empty() && name[0] == '.';
}

// What a path that is neither a folder nor a regular file is, as the refusal names it: missing,
// a dangling symbolic link, a symbolic link loop, or a special file titan does not read data from.
[[noreturn]] void refuse_path(const std::string& path) {
  std::error_code ec;
  const fs::file_status link = fs::symlink_status(path, ec);
  if (!fs::exists(link)) fail(path, ": no such file or directory");
  const fs::file_status target = fs::status(path, ec);
  if (ec == std::errc::too_many_symbolic_link_levels) {
    fail(path, ": a symbolic link loop (it never reaches a file)");
  }
  if (fs::is_symlink(link) && !fs::exists(target)) {
    std::error_code read_ec;
    const fs::path to = fs::read_symlink(path, read_ec);
    fail(path, ": a symbolic link to ", read_ec ? std::string("?") : to.string(),
         ", which does not exist");
  }
  const char* kind = fs::is_fifo(target)             ? "a FIFO (named pipe)"
                     : fs::is_character_file(target) ? "a character device"
                     : fs::is_block_file(target)     ? "a block device"
                     : fs::is_socket(target)         ? "a socket"
                                                     : "not a regular file";
  fail(path, ": ", kind, ", not a regular file or folder (datasets are read from regular files)");
}

void add_directory(const fs::path& dir, std::vector<std::string>& out) {
  std::error_code ec;
  const fs::path root = fs::canonical(dir, ec);
  TITAN_CHECK(!ec, dir.string(), ": cannot list: ", ec.message());
  auto it =
      fs::recursive_directory_iterator(dir, fs::directory_options::follow_directory_symlink, ec);
  TITAN_CHECK(!ec, dir.string(), ": cannot list: ", ec.message());
  for (; it != fs::recursive_directory_iterator(); it.increment(ec)) {
    TITAN_CHECK(!ec, dir.string(), ": cannot list: ", ec.message());
    const fs::path& path = it->path();
    if (hidden(path)) {
      if (it->is_directory(ec)) it.disable_recursion_pending();
      continue;
    }
    std::error_code entry_ec;
    const bool symlink = it->is_symlink(entry_ec);
    const fs::file_status target = fs::status(path, entry_ec);
    if (entry_ec == std::errc::too_many_symbolic_link_levels) {
      fail(path.string(), ": a symbolic link loop (it never reaches a file)");
    }
    if (symlink && fs::is_directory(target)) {
      // A link to the folder listed or to one holding it would be followed forever.
      const fs::path to = fs::canonical(path, entry_ec);
      const fs::path from = fs::canonical(path.parent_path(), entry_ec);
      const std::string to_s = to.string(), from_s = from.string();
      const bool loop = !entry_ec && (from_s == to_s || from_s.starts_with(to_s + "/") ||
                                      to_s == root.string() || to == fs::path("/"));
      if (loop) {
        fail(path.string(), ": a symbolic link to ", to_s,
             ", a folder that holds it (a loop); remove the link or name the files");
      }
    }
    if (fs::is_regular_file(target)) out.push_back(path.string());
  }
}

void add_glob(const std::string& pattern, std::vector<std::string>& out) {
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  if (rc == GLOB_NOMATCH) {
    ::globfree(&g);
    fail(pattern, ": the pattern matches no files");
  }
  if (rc != 0) {
    ::globfree(&g);
    fail(pattern, ": cannot expand the pattern");
  }
  size_t n_files = 0;
  for (size_t i = 0; i < g.gl_pathc; ++i) {
    std::error_code ec;
    if (fs::is_regular_file(g.gl_pathv[i], ec)) {
      out.push_back(g.gl_pathv[i]);
      ++n_files;
    }
  }
  ::globfree(&g);
  TITAN_CHECK(n_files > 0, pattern, ": the pattern matches no regular files");
}

}  // namespace

std::vector<std::string> expand_data_paths(const std::vector<std::string>& specs) {
  TITAN_CHECK(!specs.empty(), "no dataset paths given");
  std::vector<std::string> files;
  for (const std::string& spec : specs) {
    std::error_code ec;
    const size_t before = files.size();
    const fs::file_status status = fs::status(spec, ec);
    if (fs::is_directory(status)) {
      add_directory(spec, files);
      TITAN_CHECK(files.size() > before, spec, ": the directory holds no files");
    } else if (fs::is_regular_file(status)) {
      files.push_back(spec);
    } else if (is_glob(spec)) {
      add_glob(spec, files);
    } else {
      refuse_path(spec);
    }
  }
  // Compare canonical paths: "d/x" and "./d/x" are the same file read twice.
  std::set<std::string> seen;
  for (const std::string& f : files) {
    std::error_code ec;
    const fs::path canonical = fs::weakly_canonical(f, ec);
    TITAN_CHECK(seen.insert(ec ? f : canonical.string()).second, f,
                ": named more than once by the dataset paths (its data would be read twice)");
  }
  std::sort(files.begin(), files.end());
  return files;
}

uint64_t gunzip_limit() {
  const char* text = std::getenv(kGunzipLimitVariable);
  return text == nullptr ? kDefaultGunzipLimit : parse_byte_size(text, kGunzipLimitVariable);
}

std::string gunzip(std::string_view compressed, const std::string& name, uint64_t max_bytes) {
  z_stream zs{};
  // 15 + 16: a gzip wrapper (not zlib or raw deflate), the largest window.
  TITAN_CHECK(inflateInit2(&zs, 15 + 16) == Z_OK, name, ": cannot initialise zlib");
  const struct InflateEnd {
    z_stream& zs;
    ~InflateEnd() { inflateEnd(&zs); }
  } inflate_end{zs};
  // Inflated a piece at a time, so the output grows only by what the stream really holds and
  // stops at the limit, whatever ratio the compressed bytes claim.
  std::vector<char> piece(size_t{1} << 20);
  std::string out;
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(compressed.data()));
  zs.avail_in = 0;
  size_t consumed = 0;  // compressed bytes handed to zlib so far
  const auto compressed_offset = [&] { return consumed - zs.avail_in; };
  for (;;) {
    if (zs.avail_in == 0 && consumed < compressed.size()) {
      // avail_in is 32-bit: feed at most 1 GiB at a time.
      const size_t n = std::min<size_t>(compressed.size() - consumed, size_t{1} << 30);
      zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(compressed.data() + consumed));
      zs.avail_in = static_cast<uInt>(n);
      consumed += n;
    }
    zs.next_out = reinterpret_cast<Bytef*>(piece.data());
    zs.avail_out = static_cast<uInt>(piece.size());
    const int rc = inflate(&zs, Z_NO_FLUSH);
    const size_t produced = piece.size() - zs.avail_out;
    if (out.size() + produced > max_bytes) {
      fail(name, ": decompresses to more than ", max_bytes,
           " bytes, the limit for one gzip file (set ", kGunzipLimitVariable,
           ", e.g. to 64GiB, to raise it, or split the file)");
    }
    out.append(piece.data(), produced);
    if (rc == Z_STREAM_END) {
      // Another member may follow (files made by `cat a.gz b.gz`); anything else is not gzip.
      const size_t at = compressed_offset();
      if (at == compressed.size()) break;
      TITAN_CHECK(is_gzip(compressed.substr(at)), name,
                  ": bytes after the end of the gzip stream at compressed offset ", at,
                  " are not gzip data");
      inflateReset(&zs);
      continue;
    }
    if (rc == Z_OK) continue;
    if (rc == Z_BUF_ERROR && zs.avail_in == 0 && consumed == compressed.size()) {
      fail(name, ": truncated gzip stream (the data ends at compressed offset ",
           compressed_offset(), " before the stream does)");
    }
    if (rc == Z_BUF_ERROR) continue;  // no progress possible this round: more input or output
    fail(name, ": corrupt gzip data near compressed offset ", compressed_offset(), " (",
         zs.msg ? zs.msg : "error " + std::to_string(rc), ")");
  }
  return out;
}

std::string read_data_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TITAN_CHECK(in, path, ": cannot open");
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  in.seekg(0);
  try {
    std::string bytes(static_cast<size_t>(std::max<std::streamoff>(size, 0)), '\0');
    in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    TITAN_CHECK(in.good() || bytes.empty(), path, ": read failed");
    return is_gzip(bytes) ? gunzip(bytes, path, gunzip_limit()) : bytes;
  } catch (const std::bad_alloc&) {
    fail(path, ": out of memory reading the file (", size, " bytes on disk)");
  }
}

std::string data_file_kind_name(const std::string& path) {
  std::string name = fs::path(path).filename().string();
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (name.ends_with(".gz")) name.resize(name.size() - 3);
  return name;
}

}  // namespace titan
