// Llama and Qwen2 against Hugging Face Transformers' LlamaForCausalLM and Qwen2ForCausalLM (fp32,
// eager attention), on the tiny random models of tests/reference/families_reference.py (a ctest
// fixture): each folder as save_pretrained wrote it is loaded the way `titan train --preset hf`,
// `eval` and `generate` load it (config.json through the family registry, then the weights,
// biases included), and must give Transformers' logits, loss and every parameter gradient on the
// same batch, and the same greedy tokens through the KV-cached decode, with fp32 weights.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "model_reference_util.h"
#include "titan/infer/generate.h"
#include "titan/infer/weights.h"
#include "titan/io/safetensors.h"
#include "titan/models/hf_checkpoint.h"

namespace titan {
namespace {

class FamilyReference : public ::testing::TestWithParam<std::string> {};

TEST_P(FamilyReference, LogitsLossGradientsAndGreedyTokensMatchTransformers) {
  const std::string dir = test::reference_dir() + "/families/" + GetParam();
  const SafetensorsCheckpoint ref = SafetensorsCheckpoint::open(dir + "/reference.safetensors");
  const auto& meta = ref.files().front().metadata();
  const int64_t batch = std::stoll(meta.at("batch")), seq = std::stoll(meta.at("seq"));
  std::unique_ptr<CausalLM> model = load_hf_model(dir + "/model");
  const ModelArgs& args = model->args();
  EXPECT_EQ(args.architecture, meta.at("architecture"));
  model->allocate_gradients();

  test::expect_step_matches_reference(*model, ref, batch, seq);

  // Greedy decoding: the prompt prefilled, then one token per step through the KV cache.
  const std::vector<int32_t> prompt = test::read_ids(ref.at("prompt_ids"));
  const std::vector<int32_t> want_ids = test::read_ids(ref.at("generated_ids"));
  GenerateOptions greedy;
  greedy.max_new_tokens = static_cast<int64_t>(want_ids.size());
  const GenerateResult g = generate_tokens(InferenceWeights(*model), prompt, greedy);
  EXPECT_EQ(g.ids, want_ids);
}

INSTANTIATE_TEST_SUITE_P(Cases, FamilyReference,
                         ::testing::Values("llama_tied", "llama_untied_bias", "qwen2_tied",
                                           "qwen2_untied"));

}  // namespace
}  // namespace titan
