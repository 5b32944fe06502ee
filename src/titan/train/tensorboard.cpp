#include "titan/train/tensorboard.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "titan/core/error.h"
#include "titan/io/crc32c.h"

namespace titan {
namespace {

// Protocol buffers' wire format, the little of it an Event needs: each field a key (its number
// and wire type) followed by a varint, 8 or 4 little-endian bytes, or a length and the bytes.
enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void put_key(std::string& out, uint32_t field, WireType type) {
  put_varint(out, (uint64_t{field} << 3) | type);
}

void put_little_endian(std::string& out, uint64_t bits, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
}

void put_double(std::string& out, uint32_t field, double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  put_key(out, field, kFixed64);
  put_little_endian(out, bits, 8);
}

void put_float(std::string& out, uint32_t field, float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  put_key(out, field, kFixed32);
  put_little_endian(out, bits, 4);
}

void put_int64(std::string& out, uint32_t field, int64_t v) {
  put_key(out, field, kVarint);
  put_varint(out, static_cast<uint64_t>(v));  // negative: ten bytes, two's complement
}

void put_bytes(std::string& out, uint32_t field, const std::string& bytes) {
  put_key(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out += bytes;
}

// tensorflow/core/util/event.proto and framework/summary.proto's field numbers.
constexpr uint32_t kEventWallTime = 1, kEventStep = 2, kEventFileVersion = 3, kEventSummary = 5;
constexpr uint32_t kSummaryValue = 1;
constexpr uint32_t kValueTag = 1, kValueSimpleValue = 2;

// An Event with its wall time (seconds since the epoch) and step; `what` its one payload field.
std::string event(int64_t step, uint32_t what, const std::string& payload) {
  const double wall_time =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::string e;
  put_double(e, kEventWallTime, wall_time);
  put_int64(e, kEventStep, step);
  put_bytes(e, what, payload);
  return e;
}

// TFRecord's masked CRC: a CRC stored beside data that may hold CRCs itself.
uint32_t masked_crc32c(const void* data, size_t n) {
  const uint32_t crc = crc32c(data, n);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string hostname() {
  char name[256] = {};
  TITAN_CHECK(gethostname(name, sizeof name - 1) == 0,
              "TensorBoard: cannot read this machine's hostname for the event file's name: ",
              std::strerror(errno));
  return name;
}

}  // namespace

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  TITAN_CHECK(!ec, "metrics.save_tb_folder: cannot create ", dir, ": ", ec.message());
  char stamp[16];
  std::snprintf(stamp, sizeof stamp, "%010lld",
                static_cast<long long>(std::chrono::duration_cast<std::chrono::seconds>(
                                           std::chrono::system_clock::now().time_since_epoch())
                                           .count()));
  path_ = dir + "/events.out.tfevents." + stamp + "." + hostname() + "." +
          std::to_string(static_cast<long long>(getpid()));
  file_ = std::fopen(path_.c_str(), "wbx");  // never onto another writer's file
  TITAN_CHECK(file_ != nullptr, "metrics.save_tb_folder: cannot create the event file ", path_,
              ": ", std::strerror(errno));
  write_record(event(0, kEventFileVersion, "brain.Event:2"));
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

void TensorBoardWriter::add_scalars(int64_t step,
                                    const std::vector<std::pair<std::string, double>>& scalars) {
  std::string summary;
  for (const auto& [tag, value] : scalars) {
    std::string v;
    put_bytes(v, kValueTag, tag);
    put_float(v, kValueSimpleValue, static_cast<float>(value));
    put_bytes(summary, kSummaryValue, v);
  }
  write_record(event(step, kEventSummary, summary));
}

void TensorBoardWriter::write_record(const std::string& data) {
  std::string record;
  put_little_endian(record, data.size(), 8);
  const uint32_t length_crc = masked_crc32c(record.data(), 8);
  put_little_endian(record, length_crc, 4);
  record += data;
  put_little_endian(record, masked_crc32c(data.data(), data.size()), 4);
  const bool written = std::fwrite(record.data(), 1, record.size(), file_) == record.size() &&
                       std::fflush(file_) == 0;
  TITAN_CHECK(written, "TensorBoard: cannot write to ", path_, ": ", std::strerror(errno));
}

}  // namespace titan
