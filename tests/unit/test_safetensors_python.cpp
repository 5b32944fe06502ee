// titan.cpp's safetensors against the real `safetensors` package (and huggingface_hub's sharded
// writer): files titan writes load in Python with equal values, files Python writes load here.
// Runs tests/reference/safetensors_roundtrip.py with $TITAN_PYTHON; a missing Python fails.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "titan/io/safetensors.h"
#include "titan/io/safetensors_writer.h"
#include "unit/test_safetensors_util.h"

namespace titan {
namespace {

using test::TempDir;

// Same formula as values() in the script.
Tensor formula(const Shape& shape, float offset = 0.0f) {
  Tensor t = Tensor::empty(shape, DType::f32, MemCategory::other);
  for (int64_t i = 0; i < t.numel(); ++i) {
    t.data<float>()[i] = static_cast<float>(i * 37 % 101 - 50) / 8.0f + offset;
  }
  return t;
}

const std::vector<float> kSpecial = {0.0f,
                                     -0.0f,
                                     1.0f + 1.0f / 256,
                                     1.0f + 3.0f / 256,
                                     65520.0f,
                                     1e-7f,
                                     -2.5f,
                                     std::numeric_limits<float>::infinity(),
                                     std::nanf("")};

// Runs the reference script; returns its exit status, output in `out`.
int run_reference(const std::string& mode, const std::string& dir, std::string& out) {
  const char* python = std::getenv("TITAN_PYTHON");
  const char* source = std::getenv("TITAN_SOURCE_DIR");
  if (python == nullptr || source == nullptr || !std::filesystem::exists(python)) {
    out = "TITAN_PYTHON / TITAN_SOURCE_DIR unset or missing (run scripts/setup.sh --python)";
    return -1;
  }
  const std::string cmd = std::string(python) + " " + source +
                          "/tests/reference/safetensors_roundtrip.py " + mode + " '" + dir +
                          "' 2>&1";
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (pipe == nullptr) return -1;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, pipe)) out.append(buf, n);
  return ::pclose(pipe);
}

TEST(SafetensorsPython, FilesWrittenByTitanLoadInSafetensors) {
  TempDir dir;
  Tensor i32 = Tensor::empty({2, 3}, DType::i32, MemCategory::other);
  for (int i = 0; i < 6; ++i) i32.data<int32_t>()[i] = -3 + i;
  Tensor i64 = Tensor::empty({2}, DType::i64, MemCategory::other);
  i64.data<int64_t>()[0] = 10;
  i64.data<int64_t>()[1] = -(int64_t{1} << 40);
  Tensor special =
      Tensor::empty({static_cast<int64_t>(kSpecial.size())}, DType::f32, MemCategory::other);
  std::memcpy(special.raw(), kSpecial.data(), special.nbytes());

  write_safetensors_file(dir / "f32.safetensors",
                         {{"w", formula({5, 7})},
                          {"scalar", formula({}, 1.0f)},
                          {"empty", formula({0, 4})},
                          {"i32", i32},
                          {"i64", i64}},
                         {});
  for (const auto& [file, dtype] :
       {std::pair{"bf16.safetensors", DType::bf16}, std::pair{"f16.safetensors", DType::f16}}) {
    SafetensorsWriteOptions o;
    o.float_dtype = dtype;
    std::vector<SafetensorsTensor> t = {{"w", formula({5, 7})}, {"special", special}};
    if (dtype == DType::bf16) t.push_back({"i64", i64});
    write_safetensors_file(dir / file, t, o);
  }
  std::vector<SafetensorsTensor> layers;
  for (int i = 0; i < 4; ++i) {
    layers.push_back({"model.layers." + std::to_string(i) + ".mlp.up_proj.weight",
                      formula({32, 16}, static_cast<float>(i))});
  }
  SafetensorsWriteOptions sharded;
  sharded.float_dtype = DType::bf16;
  sharded.max_shard_bytes = 2500;
  write_safetensors_checkpoint(dir / "sharded", layers, sharded);

  std::string out;
  ASSERT_EQ(run_reference("check", dir.path().string(), out), 0) << out;
}

TEST(SafetensorsPython, FilesWrittenBySafetensorsLoadInTitan) {
  TempDir dir;
  std::string out;
  ASSERT_EQ(run_reference("write", dir.path().string(), out), 0) << out;

  const SafetensorsFile f = SafetensorsFile::open(dir / "py_single.safetensors");
  EXPECT_EQ(f.metadata().at("who"), "python");
  const auto expect_f32 = [&](const char* name, const Tensor& want, DType stored) {
    const SafetensorsEntry* e = f.find(name);
    ASSERT_NE(e, nullptr) << name;
    EXPECT_EQ(e->dtype, stored) << name;
    EXPECT_EQ(e->shape, want.shape()) << name;
    std::vector<float> got(static_cast<size_t>(want.numel()));
    read_f32(*e, got.data(), got.size());
    for (size_t i = 0; i < got.size(); ++i) {
      const float w = want.data<float>()[i];
      const float r = stored == DType::bf16  ? bf16_to_f32(f32_to_bf16(w))
                      : stored == DType::f16 ? f16_to_f32(f32_to_f16(w))
                                             : w;
      if (std::isnan(r)) {
        EXPECT_TRUE(std::isnan(got[i])) << name << "[" << i << "]";
      } else {
        EXPECT_EQ(got[i], r) << name << "[" << i << "]";
      }
    }
  };
  expect_f32("w_bf16", formula({5, 7}), DType::bf16);
  expect_f32("w_f16", formula({3, 4}), DType::f16);
  expect_f32("w_f32", formula({2, 3, 4}, 0.5f), DType::f32);
  Tensor special =
      Tensor::empty({static_cast<int64_t>(kSpecial.size())}, DType::f32, MemCategory::other);
  std::memcpy(special.raw(), kSpecial.data(), special.nbytes());
  expect_f32("special_bf16", special, DType::bf16);
  Tensor scalar = Tensor::empty({}, DType::f32, MemCategory::other);
  scalar.data<float>()[0] = 2.5f;
  expect_f32("scalar", scalar, DType::f32);
  const SafetensorsEntry* ids = f.find("ids");
  ASSERT_NE(ids, nullptr);
  int64_t id_values[3];
  std::memcpy(id_values, ids->data, sizeof id_values);
  EXPECT_EQ(id_values[1], -(int64_t{1} << 40));
  EXPECT_EQ(f.find("mask")->dtype_name, "BOOL");

  const SafetensorsCheckpoint ckpt = SafetensorsCheckpoint::open(dir / "py_sharded");
  EXPECT_GE(ckpt.files().size(), 2u);
  EXPECT_EQ(ckpt.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    const std::string name = "model.layers." + std::to_string(i) + ".mlp.up_proj.weight";
    const Tensor want = formula({32, 16}, static_cast<float>(i));
    std::vector<float> got(512);
    read_f32(ckpt.at(name), got.data(), got.size());
    for (size_t k = 0; k < got.size(); ++k) {
      ASSERT_EQ(got[k], bf16_to_f32(f32_to_bf16(want.data<float>()[k]))) << name;
    }
  }
}

}  // namespace
}  // namespace titan
