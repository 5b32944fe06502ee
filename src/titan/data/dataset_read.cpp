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

namespace {

bool starts_with_bytes(std::string_view bytes, std::string_view magic, size_t at = 0) {
  return bytes.size() >= at + magic.size() && bytes.substr(at, magic.size()) == magic;
}

uint64_t little_endian_u64(std::string_view bytes) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i)
    v = v << 8 | static_cast<unsigned char>(bytes[static_cast<size_t>(i)]);
  return v;
}

}  // namespace

std::string binary_data_kind(std::string_view bytes, const std::string& path) {
  using namespace std::string_view_literals;
  // Built by appending: GCC 12 warns (-Wrestrict, falsely) on "'" + std::string.
  std::string in(1, '\''), out(1, '\'');
  in.append(path).push_back('\'');
  out.append(fs::path(path).stem().string()).append(".jsonl'");
  const std::string unpack = ", then give titan the text or JSON Lines inside";
  const std::string rows = ": write its rows as JSON Lines (one {\"text\": ...} per line) first";
  if (starts_with_bytes(bytes, "PAR1")) {
    return "a Parquet file, not text: convert it to JSON Lines first, e.g. python -c \"import "
           "datasets; datasets.Dataset.from_parquet(" +
           in + ").to_json(" + out + ")\"";
  }
  if (starts_with_bytes(bytes, "ARROW1")) {
    return "an Apache Arrow (Feather) file, not text: convert it to JSON Lines first, e.g. python "
           "-c \"import pyarrow.feather as f; f.read_table(" +
           in + ").to_pandas().to_json(" + out + ", orient='records', lines=True)\"";
  }
  // The Arrow IPC stream (Hugging Face datasets' cache files): a continuation marker, then the
  // schema message's length.
  if (starts_with_bytes(bytes, "\xff\xff\xff\xff"sv) && bytes.size() >= 8) {
    return "an Apache Arrow stream (a Hugging Face datasets cache file?), not text: convert it to "
           "JSON Lines first, e.g. python -c \"import datasets; "
           "datasets.Dataset.from_file(" +
           in + ").to_json(" + out + ")\"";
  }
  if (bytes.size() >= 10 && bytes[8] == '{' && little_endian_u64(bytes) + 8 <= bytes.size() &&
      bytes.substr(8, std::min<size_t>(little_endian_u64(bytes), 4096)).find("\"dtype\"") !=
          std::string_view::npos) {
    return "a safetensors file (tensors, e.g. model weights), not text: a dataset is text, JSON "
           "Lines or a titan token file (titan tokenize --bin)";
  }
  if (starts_with_bytes(bytes, "PK\x03\x04"sv) || starts_with_bytes(bytes, "PK\x05\x06"sv)) {
    return "a zip archive, not text: unzip it and give titan the files inside (JSON Lines, JSON or "
           "text)";
  }
  if (starts_with_bytes(bytes, "ustar", 257)) {
    return "a tar archive, not text: unpack it (tar xf) and give titan the files inside";
  }
  if (starts_with_bytes(bytes, "BZh")) return "bzip2-compressed, not text: bunzip2 it" + unpack;
  if (starts_with_bytes(bytes,
                        "\xfd"
                        "7zXZ\0"sv))
    return "xz-compressed, not text: unxz it" + unpack;
  if (starts_with_bytes(bytes, "\x28\xb5\x2f\xfd"sv)) {
    return "zstd-compressed, not text: unzstd it" + unpack;
  }
  if (starts_with_bytes(bytes, "7z\xbc\xaf\x27\x1c"sv)) {
    return "a 7-Zip archive, not text: unpack it and give titan the files inside";
  }
  if (starts_with_bytes(bytes, "\x93NUMPY"sv)) {
    return "a NumPy array (.npy), not text: write its token ids as titan's token file or as JSON "
           "Lines {\"ids\": [...]}";
  }
  if (starts_with_bytes(bytes, "\x89HDF\r\n\x1a\n"sv)) return "an HDF5 file, not text" + rows;
  if (starts_with_bytes(bytes, "SQLite format 3\0"sv)) {
    return "an SQLite database, not text" + rows;
  }
  if (starts_with_bytes(bytes,
                        "\x7f"
                        "ELF"sv))
    return "an executable (ELF), not data";
  return "";
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
    // Binary data read as text would train on its bytes without a word: refused by its magic,
    // also inside gzip (a compressed tar, a Parquet file saved as .txt.gz).
    const std::string kind = binary_data_kind(bytes, path);
    TITAN_CHECK(kind.empty(), path, ": ", kind);
    if (!is_gzip(bytes)) return bytes;
    std::string text = gunzip(bytes, path, gunzip_limit());
    const std::string inner = binary_data_kind(text, path);
    TITAN_CHECK(inner.empty(), path, ": gzip-compressed; inside, ", inner);
    return text;
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
