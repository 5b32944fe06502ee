// The flavor registry: official dims give the parameter counts of spec §4.3 (the model cards),
// every flavor validates, names are exact and a typo gets a suggestion.
#include <gtest/gtest.h>

#include "titan/models/flops.h"
#include "titan/models/param_count.h"
#include "titan/models/qwen3/flavors.h"
#include "unit/test_safetensors_util.h"

namespace titan {
namespace {

using test::expect_error;

struct Expected {
  const char* name;
  int64_t total, non_embedding, active;  // active 0: dense (active == total)
};

// Spec §4.3.
constexpr Expected kCounts[] = {
    {"0.6B", 596'049'920, 440'467'456, 0},
    {"1.7B", 1'720'574'976, 1'409'410'048, 0},
    {"4B", 4'022'468'096, 3'633'511'936, 0},
    {"8B", 8'190'735'360, 6'946'075'648, 0},
    {"14B", 14'768'307'200, 13'212'482'560, 0},
    {"32B", 32'762'123'264, 31'206'298'624, 0},
    {"30B-A3B", 30'532'122'624, 29'909'792'768, 3'353'032'704},
    {"235B-A22B", 235'093'634'560, 233'848'974'848, 22'190'763'520},
};

TEST(Flavors, ParameterCountsMatchTheModelCards) {
  for (const Expected& e : kCounts) {
    const ParamCounts c = count_parameters(flavor(e.name));
    EXPECT_EQ(c.total, e.total) << e.name;
    EXPECT_EQ(c.non_embedding(), e.non_embedding) << e.name;
    EXPECT_EQ(c.active, e.active == 0 ? e.total : e.active) << e.name;
  }
}

// Spec §6: 6 N_mm (seq_len 0) plus an attention coefficient times T; MoE counts the router and k
// of E experts. The formula worked by hand for 8B and 30B-A3B must agree exactly; the spec's
// rounded table agrees with its own formula to about 6e-5 only (8B: 45.410e9 there, 45.4086e9 by
// the formula), hence 1e-4 against the table.
TEST(Flops, TrainingFlopsPerTokenFollowTheSpec) {
  // 8B: 6 (36 (4096 128 (64 + 16) + 3 4096 12288) + 151936 4096).
  EXPECT_EQ(training_flops_per_token(flavor("8B"), 0), 45'408'583'680.0);
  // 30B-A3B: 6 (48 (2048 128 (64 + 8) + 2048 128 + 8 3 2048 768) + 151936 2048).
  EXPECT_EQ(training_flops_per_token(flavor("30B-A3B"), 0), 18'249'940'992.0);
  const struct {
    const char* name;
    double six_n_mm, attention_per_position;
  } table[] = {{"0.6B", 3.576e9, 688'128},
               {"8B", 45.410e9, 1'769'472},
               {"30B-A3B", 18.251e9, 2'359'296},
               {"235B-A22B", 129.411e9, 9'240'576}};
  for (const auto& row : table) {
    const ModelArgs& a = flavor(row.name);
    const double at0 = training_flops_per_token(a, 0);
    EXPECT_NEAR(at0, row.six_n_mm, 1e-4 * row.six_n_mm) << row.name;
    EXPECT_DOUBLE_EQ(training_flops_per_token(a, 4096) - at0, 4096 * row.attention_per_position)
        << row.name;
  }
}

TEST(Flavors, EveryFlavorValidatesWithEitherAttentionBackend) {
  const std::vector<std::string> names = flavor_names();
  EXPECT_EQ(names.size(), std::size(kCounts) + 4);  // with tiny, tiny_moe, debugmodel(_moe)
  for (const std::string& name : names) {
    EXPECT_NO_THROW(validate_model_args(flavor(name), name)) << name;
    EXPECT_EQ(flavor(name).attn_backend, "blockwise");
    EXPECT_EQ(flavor(name, "reference").attn_backend, "reference");
  }
  expect_error([] { (void)flavor("0.6B", "sdpa"); }, {"flavor 0.6B", "attn_backend", "sdpa"});
}

TEST(Flavors, OfficialDims) {
  const ModelArgs& small = flavor("0.6B");
  EXPECT_EQ(small.architecture, "Qwen3ForCausalLM");
  EXPECT_TRUE(small.tie_word_embeddings);
  EXPECT_EQ(small.vocab_size, 151936);
  EXPECT_EQ(small.rope_theta, 1e6);
  EXPECT_EQ(small.eos_token_ids, std::vector<int64_t>{151645});
  EXPECT_FALSE(flavor("8B").tie_word_embeddings);
  const ModelArgs& moe = flavor("30B-A3B");
  EXPECT_EQ(moe.architecture, "Qwen3MoeForCausalLM");
  EXPECT_TRUE(moe.is_moe());
  EXPECT_TRUE(moe.norm_topk_prob);
  EXPECT_EQ(moe.num_experts, 128);
  EXPECT_EQ(moe.num_experts_per_tok, 8);
  EXPECT_EQ(moe.moe_intermediate_size, 768);
  EXPECT_EQ(moe.num_key_value_heads, 4);
  for (int64_t layer = 0; layer < moe.num_hidden_layers; ++layer)
    EXPECT_TRUE(moe.layer_is_sparse(layer));
}

// torchtitan/models/qwen3's debugmodel and debugmodel_moe, under the same names.
TEST(Flavors, DebugModelsHaveTorchtitansDims) {
  for (const char* name : {"debugmodel", "debugmodel_moe"}) {
    const ModelArgs& a = flavor(name);
    EXPECT_EQ(a.hidden_size, 256) << name;
    EXPECT_EQ(a.num_hidden_layers, 8) << name;
    EXPECT_EQ(a.num_attention_heads, 16) << name;
    EXPECT_EQ(a.num_key_value_heads, 8) << name;
    EXPECT_EQ(a.head_dim, 128) << name;
    EXPECT_EQ(a.vocab_size, 2048) << name;
    EXPECT_EQ(a.max_position_embeddings, 4096) << name;
    EXPECT_EQ(a.rope_theta, 1e6) << name;
  }
  const ModelArgs& dense = flavor("debugmodel");
  EXPECT_FALSE(dense.is_moe());
  EXPECT_EQ(dense.intermediate_size, 3072);
  EXPECT_TRUE(dense.tie_word_embeddings);
  const ModelArgs& moe = flavor("debugmodel_moe");
  EXPECT_TRUE(moe.is_moe());
  EXPECT_EQ(moe.num_experts, 64);
  EXPECT_EQ(moe.num_experts_per_tok, 8);
  EXPECT_EQ(moe.moe_intermediate_size, 768);
  EXPECT_FALSE(moe.tie_word_embeddings);
}

TEST(Flavors, TinyModelsAreSmall) {
  for (const char* name : {"tiny", "tiny_moe"}) {
    const ModelArgs& a = flavor(name);
    EXPECT_EQ(a.vocab_size, 2048) << name;
    EXPECT_LT(count_parameters(a).total, 5'000'000) << name;
  }
  EXPECT_TRUE(flavor("tiny_moe").is_moe());
  EXPECT_FALSE(flavor("tiny").is_moe());
}

TEST(Flavors, UnknownNameSuggestsTheClosest) {
  expect_error([] { (void)flavor("0.6b"); },
               {"unknown model flavor '0.6b'", "did you mean '0.6B'"});
  expect_error([] { (void)flavor("30B-A3"); }, {"did you mean '30B-A3B'", "debugmodel, "});
  expect_error([] { (void)flavor("debug_model"); }, {"did you mean 'debugmodel'"});
}

TEST(ParamCount, MixedDenseAndSparseLayers) {
  ModelArgs a = flavor("debugmodel_moe");
  a.mlp_only_layers = {0};
  a.decoder_sparse_step = 1;
  const int64_t h = a.hidden_size;
  const ParamCounts all_sparse = count_parameters(flavor("debugmodel_moe"));
  const ParamCounts mixed = count_parameters(a);
  const int64_t sparse_mlp = a.num_experts * 3 * h * a.moe_intermediate_size + a.num_experts * h;
  EXPECT_EQ(all_sparse.total - mixed.total, sparse_mlp - 3 * h * a.intermediate_size);
  EXPECT_EQ(mixed.embedding, 2 * a.vocab_size * h);  // untied
}

}  // namespace
}  // namespace titan
