// RoPE's cos/sin cache against Transformers' LlamaRotaryEmbedding
// (tests/reference/rope_reference.py via $TITAN_PYTHON; a missing Python fails): Llama 3.x's llama3
// scaling and default RoPE, read from the config.json LlamaConfig writes, at positions up to the
// last the model allows.
#include <gtest/gtest.h>

#include <algorithm>

#include "compare.h"
#include "titan/io/safetensors.h"
#include "titan/models/hf_config.h"
#include "titan/ops/rope.h"
#include "unit/python_runner.h"
#include "unit/test_safetensors_util.h"

namespace titan {
namespace {

using testing::expect_close;

TEST(RopePython, CacheMatchesLlamaRotaryEmbedding) {
  test::ScratchDir dir;
  const test::PythonRun run = test::run_python_script("rope_reference.py", {dir.path().string()});
  ASSERT_EQ(run.status, 0) << run.output;
  for (const char* name : {"llama3_8b", "llama3_1b", "llama3_odd", "default"}) {
    const ModelArgs args = read_hf_config(dir / name);
    EXPECT_EQ(args.rope_scaling.type, std::string(name) == "default" ? "default" : "llama3");
    const SafetensorsFile ref = SafetensorsFile::open(dir / name + "/rope.safetensors");
    const SafetensorsEntry* positions = ref.find("positions");
    ASSERT_NE(positions, nullptr) << name;
    const auto* pos = static_cast<const int32_t*>(positions->data);
    const int64_t n = positions->numel(), hd = args.head_dim, half = hd / 2;
    const RopeCache cache = rope_cache_build(args.rope(), args.max_position_embeddings);
    for (const char* table : {"cos", "sin"}) {
      std::vector<float> want(n * hd), got(n * hd);
      read_f32(*ref.find(table), want.data(), want.size());
      const float* mine = std::string(table) == "cos" ? cache.cos() : cache.sin();
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_LT(pos[i], cache.max_positions) << name;
        const float* row = mine + static_cast<int64_t>(pos[i]) * half;
        std::copy(row, row + half, got.begin() + i * hd);  // HF repeats the hd/2 angles
        std::copy(row, row + half, got.begin() + i * hd + half);
      }
      // cos and sin of the same fp32 angles differ by the libm's last-place rounding only; an
      // inverse frequency one ulp off moves the angles at position 131071 by ~1e-5 and more.
      expect_close(std::string(name) + " " + table, got.data(), want.data(), n * hd, 1e-6);
    }
  }
}

}  // namespace
}  // namespace titan
