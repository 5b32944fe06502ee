// safetensors reader and writer: the spec's byte-exact examples, round trips through every
// dtype, sharding, atomic writes, and every bad input of issue 3 ending in a one-line error.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>

#include "error_of.h"
#include "titan/io/atomic_file.h"
#include "titan/io/convert.h"
#include "titan/io/file_checksum.h"
#include "titan/io/safetensors.h"
#include "titan/io/safetensors_writer.h"
#include "unit/test_safetensors_util.h"

namespace titan {
namespace {

using test::expect_error;
using test::f32_tensor;
using test::raw_safetensors;
using test::read_bytes;
using test::ScratchDir;
using test::write_bytes;

SafetensorsWriteOptions no_metadata() {
  SafetensorsWriteOptions o;
  o.metadata.clear();
  return o;
}

std::string header_of(const std::vector<unsigned char>& bytes) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[i];
  return std::string(bytes.begin() + 8, bytes.begin() + 8 + static_cast<std::ptrdiff_t>(n));
}

// The checkpoints' file checksum: CRC-32C's check value, and a file spanning several read blocks
// with an unaligned tail against a plain bit-at-a-time CRC-32C.
TEST(FileChecksum, IsCrc32c) {
  const test::ScratchDir dir("checksum");
  std::ofstream(dir / "check") << "123456789";
  EXPECT_EQ(file_checksum(dir / "check"), "crc32c:e3069283");
  std::ofstream(dir / "empty").flush();
  EXPECT_EQ(file_checksum(dir / "empty"), "crc32c:00000000");
  std::string bytes((size_t{9} << 20) + 3, '\0');
  std::mt19937 rng(7);
  for (char& c : bytes) c = static_cast<char>(rng());
  std::ofstream(dir / "big", std::ios::binary) << bytes;
  uint32_t crc = 0xffffffffu;
  for (const char c : bytes) {
    crc ^= static_cast<unsigned char>(c);
    for (int k = 0; k < 8; ++k) crc = (crc & 1) != 0 ? (crc >> 1) ^ 0x82f63b78u : crc >> 1;
  }
  char expected[32];
  std::snprintf(expected, sizeof(expected), "crc32c:%08x", crc ^ 0xffffffffu);
  EXPECT_EQ(file_checksum(dir / "big"), expected);
  EXPECT_EQ(file_checksum_cached(dir / "big"), expected);
  EXPECT_EQ(test::error_of([&] {
              file_checksum(dir / "missing");
            }).rfind(dir / "missing: cannot read", 0),
            0u);
}

TEST(SafetensorsWriter, MatchesSpecExampleWithoutPadding) {
  ScratchDir dir;
  write_safetensors_file(dir / "a.safetensors", {{"attn.0", f32_tensor({1, 2, 3})}}, no_metadata());
  const auto bytes = read_bytes(dir / "a.safetensors");
  ASSERT_EQ(bytes.size(), 8u + 64u + 24u);
  EXPECT_EQ(bytes[0], 64);
  EXPECT_EQ(header_of(bytes),
            R"({"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}})");
}

TEST(SafetensorsWriter, PadsHeaderWithSpacesToEightBytes) {
  ScratchDir dir;
  write_safetensors_file(dir / "a.safetensors", {{"attn0", f32_tensor({1, 1, 2, 3})}},
                         no_metadata());
  const auto bytes = read_bytes(dir / "a.safetensors");
  const std::string header = header_of(bytes);
  ASSERT_EQ(header.size(), 72u);
  EXPECT_EQ(header.substr(65), std::string(7, ' '));
  EXPECT_EQ(bytes.size(), 8u + 72u + 24u);
}

TEST(SafetensorsWriter, WritesFormatPtMetadataByDefault) {
  ScratchDir dir;
  write_safetensors_file(dir / "a.safetensors", {{"w", f32_tensor({2})}}, {});
  const SafetensorsFile f = SafetensorsFile::open(dir / "a.safetensors");
  EXPECT_EQ(f.metadata(), (std::map<std::string, std::string>{{"format", "pt"}}));
  EXPECT_TRUE(header_of(read_bytes(dir / "a.safetensors")).starts_with(R"({"__metadata__":)"));
}

TEST(SafetensorsWriter, OrderIsElementSizeThenNameWhateverTheCallerOrder) {
  ScratchDir dir;
  Tensor ids = Tensor::empty({3}, DType::i64, MemCategory::other);
  for (int i = 0; i < 3; ++i) ids.data<int64_t>()[i] = 10 + i;
  const std::vector<SafetensorsTensor> a = {
      {"b", f32_tensor({4})}, {"a", f32_tensor({2, 2}, 1)}, {"ids", ids}};
  const std::vector<SafetensorsTensor> b = {a[2], a[1], a[0]};
  SafetensorsWriteOptions bf16;
  bf16.float_dtype = DType::bf16;
  write_safetensors_file(dir / "a.safetensors", a, bf16);
  write_safetensors_file(dir / "b.safetensors", b, bf16);
  EXPECT_EQ(read_bytes(dir / "a.safetensors"), read_bytes(dir / "b.safetensors"));
  const SafetensorsFile f = SafetensorsFile::open(dir / "a.safetensors");
  ASSERT_EQ(f.entries().size(), 3u);
  EXPECT_EQ(f.entries()[0].name, "ids");  // I64 (8 bytes) first, still I64
  EXPECT_EQ(f.entries()[0].dtype, DType::i64);
  EXPECT_EQ(f.entries()[1].name, "a");
  EXPECT_EQ(f.entries()[2].name, "b");
  EXPECT_EQ(f.entries()[2].dtype, DType::bf16);
}

TEST(SafetensorsReader, RoundTripsEveryDtypeZeroCopy) {
  ScratchDir dir;
  Tensor i32 = Tensor::empty({2, 3}, DType::i32, MemCategory::other);
  for (int i = 0; i < 6; ++i) i32.data<int32_t>()[i] = -3 + i;
  const Tensor w = f32_tensor({5, 7});
  write_safetensors_file(
      dir / "a.safetensors",
      {{"w", w}, {"scalar", f32_tensor({})}, {"empty", f32_tensor({0, 4})}, {"i32", i32}}, {});
  const SafetensorsFile f = SafetensorsFile::open(dir / "a.safetensors");
  ASSERT_EQ(f.entries().size(), 4u);
  const SafetensorsEntry* e = f.find("w");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->shape, (Shape{5, 7}));
  EXPECT_EQ(e->dtype_name, "F32");
  EXPECT_EQ(e->file, dir / "a.safetensors");
  EXPECT_EQ(std::memcmp(e->data, w.raw(), w.nbytes()), 0);
  EXPECT_EQ(f.find("scalar")->shape, Shape{});
  EXPECT_EQ(f.find("scalar")->nbytes, 4u);
  EXPECT_EQ(f.find("empty")->nbytes, 0u);
  EXPECT_EQ(std::memcmp(f.find("i32")->data, i32.raw(), 24), 0);
  EXPECT_EQ(f.find("nope"), nullptr);
  // Zero copy: entries point into one contiguous mapping at their offsets.
  const auto* base = static_cast<const unsigned char*>(f.entries().front().data);
  for (const SafetensorsEntry& entry : f.entries()) {
    EXPECT_EQ(static_cast<const unsigned char*>(entry.data), base + entry.begin) << entry.name;
  }
}

TEST(SafetensorsReader, ConvertsFloatsToF32WithTorchRounding) {
  ScratchDir dir;
  const std::vector<float>& special = test::kSpecialFloats;
  const Tensor src = test::special_f32_tensor();
  for (DType stored : {DType::f32, DType::bf16, DType::f16}) {
    SafetensorsWriteOptions o;
    o.float_dtype = stored;
    write_safetensors_file(dir / "a.safetensors", {{"x", src}}, o);
    const SafetensorsFile f = SafetensorsFile::open(dir / "a.safetensors");
    std::vector<float> back(special.size());
    read_f32(*f.find("x"), back.data(), back.size());
    for (size_t i = 0; i < special.size(); ++i) {
      float expected = special[i];
      if (stored == DType::bf16) expected = bf16_to_f32(f32_to_bf16(special[i]));
      if (stored == DType::f16) expected = f16_to_f32(f32_to_f16(special[i]));
      if (std::isnan(expected)) {
        EXPECT_TRUE(std::isnan(back[i]));
      } else {
        EXPECT_EQ(back[i], expected) << dtype_name(stored) << " element " << i;
        EXPECT_EQ(std::signbit(back[i]), std::signbit(expected));
      }
    }
  }
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 1.0f / 256)), 1.0f);
  EXPECT_TRUE(std::isinf(f16_to_f32(f32_to_f16(65520.0f))));
}

TEST(SafetensorsReader, LargeConversionsMatchElementwise) {
  // Above the threading threshold, with a length that is not a multiple of the chunk.
  const size_t n = (1 << 20) + 12345;
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = std::sin(static_cast<float>(i) * 0.001f) * 300.0f;
  std::vector<uint16_t> h(n);
  std::vector<float> back(n);
  for (DType t : {DType::bf16, DType::f16}) {
    convert_from_f32(x.data(), n, t, h.data());
    convert_to_f32(h.data(), t, n, back.data());
    for (size_t i = 0; i < n; i += 997) {
      const uint16_t one = t == DType::bf16 ? f32_to_bf16(x[i]) : f32_to_f16(x[i]);
      ASSERT_EQ(h[i], one) << i;
      ASSERT_EQ(back[i], t == DType::bf16 ? bf16_to_f32(one) : f16_to_f32(one)) << i;
    }
    ASSERT_EQ(h[n - 1], t == DType::bf16 ? f32_to_bf16(x[n - 1]) : f32_to_f16(x[n - 1]));
  }
  std::vector<uint16_t> f16(n);
  convert_float(h.data(), DType::f16, n, f16.data(), DType::bf16);
  EXPECT_EQ(f16[n - 1], f32_to_bf16(f16_to_f32(h[n - 1])));
}

TEST(SafetensorsReader, CountsNonFiniteValuesInEveryFloatDtype) {
  // Above the threading threshold; NaN, +Inf, -Inf at both ends and mid-chunk, beside the largest
  // finite values (all exponent bits but one set), which must not count.
  const size_t n = (1 << 20) + 7;
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> x(n, 1.0f);
  x[0] = std::nanf("");
  x[70000] = inf;
  x[n - 1] = -inf;
  x[1] = bf16_to_f32(0x7f7f);  // the largest finite bf16 (+Inf as f16)
  x[2] = 65504.0f;             // the largest finite f16
  std::vector<uint16_t> h(n);
  for (DType t : {DType::bf16, DType::f16}) {
    convert_from_f32(x.data(), n, t, h.data());
    const size_t f16_max_rounds_to_inf = t == DType::f16 ? 1 : 0;  // x[1]
    EXPECT_EQ(count_nonfinite(h.data(), t, n), 3 + f16_max_rounds_to_inf) << dtype_name(t);
    // Unaligned, and only a prefix.
    std::vector<unsigned char> shifted(2 * n + 1);
    std::memcpy(shifted.data() + 1, h.data(), 2 * n);
    EXPECT_EQ(count_nonfinite(shifted.data() + 1, t, 2), 1 + f16_max_rounds_to_inf);
  }
  EXPECT_EQ(count_nonfinite(x.data(), DType::f32, n), 3u);
  EXPECT_EQ(count_nonfinite(x.data() + 1, DType::f32, 100), 0u);
  expect_error([&] { count_nonfinite(x.data(), DType::i32, 1); }, {"I32"});
}

TEST(SafetensorsReader, AcceptsAnyEntryOrderAndUnalignedData) {
  ScratchDir dir;
  // Listed out of data order; a 1-byte-misaligned data start, as unpadded writers produce.
  const std::string header =
      R"({"b":{"dtype":"BF16","shape":[2],"data_offsets":[4,8]},)"
      R"("a":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]}, "__metadata__":{"k":"v"}})";
  ASSERT_NE(header.size() % 2, 0u);
  const std::vector<unsigned char> data = {0x80, 0x3f, 0x00, 0x40, 0x40, 0x40, 0x80, 0xbf};
  write_bytes(dir / "u.safetensors", raw_safetensors(header, data));
  const SafetensorsFile f = SafetensorsFile::open(dir / "u.safetensors");
  EXPECT_EQ(f.entries()[0].name, "a");
  EXPECT_EQ(f.metadata().at("k"), "v");
  float b[2];
  read_f32(*f.find("b"), b, 2);
  EXPECT_EQ(b[0], 3.0f);
  EXPECT_EQ(b[1], -1.0f);
}

TEST(SafetensorsReader, RecognisesNonComputeDtypesByName) {
  ScratchDir dir;
  const std::string header = R"({"m":{"dtype":"BOOL","shape":[3],"data_offsets":[0,3]},)"
                             R"("d":{"dtype":"F64","shape":[1],"data_offsets":[3,11]}})";
  write_bytes(dir / "x.safetensors", raw_safetensors(header, std::vector<unsigned char>(11)));
  const SafetensorsFile f = SafetensorsFile::open(dir / "x.safetensors");
  EXPECT_EQ(f.find("m")->dtype_name, "BOOL");
  EXPECT_FALSE(f.find("m")->dtype.has_value());
  double d;
  expect_error([&] { read_f32(*f.find("d"), reinterpret_cast<float*>(&d), 1); },
               {"x.safetensors", "\"d\"", "F64"});
}

// ---- sharded checkpoints ----

std::vector<SafetensorsTensor> model_like_tensors() {
  std::vector<SafetensorsTensor> t;
  t.push_back({"model.embed_tokens.weight", f32_tensor({64, 16})});  // 4096 bytes in bf16 -> 2048
  for (int i = 0; i < 3; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    t.push_back({p + "mlp.up_proj.weight", f32_tensor({32, 16}, static_cast<float>(i))});
    t.push_back({p + "input_layernorm.weight", f32_tensor({16}, 1)});
  }
  t.push_back({"model.norm.weight", f32_tensor({16}, 2)});
  return t;
}

TEST(SafetensorsCheckpoint, SingleFileWhenItFits) {
  ScratchDir dir;
  const auto tensors = model_like_tensors();
  const auto files = write_safetensors_checkpoint(dir.path().string(), tensors, {});
  EXPECT_EQ(files, std::vector<std::string>{"model.safetensors"});
  const SafetensorsCheckpoint ckpt = SafetensorsCheckpoint::open(dir.path().string());
  EXPECT_EQ(ckpt.size(), tensors.size());
  EXPECT_EQ(ckpt.path(), dir / "model.safetensors");
  for (const SafetensorsTensor& t : tensors) {
    const SafetensorsEntry& e = ckpt.at(t.name);
    EXPECT_EQ(e.shape, t.tensor.shape());
    EXPECT_EQ(std::memcmp(e.data, t.tensor.raw(), t.tensor.nbytes()), 0) << t.name;
  }
}

TEST(SafetensorsCheckpoint, ShardsAtTheConfiguredSizeWithIndex) {
  ScratchDir dir;
  const auto tensors = model_like_tensors();
  SafetensorsWriteOptions o;
  o.float_dtype = DType::bf16;
  o.max_shard_bytes = 2200;  // embed (2048) alone; each layer's 1024 + 32 bytes pair up
  const auto files = write_safetensors_checkpoint(dir.path().string(), tensors, o);
  ASSERT_GE(files.size(), 3u);
  EXPECT_EQ(files.back(), "model.safetensors.index.json");
  const size_t k = files.size() - 1;
  char expected[64];
  std::snprintf(expected, sizeof expected, "model-%05zu-of-%05zu.safetensors", k, k);
  EXPECT_EQ(files[k - 1], expected);
  EXPECT_EQ(files[0], "model-00001-of-0000" + std::to_string(k) + ".safetensors");

  std::ifstream in(dir / "model.safetensors.index.json");
  const nlohmann::json index = nlohmann::json::parse(in);
  size_t total = 0;
  for (const auto& t : tensors) total += static_cast<size_t>(t.tensor.numel()) * 2;
  EXPECT_EQ(index["metadata"]["total_size"].get<size_t>(), total);
  EXPECT_EQ(index["weight_map"]["model.embed_tokens.weight"], files[0]);
  EXPECT_EQ(index["weight_map"].size(), tensors.size());
  for (size_t i = 0; i + 1 < files.size(); ++i) {
    const auto bytes = std::filesystem::file_size(dir / files[i]);
    const SafetensorsFile shard = SafetensorsFile::open(dir / files[i]);
    size_t data = 0;
    for (const auto& e : shard.entries()) data += e.nbytes;
    EXPECT_TRUE(data <= o.max_shard_bytes || shard.entries().size() == 1) << files[i] << bytes;
  }

  const SafetensorsCheckpoint ckpt = SafetensorsCheckpoint::open(dir.path().string());
  EXPECT_EQ(ckpt.path(), dir / "model.safetensors.index.json");
  EXPECT_EQ(ckpt.files().size(), k);
  EXPECT_EQ(ckpt.data_bytes(), total);
  EXPECT_EQ(ckpt.names().size(), tensors.size());
  for (const SafetensorsTensor& t : tensors) {
    std::vector<float> back(static_cast<size_t>(t.tensor.numel()));
    read_f32(ckpt.at(t.name), back.data(), back.size());
    for (size_t i = 0; i < back.size(); ++i) {
      ASSERT_EQ(back[i], bf16_to_f32(f32_to_bf16(t.tensor.data<float>()[i]))) << t.name;
    }
  }
  // Opening the index file itself gives the same checkpoint.
  EXPECT_EQ(SafetensorsCheckpoint::open(dir / "model.safetensors.index.json").size(),
            tensors.size());
  expect_error([&] { (void)ckpt.at("lm_head.weight"); },
               {"model.safetensors.index.json", "\"lm_head.weight\"", "missing"});
}

TEST(SafetensorsCheckpoint, ReexportOfTheOtherKindRemovesTheStaleEntryPoint) {
  ScratchDir dir;
  const auto tensors = model_like_tensors();
  SafetensorsWriteOptions small;
  small.max_shard_bytes = 3000;
  write_safetensors_checkpoint(dir.path().string(), tensors, small);
  ASSERT_TRUE(std::filesystem::exists(dir / "model.safetensors.index.json"));
  write_safetensors_checkpoint(dir.path().string(), tensors, {});
  EXPECT_FALSE(std::filesystem::exists(dir / "model.safetensors.index.json"));
  EXPECT_EQ(SafetensorsCheckpoint::open(dir.path().string()).path(), dir / "model.safetensors");
  write_safetensors_checkpoint(dir.path().string(), tensors, small);
  EXPECT_FALSE(std::filesystem::exists(dir / "model.safetensors"));
}

// Tensors in a device's memory, which the host cannot read: their data pointers here are
// addresses in the never-mapped first page, so a direct read would crash the test. copy_to_host
// resolves them into the host tensors they stand for; the files must be byte-equal to those written
// from the host tensors, each tensor copied once, whole, after its before_read.
TEST(SafetensorsCheckpoint, DeviceTensorsReadThroughCopyToHostGiveTheSameBytes) {
  const auto host = model_like_tensors();
  std::vector<SafetensorsTensor> device;
  for (size_t i = 0; i < host.size(); ++i) {
    device.push_back({host[i].name, Tensor::view(reinterpret_cast<void*>(16 * (i + 1)),
                                                 host[i].tensor.shape(), DType::f32)});
  }
  for (const bool sharded : {false, true}) {
    SafetensorsWriteOptions o;
    o.float_dtype = DType::bf16;
    if (sharded) o.max_shard_bytes = 2200;
    ScratchDir from_host, from_device;
    const auto files = write_safetensors_checkpoint(from_host.path().string(), host, o);
    std::vector<size_t> copied;
    size_t announced = SIZE_MAX;
    o.before_read = [&](size_t i) { announced = i; };
    o.copy_to_host = [&](void* host_dst, const void* src, size_t bytes) {
      const size_t i = reinterpret_cast<uintptr_t>(src) / 16 - 1;
      ASSERT_LT(i, host.size());
      EXPECT_EQ(i, announced);
      EXPECT_EQ(bytes, host[i].tensor.nbytes()) << host[i].name;
      std::memcpy(host_dst, host[i].tensor.raw(), bytes);
      copied.push_back(i);
    };
    EXPECT_EQ(write_safetensors_checkpoint(from_device.path().string(), device, o), files);
    EXPECT_EQ(copied, safetensors_read_order(host, o));
    for (const std::string& f : files) {
      EXPECT_EQ(read_bytes(from_device / f), read_bytes(from_host / f)) << f << " " << sharded;
    }
  }
}

// ---- atomic writes ----

size_t files_in(const std::filesystem::path& dir) {
  return static_cast<size_t>(std::distance(std::filesystem::directory_iterator(dir),
                                           std::filesystem::directory_iterator()));
}

TEST(AtomicFile, NothingAppearsUntilCommitAndNothingStaysOnAbandon) {
  ScratchDir dir;
  {
    AtomicFile f(dir / "out.bin");
    f.write("abc", 3);
    EXPECT_FALSE(std::filesystem::exists(dir / "out.bin"));
    EXPECT_EQ(files_in(dir.path()), 1u);  // the temporary, in the same folder
  }
  EXPECT_EQ(files_in(dir.path()), 0u);
  write_file_atomic(dir / "out.bin", "old");
  {
    AtomicFile f(dir / "out.bin");
    f.write("new!", 4);
  }
  EXPECT_EQ(read_bytes(dir / "out.bin"), (std::vector<unsigned char>{'o', 'l', 'd'}));
  write_file_atomic(dir / "out.bin", "new");
  EXPECT_EQ(read_bytes(dir / "out.bin"), (std::vector<unsigned char>{'n', 'e', 'w'}));
  EXPECT_EQ(files_in(dir.path()), 1u);
}

TEST(SafetensorsWriter, RefusesBadInputBeforeTouchingTheDestination) {
  ScratchDir dir;
  const Tensor w = f32_tensor({2});
  expect_error(
      [&] {
        write_safetensors_file(dir / "a.safetensors", {{"w", w}, {"w", w}}, {});
      },
      {"a.safetensors", "\"w\"", "twice"});
  SafetensorsWriteOptions ints;
  ints.float_dtype = DType::i32;
  expect_error(
      [&] {
        write_safetensors_file(dir / "a.safetensors", {{"w", w}}, ints);
      },
      {"a.safetensors", "I32"});
  expect_error(
      [&] {
        write_safetensors_file(dir / "missing/a.safetensors", {{"w", w}}, {});
      },
      {"missing/a.safetensors", "cannot create"});
  EXPECT_EQ(files_in(dir.path()), 0u);
}

// ---- bad input: every case ends in one line naming the file, the tensor or field, the fault ----

class SafetensorsBadInput : public ::testing::Test {
 protected:
  // Writes `bytes` and expects opening to fail with a message holding the file name and `parts`.
  void expect_refused(const std::vector<unsigned char>& bytes,
                      std::initializer_list<std::string> parts) {
    const std::string path = dir_ / "bad.safetensors";
    write_bytes(path, bytes);
    std::vector<std::string> all = {"bad.safetensors"};
    all.insert(all.end(), parts.begin(), parts.end());
    try {
      (void)SafetensorsFile::open(path);
      ADD_FAILURE() << "accepted; expected an error mentioning " << *parts.begin();
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
      for (const std::string& p : all) {
        EXPECT_NE(what.find(p), std::string::npos) << "'" << p << "' missing in: " << what;
      }
    }
  }
  static std::vector<unsigned char> zeros(size_t n) { return std::vector<unsigned char>(n); }
  static std::string entry(const std::string& name, const std::string& dtype,
                           const std::string& shape, size_t begin, size_t end) {
    return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape +
           ",\"data_offsets\":[" + std::to_string(begin) + "," + std::to_string(end) + "]}";
  }
  ScratchDir dir_;
};

TEST_F(SafetensorsBadInput, TruncatedFile) {
  expect_refused({1, 0, 0}, {"truncated"});
  expect_refused({}, {"truncated"});
  // A valid file cut inside its data: the last tensor runs past the end.
  const auto good = raw_safetensors("{" + entry("w", "F32", "[4]", 0, 16) + "}", zeros(16));
  expect_refused(std::vector<unsigned char>(good.begin(), good.end() - 3),
                 {"\"w\"", "outside the data buffer"});
}

TEST_F(SafetensorsBadInput, HeaderLengthLargerThanTheFile) {
  const std::string h = "{" + entry("w", "F32", "[1]", 0, 4) + "}";
  expect_refused(raw_safetensors(h, zeros(4), h.size() + 100), {"header length", "file size"});
  expect_refused(raw_safetensors(h, zeros(4), 100'000'001), {"header length", "limit"});
  expect_refused(raw_safetensors(h, zeros(4), ~uint64_t{0}), {"header length"});
}

TEST_F(SafetensorsBadInput, HeaderThatIsNotJson) {
  expect_refused(raw_safetensors("{\"w\": [1, 2", {}), {"not valid JSON"});
  expect_refused(raw_safetensors("[1, 2, 3]", {}), {"does not start with '{'"});
  expect_refused(raw_safetensors("{} trailing", {}), {"not valid JSON"});
  expect_refused(raw_safetensors("{\"w\": \"\xff\"}", {}), {"not valid JSON"});
  expect_refused(raw_safetensors("{\"w\": {\"a\": [[[1]]]}}", {}), {"nests deeper"});
  expect_refused(raw_safetensors("{\"w\": 3}", {}), {"\"w\"", "not an object"});
}

TEST_F(SafetensorsBadInput, OffsetsOutOfRange) {
  expect_refused(raw_safetensors("{" + entry("w", "F32", "[2]", 8, 16) + "}", zeros(8)),
                 {"\"w\"", "outside the data buffer"});
  expect_refused(raw_safetensors("{" + entry("w", "F32", "[1]", 0, 4) + "}", zeros(6)),
                 {"trailing data"});
  expect_refused(
      raw_safetensors("{" + entry("w", "F32", "[1]", 18446744073709551612u, 0) + "}", zeros(4)),
      {"\"w\"", "out of order"});
}

TEST_F(SafetensorsBadInput, OverlappingGappedAndReversedTensors) {
  expect_refused(raw_safetensors("{" + entry("a", "F32", "[2]", 0, 8) + "," +
                                     entry("b", "F32", "[2]", 4, 12) + "}",
                                 zeros(12)),
                 {"\"b\"", "overlap"});
  expect_refused(raw_safetensors("{" + entry("a", "F32", "[1]", 0, 4) + "," +
                                     entry("b", "F32", "[1]", 8, 12) + "}",
                                 zeros(12)),
                 {"\"b\"", "gap"});
  expect_refused(raw_safetensors("{" + entry("a", "F32", "[1]", 4, 0) + "}", zeros(4)),
                 {"\"a\"", "out of order"});
  expect_refused(raw_safetensors("{" + entry("a", "F32", "[1]", 4, 8) + "}", zeros(8)),
                 {"\"a\"", "gap after byte 0"});
}

TEST_F(SafetensorsBadInput, UnknownDtype) {
  expect_refused(raw_safetensors("{" + entry("w", "F33", "[1]", 0, 4) + "}", zeros(4)),
                 {"\"w\"", "unknown dtype", "F33"});
  expect_refused(raw_safetensors("{" + entry("w", "F4", "[2]", 0, 1) + "}", zeros(1)),
                 {"\"w\"", "unknown dtype", "F4"});
}

TEST_F(SafetensorsBadInput, ShapeThatDisagreesWithTheByteRange) {
  expect_refused(raw_safetensors("{" + entry("w", "BF16", "[2,3]", 0, 8) + "}", zeros(8)),
                 {"\"w\"", "[2, 3]", "BF16", "needs 12 bytes", "span 8"});
  expect_refused(raw_safetensors("{" + entry("w", "F32", "[-1]", 0, 4) + "}", zeros(4)),
                 {"\"w\"", "shape", "non-negative integer"});
  expect_refused(raw_safetensors("{" + entry("w", "F32", "[1.0]", 0, 4) + "}", zeros(4)),
                 {"\"w\"", "shape"});
  expect_refused(
      raw_safetensors("{" + entry("w", "F32", "[4294967296,4294967296]", 0, 4) + "}", zeros(4)),
      {"\"w\"", "overflows"});
}

TEST_F(SafetensorsBadInput, MissingAndUnknownFields) {
  expect_refused(raw_safetensors(R"({"w":{"dtype":"F32","shape":[1]}})", {}),
                 {"\"w\"", "data_offsets is missing"});
  expect_refused(raw_safetensors(R"({"w":{"shape":[0],"data_offsets":[0,0]}})", {}),
                 {"\"w\"", "dtype is missing"});
  expect_refused(
      raw_safetensors(R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[0,0],"x":1}})", {}),
      {"\"w\"", "unknown field", "\"x\""});
  expect_refused(raw_safetensors(R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[0]}})", {}),
                 {"\"w\"", "data_offsets must be [begin, end]"});
}

TEST_F(SafetensorsBadInput, DuplicateNames) {
  expect_refused(raw_safetensors("{" + entry("w", "F32", "[1]", 0, 4) + "," +
                                     entry("w", "F32", "[1]", 4, 8) + "}",
                                 zeros(8)),
                 {"\"w\"", "twice"});
  expect_refused(raw_safetensors(R"({"w":{"dtype":"F32","dtype":"F16","shape":[0],)"
                                 R"("data_offsets":[0,0]}})",
                                 {}),
                 {"\"dtype\"", "twice"});
}

TEST_F(SafetensorsBadInput, MetadataThatIsNotStringToString) {
  expect_refused(raw_safetensors(R"({"__metadata__":{"format":1}})", {}),
                 {"__metadata__", "\"format\"", "not a string"});
  expect_refused(raw_safetensors(R"({"__metadata__":[1]})", {}), {"__metadata__"});
}

TEST_F(SafetensorsBadInput, NamesWithControlCharactersStayOnOneLine) {
  expect_refused(raw_safetensors("{" + entry("a\\nb", "F99", "[1]", 0, 4) + "}", zeros(4)),
                 {"\"a\\nb\"", "F99"});
}

TEST_F(SafetensorsBadInput, MissingFileAndDirectory) {
  expect_error([&] { (void)SafetensorsFile::open(dir_ / "none.safetensors"); },
               {"none.safetensors", "cannot open"});
  expect_error([&] { (void)SafetensorsFile::open(dir_.path().string()); }, {"not a regular file"});
  expect_error([&] { (void)SafetensorsCheckpoint::open(dir_.path().string()); },
               {"no model.safetensors.index.json and no model.safetensors"});
}

class ShardedBadInput : public ::testing::Test {
 protected:
  void SetUp() override {
    SafetensorsWriteOptions o;
    o.max_shard_bytes = 3000;
    files_ = write_safetensors_checkpoint(dir_.path().string(), model_like_tensors(), o);
    ASSERT_GE(files_.size(), 3u);
  }
  nlohmann::json index() const {
    std::ifstream in(dir_ / "model.safetensors.index.json");
    return nlohmann::json::parse(in);
  }
  void set_index(const std::string& text) const {
    write_file_atomic(dir_ / "model.safetensors.index.json", text);
  }
  void expect_refused(std::initializer_list<std::string> parts) const {
    std::vector<std::string> all = {"model.safetensors.index.json"};
    all.insert(all.end(), parts.begin(), parts.end());
    try {
      (void)SafetensorsCheckpoint::open(dir_.path().string());
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
      for (const std::string& p : all) EXPECT_NE(what.find(p), std::string::npos) << what;
    }
  }
  ScratchDir dir_;
  std::vector<std::string> files_;
};

TEST_F(ShardedBadInput, IndexNamingAMissingShard) {
  std::filesystem::remove(dir_ / files_[1]);
  expect_refused({"shard", files_[1], "missing"});
}

TEST_F(ShardedBadInput, IndexListingATensorTheShardLacks) {
  nlohmann::json j = index();
  j["weight_map"]["lm_head.weight"] = files_[0];
  set_index(j.dump());
  expect_refused({"\"lm_head.weight\"", "missing from shard", files_[0]});
}

TEST_F(ShardedBadInput, ShardTensorTheIndexDoesNotList) {
  nlohmann::json j = index();
  j["weight_map"].erase("model.norm.weight");
  set_index(j.dump());
  expect_refused({"\"model.norm.weight\"", "not listed in the index"});
}

TEST_F(ShardedBadInput, TensorInTheWrongShard) {
  const SafetensorsFile shard = SafetensorsFile::open(dir_ / files_[1]);
  ASSERT_GE(shard.entries().size(), 2u);
  const std::string moved = shard.entries()[0].name;
  nlohmann::json j = index();
  j["weight_map"][moved] = files_[2];
  set_index(j.dump());
  expect_refused({"\"" + moved + "\"", "index names", files_[2]});
}

TEST_F(ShardedBadInput, IndexThatIsNotAnIndex) {
  set_index("{\"weight_map\": ");
  expect_refused({"not valid JSON"});
  set_index("{\"metadata\": {}}");
  expect_refused({"weight_map is missing"});
  set_index(R"({"weight_map": {"a": 3}})");
  expect_refused({"\"a\"", "not a file name"});
  set_index(R"({"weight_map": {"a": "../../etc/passwd"}})");
  expect_refused({"\"a\"", "not a file inside the folder"});
}

TEST_F(ShardedBadInput, CorruptShardNamesTheShard) {
  std::vector<unsigned char> bytes = read_bytes(dir_ / files_[0]);
  ASSERT_FALSE(bytes.empty());
  bytes.pop_back();  // one byte short (resize(size - 1) trips GCC 12's -Wstringop-overflow)
  write_bytes(dir_ / files_[0], bytes);
  try {
    (void)SafetensorsCheckpoint::open(dir_.path().string());
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(files_[0]), std::string::npos) << e.what();
  }
}

TEST(SafetensorsReadF32, RefusesAWrongElementCount) {
  ScratchDir dir;
  write_safetensors_file(dir / "a.safetensors", {{"w", f32_tensor({2, 3})}}, {});
  const SafetensorsFile f = SafetensorsFile::open(dir / "a.safetensors");
  std::vector<float> dst(5);
  expect_error([&] { read_f32(*f.find("w"), dst.data(), dst.size()); },
               {"a.safetensors", "\"w\"", "6 elements", "[2, 3]", "expected 5"});
}

}  // namespace
}  // namespace titan
