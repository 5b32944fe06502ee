// bf16 mixed-precision training against PyTorch, on the tiny Qwen3 and Qwen3-MoE folders of
// tests/reference/mixed_precision_reference.py (a ctest fixture). The folder is loaded as
// `titan train --preset hf` loads it, with compute dtype bf16, and one training step (logits,
// loss, every gradient) is compared with
//  - bf16_mm: PyTorch computing titan's rounding points exactly (bf16 matmul operands, fp32
//    accumulation; q/k/v_proj's outputs, q and k after RoPE, and the logits rounded to bf16;
//    attention's GEMMs on bf16 operands, its probabilities rounded for P V; everything else
//    fp32). Products of bf16 values are exact in fp32, so the two differ by fp32 summation order,
//    and by the bf16 rounding flips it causes (see kSpreadFactor);
//  - autocast: torch.autocast("cpu", bfloat16), which rounds more (every linear's output, the
//    q/k norms' outputs); see kAutocastNoiseFactor.
// and its logits must be closer to bf16_mm's than fp32's are, so an fp32 step cannot pass.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "model_reference_util.h"
#include "titan/io/safetensors.h"
#include "titan/models/hf_checkpoint.h"

namespace titan {
namespace {

// titan and bf16_mm differ by fp32 summation order. Without a bf16 rounding flip that is the fp32
// tests' 1e-5; with flips (a value beside a bf16 rounding boundary rounded apart, the change
// carried on through attention) it is what the reference measured as bf16_mm's spread under
// summation-order noise (bf16_mm_spread: the worst of several jittered runs), and titan may be
// up to twice that far: its own summation order is one more such draw.
constexpr double kSummationTolerance = 1e-5;
constexpr double kSpreadFactor = 2.0;
// Against autocast: titan rounds a subset of what autocast rounds (the matmuls' operands, q/k/v
// and the logits, not the other linears' outputs or the q/k norms' outputs), so the two steps
// differ by about autocast's own rounding noise, which is measured as its distance from the fp32
// step. A tensor's worst element may gather both sides' noise: at most twice that distance. Not
// the loss: one scalar is one draw of each side's noise (titan's, rounding the logits, is as
// large as autocast's), and two draws may differ by more than twice either; the loss is held to
// bf16_mm above, and the logits it is computed from to autocast.
constexpr double kAutocastNoiseFactor = 2.0;

std::vector<float> read_all(const SafetensorsCheckpoint& ref, const std::string& name) {
  const SafetensorsEntry& e = ref.at(name);
  std::vector<float> out(e.numel());
  read_f32(e, out.data(), static_cast<int64_t>(out.size()));
  return out;
}

double relative_error(const float* got, const std::vector<float>& want) {
  return testing::compare_arrays(got, want.data(), static_cast<int64_t>(want.size())).rel();
}

class MixedPrecisionReference : public ::testing::TestWithParam<std::string> {};

TEST_P(MixedPrecisionReference, Bf16StepMatchesPyTorch) {
  const std::string dir = test::reference_dir() + "/mixed_precision/" + GetParam();
  const SafetensorsCheckpoint ref = SafetensorsCheckpoint::open(dir + "/reference.safetensors");
  const auto& meta = ref.files().front().metadata();
  const int64_t batch = std::stoll(meta.at("batch")), seq = std::stoll(meta.at("seq"));
  std::unique_ptr<CausalLM> model = load_hf_model(dir + "/model", {}, false, DType::bf16);
  ASSERT_EQ(model->compute_dtype(), DType::bf16);
  model->allocate_gradients();

  const std::vector<int32_t> ids = test::read_ids(ref.at("input_ids"));
  const std::vector<int32_t> targets = test::read_ids(ref.at("targets"));
  int64_t n_valid = 0;
  for (const int32_t t : targets) n_valid += t != kIgnoreIndex;
  std::vector<float> logits(static_cast<size_t>(batch * seq * model->args().vocab_size));
  ForwardOptions options;
  options.compute_grad = true;
  options.grad_scale = 1.0f / static_cast<float>(n_valid);
  options.logits = logits.data();
  const CrossEntropyResult r = model->forward(ids.data(), targets.data(), batch, seq, options);
  model->backward();
  // With output_router_logits (config.json), HF's loss adds the load-balancing loss, as do the
  // gradients (ForwardOptions::aux_loss_scale 1).
  const double aux = model->args().output_router_logits
                         ? model->args().router_aux_loss_coef * model->aux_loss()
                         : 0.0;
  const auto loss = static_cast<float>(r.loss_sum / r.n_scored + aux);

  struct Tensor {
    std::string name;
    const float* got;
  };
  std::vector<Tensor> tensors = {{"logits", logits.data()}, {"loss", &loss}};
  for (const ParamGroup& g : model->param_groups()) {
    for (const ParamView& v : g.views())
      tensors.push_back({"grad." + v.spec.name, g.grads() + v.offset});
  }
  for (const Tensor& t : tensors) {
    const std::vector<float> fp32 = read_all(ref, "fp32." + t.name);
    const std::vector<float> bf16_mm = read_all(ref, "bf16_mm." + t.name);
    const std::vector<float> autocast = read_all(ref, "autocast." + t.name);
    const double exact = relative_error(t.got, bf16_mm);
    const double vs_autocast = relative_error(t.got, autocast);
    const double bf16_effect = relative_error(bf16_mm.data(), fp32);
    const double autocast_noise = relative_error(autocast.data(), fp32);
    float spread = 0.0f;
    read_f32(ref.at("bf16_mm_spread." + t.name), &spread, 1);
    const double tolerance = std::max(kSummationTolerance, kSpreadFactor * spread);
    std::printf(
        "  %-52s vs bf16_mm %.2e (tol %.1e)  vs autocast %.2e  (fp32 vs bf16_mm %.2e, autocast "
        "%.2e)\n",
        t.name.c_str(), exact, tolerance, vs_autocast, bf16_effect, autocast_noise);
    EXPECT_LE(exact, tolerance) << t.name;
    if (t.name != "loss") {
      EXPECT_LE(vs_autocast, kAutocastNoiseFactor * autocast_noise) << t.name;
    }
    // titan computed bf16, not fp32: its logits are closer to bf16_mm than fp32's are, by more
    // than a factor of two.
    if (t.name == "logits") {
      EXPECT_GT(bf16_effect, 2 * exact) << t.name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, MixedPrecisionReference,
                         ::testing::Values("qwen3_tied", "qwen3_untied", "qwen3_moe_all_sparse",
                                           "qwen3_moe_mixed"));

}  // namespace
}  // namespace titan
