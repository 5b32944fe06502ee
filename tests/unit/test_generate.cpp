// Inference: the KV-cache forward against the training forward, the sampler's HF semantics,
// seeded repeatability, text streaming, and the request checks.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <string>

#include "compare.h"
#include "error_of.h"
#include "test_generate_util.h"
#include "test_tokenizer_python.h"
#include "titan/backend/backend.h"
#include "titan/core/error.h"
#include "titan/core/rng.h"
#include "titan/dispatch/registry.h"
#include "titan/infer/device.h"
#include "titan/infer/generate.h"
#include "titan/infer/kv_cache.h"
#include "titan/infer/sampling.h"
#include "titan/infer/session.h"
#include "titan/infer/text_stream.h"
#include "titan/infer/weights.h"
#include "titan/models/decoder_lm.h"
#include "titan/models/forward_only_model.h"
#include "titan/models/hf_checkpoint.h"
#include "titan/models/hf_config.h"
#include "titan/models/hf_export.h"
#include "titan/models/state_dict_adapter.h"
#include "titan/ops/linear.h"
#include "titan/train/evaluate.h"
#include "unit/test_safetensors_util.h"

namespace titan {
namespace {

using test::full_forward_logits;
using test::test_ids;
using test::tiny_generate_args;
using testing::expect_close;

constexpr float kInf = std::numeric_limits<float>::infinity();

// Biases start at zero (HF init); random ones make a forward that skipped them fail.
void randomize_biases(CausalLM& model) {
  for (ParamGroup& g : model.param_groups()) {
    for (const ParamView& v : g.views()) {
      if (v.spec.name.ends_with(".bias")) {
        Rng(11, v.spec.name).fill_normal(g.params() + v.offset, v.numel, 0.0f, 0.1f);
      }
    }
  }
}

// Attention on k and v rounded to bf16 (each copied, rounded, then the blockwise kernel): a bf16
// KV cache's semantics computed the fp32 way, as the reference of the bf16-cache tests.
void attention_on_bf16_rounded_kv(float* out, float* lse, const float* q, const float* k,
                                  const float* v, const AttentionShape& s) {
  const size_t n = static_cast<size_t>(s.batch * s.seq_kv * s.n_kv_heads * s.head_dim);
  std::vector<float> k_rounded(k, k + n), v_rounded(v, v + n);
  for (float& x : k_rounded) x = round_to_bf16(x);
  for (float& x : v_rounded) x = round_to_bf16(x);
  attention_forward_blockwise(out, lse, q, k_rounded.data(), v_rounded.data(), s);
}

void register_attention_bf16_rounded() {
  if (kernel_registry().find("attention_bf16_rounded") != nullptr) return;
  kernel_registry().add(
      {"attention_bf16_rounded",
       OpKind::attention,
       {DType::f32},
       "k and v rounded to bf16, then blockwise (test)",
       AttentionKernel{attention_on_bf16_rounded_kv, attention_backward_reference, {}}});
}

// The built-in blockwise attention without its bf16 training forward: mixed-precision training
// then attends in fp32 on q, k and v rounded to bf16, as inference on bf16 weights does (training's
// bf16 forward also rounds the probabilities for P V).
void register_attention_fp32_forward() {
  if (kernel_registry().find("attention_fp32_forward") != nullptr) return;
  kernel_registry().add({"attention_fp32_forward",
                         OpKind::attention,
                         {DType::f32},
                         "blockwise, its forward always fp32 (test)",
                         AttentionKernel{attention_forward_blockwise,
                                         attention_backward_blockwise,
                                         {},
                                         attention_forward_blockwise_bf16_kv,
                                         attention_backward_blockwise_bf16}});
}

// Prefill of `prompt` tokens in `chunks`, then one token per step, each call's logits handed to
// `check(what, got, want)` with the full forward's logits at that position. With bf16 weights the
// full forward is the mixed-precision training model on the same fp32 weights (DecoderLM with
// compute dtype bf16): every matmul multiplies bf16-rounded inputs by bf16-rounded weights with
// fp32 accumulation in both, prefill GEMMs and decode GEMVs alike. The reference runs without
// `overrides`: training refuses an fp32-only kernel for a bf16 matmul, and the session gives such
// a kernel the same rounded operands, widened; its attention is bound to attention_fp32_forward.
// With `reference_rounds_kv` and fp32 weights the reference binds every layer's attention to
// attention_bf16_rounded instead, which rounds k and v to bf16 before attending: what a bf16 cache
// holds (rounded once when written) and its attention reads (widened exactly). bf16 weights over
// a bf16 cache attend in bf16 (bf16 q, k and v; probabilities rounded for P V, each against the
// running max of its key block): the mixed-precision training forward's own attention.
template <typename Check>
void run_cached_logits(const ModelArgs& args, int64_t prompt, const std::vector<int64_t>& chunks,
                       int64_t steps, DType dtype, const std::vector<OverrideRule>& overrides,
                       DType kv_dtype, bool reference_rounds_kv, const Check& check) {
  DecoderLM model(args, overrides, dtype);
  std::vector<OverrideRule> reference_overrides;
  if (dtype == DType::f32) reference_overrides = overrides;
  if (reference_rounds_kv && dtype == DType::f32) {
    register_attention_bf16_rounded();
    reference_overrides.push_back({"model.layers.*.self_attn", "attention_bf16_rounded"});
  } else if (!reference_rounds_kv && dtype == DType::bf16) {
    register_attention_fp32_forward();
    reference_overrides.push_back({"model.layers.*.self_attn", "attention_fp32_forward"});
  }
  DecoderLM reference(args, reference_overrides, dtype);
  model.initialize(7);
  reference.initialize(7);
  randomize_biases(model);
  randomize_biases(reference);
  const int64_t V = model.args().vocab_size;
  const std::vector<int32_t> ids = test_ids(prompt + steps, V, static_cast<uint32_t>(prompt));
  const std::vector<float> want = full_forward_logits(reference, ids);
  int64_t max_chunk = 1;
  for (int64_t c : chunks) max_chunk = std::max(max_chunk, c);
  const InferenceWeights weights(model);
  InferenceSession session(weights, prompt + steps, max_chunk, kv_dtype);
  int64_t pos = 0;
  for (int64_t c : chunks) {
    const float* got = session.forward(ids.data() + pos, c);
    pos += c;
    check("prefill to " + std::to_string(pos), got, want.data() + (pos - 1) * V, V);
  }
  ASSERT_EQ(pos, prompt);
  for (; pos < prompt + steps; ++pos) {
    const float* got = session.forward(ids.data() + pos, 1);
    check("decode at " + std::to_string(pos), got, want.data() + pos * V, V);
  }
  EXPECT_EQ(session.length(), prompt + steps);
}

// With an fp32 cache the session and the full forward differ only in fp32 summation order, so the
// tolerance is the fp32 one.
//
// A bf16 cache adds one effect of that order: an element of k or v (or, for a bf16 model, a
// probability rounded for P V) whose fp32 value lies within
// the two computations' difference (~1e-7 relative) of a midpoint between two bf16 values rounds
// up in one and down in the other, a step of 2^-8 relative in one element. That moves the tiny
// models' logits by ~2e-5 per such element, and whether any lands that close changes with any
// change of summation order (a GEMM's, attention's). So the bf16 cache's tolerance is
// kRoundingFlipTol, 10x a flip's effect; a cache that kept k and v unrounded, or rounded them
// elsewhere, moves every element and is 10x beyond it (Bf16KvCacheToleranceSeesAnUnroundedCache).
constexpr double kFp32Tol = 2e-6, kRoundingFlipTol = 2e-4;

void check_cached_logits(const ModelArgs& args, int64_t prompt, std::vector<int64_t> chunks,
                         int64_t steps, DType dtype = DType::f32,
                         const std::vector<OverrideRule>& overrides = {},
                         DType kv_dtype = DType::f32) {
  const double tol = kv_dtype == DType::bf16 ? kRoundingFlipTol : kFp32Tol;
  run_cached_logits(args, prompt, chunks, steps, dtype, overrides, kv_dtype,
                    kv_dtype == DType::bf16,
                    [&](const std::string& what, const float* got, const float* want, int64_t n) {
                      expect_close(what, got, want, n, tol);
                    });
}

TEST(InferenceSession, DecodeLogitsEqualFullForward) {
  for (int64_t prompt : {1, 3, 7, 13}) {
    check_cached_logits(tiny_generate_args(true), prompt, {prompt}, 9);
  }
  check_cached_logits(tiny_generate_args(false), 11, {11}, 6);
}

TEST(InferenceSession, Bf16WeightsDecodeLogitsEqualBf16TrainingForward) {
  for (const bool tied : {true, false}) {
    check_cached_logits(tiny_generate_args(tied), 7, {7}, 9, DType::bf16);
    check_cached_logits(tiny_generate_args(tied), 13, {5, 1, 7}, 4,
                        DType::bf16);  // bf16-GEMM prefill chunks, one of a single token
  }
}

// A bf16 KV cache holds k (after k_norm and RoPE) and v rounded to bf16 and attends over them as
// read: chunked prefill and decode equal a full forward whose attention rounds k and v (up to a
// rounding flip: kRoundingFlipTol), with fp32 and with bf16 weights, across attention blocks, and
// for MoE and biased Llama blocks.
TEST(InferenceSession, Bf16KvCacheLogitsEqualFullForwardOnRoundedKeysAndValues) {
  for (const DType dtype : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dtype));
    check_cached_logits(tiny_generate_args(true), 7, {7}, 9, dtype, {}, DType::bf16);
    check_cached_logits(tiny_generate_args(false), 13, {5, 1, 7}, 4, dtype, {}, DType::bf16);
    check_cached_logits(tiny_generate_args(false), 131, {131}, 5, dtype, {}, DType::bf16);
  }
  ModelArgs llama = tiny_generate_args(true);
  llama.architecture = "LlamaForCausalLM";
  llama.qk_norm = false;
  llama.attention_bias = llama.o_proj_bias = llama.mlp_bias = true;
  check_cached_logits(llama, 13, {5, 1, 7}, 4, DType::bf16, {}, DType::bf16);
  ModelArgs moe = test::with_moe(tiny_generate_args(false), 5, 2, 16, {1});
  moe.num_hidden_layers = 3;
  check_cached_logits(moe, 12, {4, 1, 7}, 3, DType::f32, {}, DType::bf16);
}

// The bf16 cache's tolerance tells a cache that rounds from one that does not: an fp32 cache
// against the same rounded reference is far outside it in every case above with fp32 weights.
// (With bf16 weights k and v come rounded from the projections and RoPE, whatever the cache
// holds them in.)
TEST(InferenceSession, Bf16KvCacheToleranceSeesAnUnroundedCache) {
  ModelArgs moe = test::with_moe(tiny_generate_args(false), 5, 2, 16, {1});
  moe.num_hidden_layers = 3;
  const struct {
    ModelArgs args;
    int64_t prompt;
    std::vector<int64_t> chunks;
    int64_t steps;
    DType dtype;
  } cases[] = {{tiny_generate_args(true), 7, {7}, 9, DType::f32},
               {tiny_generate_args(false), 13, {5, 1, 7}, 4, DType::f32},
               {tiny_generate_args(false), 131, {131}, 5, DType::f32},
               {moe, 12, {4, 1, 7}, 3, DType::f32}};
  for (const auto& c : cases) {
    double worst = 0.0;
    run_cached_logits(c.args, c.prompt, c.chunks, c.steps, c.dtype, {}, DType::f32, true,
                      [&](const std::string&, const float* got, const float* want, int64_t n) {
                        worst = std::max(worst, testing::compare_arrays(got, want, n).rel());
                      });
    std::printf("  fp32 cache against the rounded reference, prompt %lld: worst rel %.3e\n",
                static_cast<long long>(c.prompt), worst);
    EXPECT_GT(worst, 10 * kRoundingFlipTol) << "prompt " << c.prompt;
  }
}

// Llama's blocks with attention_bias and mlp_bias: q/k/v/o and MLP biases, no q/k norm.
TEST(InferenceSession, BiasesWithoutQkNormDecodeLogitsEqualFullForward) {
  for (const bool tied : {true, false}) {
    ModelArgs a = tiny_generate_args(tied);
    a.architecture = "LlamaForCausalLM";
    a.qk_norm = false;
    a.attention_bias = a.o_proj_bias = a.mlp_bias = true;
    check_cached_logits(a, 7, {7}, 5);
    check_cached_logits(a, 13, {5, 1, 7}, 4, DType::bf16);
  }
}

std::atomic<int64_t> g_counted_linear_calls{0};

void counted_linear_forward(float* y, const float* x, const float* w, int64_t n, int64_t in,
                            int64_t out) {
  ++g_counted_linear_calls;
  linear_forward_reference(y, x, w, n, in, out);
}

void counted_linear_forward_bf16(float* y, const uint16_t* x, const uint16_t* w, int64_t n,
                                 int64_t in, int64_t out) {
  ++g_counted_linear_calls;
  linear_forward_bf16_reference(y, x, w, n, in, out);
}

// A linear rebound by [overrides] runs in decode as in training: prefill and every one-token
// step call it (no fused GEMV bypasses it), with fp32 weights and with bf16 ones (its bf16 form:
// a bf16 model binds only kernels that have one).
TEST(InferenceSession, OverriddenLinearsRunInDecode) {
  if (kernel_registry().find("linear_counted") == nullptr) {
    kernel_registry().add(
        {"linear_counted",
         OpKind::linear,
         {DType::f32, DType::bf16},
         "counts its forward calls (test)",
         LinearKernel{counted_linear_forward, linear_backward_reference,
                      counted_linear_forward_bf16, linear_backward_bf16_reference}});
  }
  const std::vector<OverrideRule> overrides = {
      {"model.layers.*.self_attn.k_proj", "linear_counted"}};
  for (const DType dtype : {DType::f32, DType::bf16}) {
    g_counted_linear_calls = 0;
    check_cached_logits(tiny_generate_args(false), 5, {5}, 3, dtype, overrides);
    // 2 layers x (1 prefill + 3 steps) in the session, plus the fp32 reference's full forward.
    EXPECT_EQ(g_counted_linear_calls.load(), 2 * 4 + (dtype == DType::f32 ? 2 : 0))
        << dtype_name(dtype);
  }
}

TEST(InferenceSession, ChunkedPrefillAndLongPromptsAcrossAttentionBlocks) {
  check_cached_logits(tiny_generate_args(false), 13, {5, 1, 7}, 4);
  // Past the 128-key attention block: decode queries see several key blocks.
  check_cached_logits(tiny_generate_args(true), 131, {131}, 5);
}

TEST(InferenceSession, MoeDecodeLogitsEqualFullForward) {
  // The shared tiny MoE (layer 0 sparse, layer 1 dense) with a third, sparse layer; the wide
  // init keeps routing decisions far from ties.
  ModelArgs a = tiny_generate_args(false);
  const ModelArgs moe = test::tiny_moe();
  a.architecture = moe.architecture;
  a.num_experts = 5;
  a.num_experts_per_tok = 2;
  a.moe_intermediate_size = moe.moe_intermediate_size;
  a.num_hidden_layers = 3;
  a.mlp_only_layers = {1};
  check_cached_logits(a, 9, {9}, 7);
  check_cached_logits(a, 12, {4, 1, 7}, 3);
  // bf16 weights: the experts' GEMMs round as the router-free matmuls do, as DecoderLM in bf16.
  check_cached_logits(a, 12, {4, 1, 7}, 3, DType::bf16);
}

// A cache truncated to a shared prefix continues exactly as a fresh session would: the logits of
// a different continuation, prefilled in one chunk and then decoded, equal the full forward's.
TEST(InferenceSession, TruncatedCacheContinuesLikeAFreshOne) {
  DecoderLM model(tiny_generate_args(true));
  model.initialize(8);
  const int64_t V = model.args().vocab_size;
  const std::vector<int32_t> first = test_ids(12, V, 3), other = test_ids(9, V, 4);
  std::vector<int32_t> ids(first.begin(), first.begin() + 5);  // the prefix both share
  ids.insert(ids.end(), other.begin(), other.end());
  const std::vector<float> want = full_forward_logits(model, ids);
  const InferenceWeights weights(model);
  InferenceSession session(weights, 16, 12);
  session.forward(first.data(), 12);
  session.forward(first.data() + 3, 1);  // a decode step, then dropped with the rest
  session.truncate(5);
  const float* got = session.forward(ids.data() + 5, 6);
  expect_close("prefill after truncate", got, want.data() + 10 * V, V, 2e-6);
  for (int64_t pos = 11; pos < 14; ++pos) {
    got = session.forward(ids.data() + pos, 1);
    expect_close("decode after truncate at " + std::to_string(pos), got, want.data() + pos * V, V,
                 2e-6);
  }
}

// The largest relative difference (to the largest |logit|) between the logits of two sessions
// over the same ids: a 13-token prefill, then 6 one-token steps.
double session_deviation(const InferenceWeights& a_weights, DType a_cache,
                         const InferenceWeights& b_weights, DType b_cache) {
  const int64_t V = a_weights.model().args().vocab_size, prompt = 13, steps = 6;
  const std::vector<int32_t> ids = test_ids(prompt + steps, V, 5);
  InferenceSession a(a_weights, prompt + steps, prompt, a_cache);
  InferenceSession b(b_weights, prompt + steps, prompt, b_cache);
  double worst = 0.0;
  for (int64_t pos = 0; pos < prompt + steps;) {
    const int64_t n = pos == 0 ? prompt : 1;
    const float* a_logits = a.forward(ids.data() + pos, n);
    const std::vector<float> got(a_logits, a_logits + V);
    const float* want = b.forward(ids.data() + pos, n);
    worst = std::max(worst, testing::compare_arrays(got.data(), want, V).rel());
    pos += n;
  }
  return worst;
}

// How far a bf16 cache moves the logits from the fp32 cache. Rounding k and v once to bf16 moves
// each by at most u = 2^-9 relative; an attention output then moves by at most u max|v| through
// the values (a convex combination) and 2 u A max|v| through the keys (each score by at most
// u A, A = max_j sum_d |q_d k_jd| / sqrt(hd), and softmax weights by twice that, relatively).
// That is the size of perturbation one bf16 rounding of a matmul input makes, and bf16 weights
// make seven of those per layer (every linear's input) plus one of every weight, against the two
// of the cache (the rest of the network carries both the same way). So the bound used is the
// deviation bf16 weights cause in the same model on the same ids, measured here; and the cache
// must move the logits at all (far above the fp32 noise of 2e-6 the exact tests hold), or it
// would not be holding bf16 values. (With bf16 weights the same comparison is not one rounding
// against others: each matmul input is rounded again after the cache's change, so a small change
// turns into whole-ulp flips of some inputs -- measured 1.1e-2 against bf16 weights' 1.0e-2 from
// fp32. What a bf16 cache computes there is pinned exactly by the test above.)
TEST(InferenceSession, Bf16KvCacheStaysWithinTheBf16WeightsDeviation) {
  for (const bool tied : {true, false}) {
    DecoderLM model(tiny_generate_args(tied)),
        model_bf16(tiny_generate_args(tied), {}, DType::bf16);
    model.initialize(7);
    model_bf16.initialize(7);
    const InferenceWeights f32(model), bf16(model_bf16);
    const double cache = session_deviation(f32, DType::bf16, f32, DType::f32);
    const double weights = session_deviation(bf16, DType::f32, f32, DType::f32);
    std::printf("  tied %d: bf16 cache moves the logits by %.3e, bf16 weights by %.3e\n", tied,
                cache, weights);
    EXPECT_LT(cache, weights) << "tied " << tied;
    EXPECT_GT(cache, 1e-4) << "tied " << tied;
  }
}

// A bf16 cache holds half the bytes; it needs an attention kernel that reads bf16 keys and
// values (the built-in ones do), and says which when one does not.
TEST(InferenceSession, Bf16KvCacheHalvesTheBytesAndNeedsABf16Attention) {
  const ModelArgs a = tiny_generate_args(true);
  EXPECT_EQ(KvCache(a, 10, DType::bf16).bytes() * 2, KvCache(a, 10, DType::f32).bytes());
  EXPECT_THROW(KvCache(a, 10, DType::f16), Error);
  register_attention_bf16_rounded();
  DecoderLM model(a, {{"model.layers.*.self_attn", "attention_bf16_rounded"}});
  model.initialize(1);
  const InferenceWeights weights(model);
  test::expect_error(
      [&] { InferenceSession(weights, 8, 4, DType::bf16); },
      {"model.layers.0.self_attn", "attention_bf16_rounded", "reads only fp32 keys and values"});
  InferenceSession fp32_cache(weights, 8, 4, DType::f32);
  EXPECT_EQ(fp32_cache.cache().dtype(), DType::f32);
}

// The models the bf16 folder loads are checked on: tied, untied, and MoE (3 layers, the middle
// one sparse).
std::vector<std::pair<std::string, ModelArgs>> bf16_load_models() {
  ModelArgs moe = test::with_moe(tiny_generate_args(false), 5, 2, 16, {1});
  moe.num_hidden_layers = 3;
  return {{"tied", tiny_generate_args(true)}, {"untied", tiny_generate_args(false)}, {"moe", moe}};
}

// A Hugging Face folder `name`_<dtype> in `dir` of the model of `args` (seed 3), its weights
// stored in `stored`.
std::string export_seeded_folder(const test::ScratchDir& dir, const std::string& name,
                                 const ModelArgs& args, DType stored) {
  const std::string folder = dir / (name + "_" + std::string(dtype_name(stored)));
  DecoderLM model(args);
  model.initialize(3);
  HfExportOptions options;
  options.dtype = stored;
  export_hf_folder(folder, model, options);
  return folder;
}

// A folder loaded for bf16 inference holds its matmul weights only as bf16 copies, and its
// embedding too when the folder stores it in bf16 (exactly; a tied one is the lm_head's copy): the
// parameters' accounting grows by the copies and by the fp32 parameters the forward reads (norms,
// an fp32 folder's embedding) -- never by fp32 matmul weights -- and its sessions compute what the
// copies of the same folder loaded whole in fp32 compute, bit for bit. bf16 and fp32 folders (the
// copies then rounded from the stored fp32 values); tied, untied and MoE.
TEST(InferenceWeights, LoadedInBf16HoldsTheMatmulWeightsOnlyInBf16) {
  test::ScratchDir dir;
  constexpr auto kParameters = static_cast<int>(MemCategory::parameters);
  for (const auto& [name, args] : bf16_load_models()) {
    for (const DType stored : {DType::bf16, DType::f32}) {
      const std::string folder = export_seeded_folder(dir, name, args, stored);
      SCOPED_TRACE(folder);
      const bool embedding_in_bf16 = stored == DType::bf16;
      int64_t read_in_fp32 = 0;
      for (const ParamGroupSpec& g : model_param_specs(args)) {
        for (const ParamSpec& p : g.params) {
          const bool in_bf16 = DecoderLM::read_only_in_bf16(p.name) ||
                               (embedding_in_bf16 && p.name == "model.embed_tokens.weight");
          if (!in_bf16) read_in_fp32 += param_view_span(shape_numel(p.shape));
        }
      }
      const size_t before = memory_stats().current[kParameters];
      const std::unique_ptr<InferenceWeights> loaded = InferenceWeights::load(folder, DType::bf16);
      const size_t held = memory_stats().current[kParameters] - before;
      EXPECT_EQ(held, loaded->copy_bytes() + sizeof(float) * static_cast<size_t>(read_in_fp32));
      const std::unique_ptr<CausalLM> whole = load_hf_model(folder, {}, false, DType::bf16);
      const InferenceWeights copies(*whole);
      const bool own_embedding = embedding_in_bf16 && !args.tie_word_embeddings;
      EXPECT_EQ(loaded->copy_bytes(),
                copies.copy_bytes() +
                    (own_embedding ? sizeof(uint16_t) * args.vocab_size * args.hidden_size : 0));
      for (const DType cache : {DType::f32, DType::bf16}) {
        EXPECT_EQ(session_deviation(*loaded, cache, copies, cache), 0.0);
      }
    }
  }
}

// A non-finite value stored in a weight the bf16 load never holds in fp32 is found all the same.
TEST(InferenceWeights, LoadedInBf16RefusesNonFiniteMatmulWeights) {
  test::ScratchDir dir;
  const std::string folder = dir / "nan";
  DecoderLM model(tiny_generate_args(true));
  model.initialize(3);
  const ParamGroup& layer0 = model.param_groups()[1];
  layer0.params()[layer0.view("model.layers.0.self_attn.q_proj.weight").offset + 5] =
      std::numeric_limits<float>::quiet_NaN();
  export_hf_folder(folder, model, {});
  test::expect_error(
      [&] { InferenceWeights::load(folder, DType::bf16); },
      {"model.safetensors", "1 non-finite weight", "model.layers.0.self_attn.q_proj.weight"});
  // Allowed, the value is loaded as stored.
  const std::unique_ptr<InferenceWeights> allowed =
      InferenceWeights::load(folder, DType::bf16, true);
  EXPECT_TRUE(
      std::isnan(bf16_to_f32(allowed->modules().layers[0].self_attn.q_proj.weight_bf16[5])));
  EXPECT_FALSE(
      std::isnan(bf16_to_f32(allowed->modules().layers[0].self_attn.q_proj.weight_bf16[4])));
}

// titan eval's model of a folder in bf16 holds its matmul weights only as the bf16 copies its
// forward reads, and an embedding stored in bf16 only in bf16 (a tied one is the lm_head's copy):
// the parameters' accounting grows by the copies and by the views read in fp32 -- never by an
// fp32 matmul weight -- and its loss and logits are those of the same folder loaded whole with
// fp32 masters, bit for bit (bf16 and fp32 folders; tied, untied, MoE). It refuses gradients. In
// fp32 it is load_hf_model's model with the same loss. In both it keeps no activations for a
// backward.
TEST(EvalModel, LoadedInBf16HoldsOnlyTheCopiesItReads) {
  test::ScratchDir dir;
  constexpr auto kParameters = static_cast<int>(MemCategory::parameters);
  const int64_t batch = 2, seq = 12;
  for (const auto& [name, args] : bf16_load_models()) {
    const std::vector<int32_t> ids = test::test_ids(batch * seq, args.vocab_size, 5);
    const std::vector<int32_t> labels = test::test_ids(batch * seq, args.vocab_size, 6);
    const auto forward = [&](CausalLM& model, std::vector<float>& logits) {
      logits.assign(ids.size() * static_cast<size_t>(args.vocab_size), 0.0f);
      return model.forward(ids.data(), labels.data(), batch, seq, {.logits = logits.data()});
    };
    for (const DType stored : {DType::bf16, DType::f32}) {
      const std::string folder = export_seeded_folder(dir, name, args, stored);
      SCOPED_TRACE(folder);
      const std::unique_ptr<CausalLM> whole = load_hf_model(folder, {}, false, DType::bf16);
      std::vector<float> want_logits, got_logits;
      const CrossEntropyResult want = forward(*whole, want_logits);
      const bool embedding_in_bf16 = stored == DType::bf16;
      int64_t read_in_fp32 = 0, in_bf16 = 0;
      for (const ParamGroupSpec& g : model_param_specs(args)) {
        for (const ParamSpec& p : g.params) {
          const bool embedding = p.name == "model.embed_tokens.weight";
          const bool copied = DecoderLM::read_only_in_bf16(p.name) ||
                              (embedding && (args.tie_word_embeddings || embedding_in_bf16));
          if (copied) in_bf16 += shape_numel(p.shape);
          if (!DecoderLM::read_only_in_bf16(p.name) && !(embedding && embedding_in_bf16)) {
            read_in_fp32 += param_view_span(shape_numel(p.shape));
          }
        }
      }
      const size_t before = memory_stats().current[kParameters];
      const std::unique_ptr<CausalLM> eval = load_forward_only_model(folder, DType::bf16);
      const size_t held = memory_stats().current[kParameters] - before;
      EXPECT_EQ(held, sizeof(uint16_t) * static_cast<size_t>(in_bf16) +
                          sizeof(float) * static_cast<size_t>(read_in_fp32));
      const CrossEntropyResult got = forward(*eval, got_logits);
      EXPECT_EQ(got.loss_sum, want.loss_sum);
      EXPECT_EQ(got.n_scored, want.n_scored);
      EXPECT_EQ(got_logits, want_logits);
      // Twice: nothing the first forward did changes the weights the second reads.
      EXPECT_EQ(forward(*eval, got_logits).loss_sum, want.loss_sum);
      test::expect_error([&] { eval->allocate_gradients(); },
                         {"gradients of a model whose bf16 copies are its weights"});
      const std::unique_ptr<CausalLM> fp32 = load_forward_only_model(folder, DType::f32);
      const std::unique_ptr<CausalLM> fp32_whole = load_hf_model(folder);
      EXPECT_EQ(forward(*fp32, got_logits).loss_sum, forward(*fp32_whole, want_logits).loss_sum);
      EXPECT_EQ(got_logits, want_logits);
      // Nothing kept for a backward: a checkpointing model's arena but L - 1 of its L + 1
      // residual streams and the backward's two (N, h) gradients.
      const int64_t stream = batch * seq * args.hidden_size * static_cast<int64_t>(sizeof(float));
      EXPECT_EQ(fp32->activation_bytes(batch, seq),
                DecoderLM::activation_bytes_of(args, DType::f32, ActivationCheckpointing::full(),
                                               batch, seq) -
                    (args.num_hidden_layers + 1) * stream);
      fp32->allocate_gradients();
      test::expect_error(
          [&] {
            fp32->forward(ids.data(), labels.data(), batch, seq,
                          {.compute_grad = true, .grad_scale = 1.0f});
          },
          {"forward with compute_grad on a model made forward-only"});
    }
  }
}

TEST(InferenceSession, KvCacheDtypeNames) {
  EXPECT_EQ(kv_cache_dtype("auto", DType::bf16), DType::bf16);
  EXPECT_EQ(kv_cache_dtype("bf16", DType::f32), DType::bf16);
  EXPECT_EQ(kv_cache_dtype("bfloat16", DType::f32), DType::bf16);
  EXPECT_EQ(kv_cache_dtype("float32", DType::bf16), DType::f32);
  EXPECT_EQ(kv_cache_dtype("fp32", DType::bf16), DType::f32);
  // An empty value is a mistake, not "auto" (--kv-cache-dtype '').
  test::expect_error([] { kv_cache_dtype("", DType::f32); },
                     {"KV cache dtype \"\" is not one of auto, bfloat16, float32"});
  test::expect_error([] { kv_cache_dtype("float16", DType::f32); },
                     {"KV cache dtype \"float16\" is not one of auto, bfloat16, float32"});
}

TEST(InferenceSession, BadCalls) {
  DecoderLM model(tiny_generate_args(true, 97, 32));
  model.initialize(1);
  EXPECT_THROW(KvCache(model.args(), 33), Error);
  EXPECT_THROW(KvCache(model.args(), 0), Error);
  const InferenceWeights weights(model);
  InferenceSession session(weights, 4, 3);
  const std::vector<int32_t> bad = {5, 97};
  EXPECT_THROW(session.forward(bad.data(), 2), Error);
  const std::vector<int32_t> ids = {1, 2, 3, 4};
  EXPECT_THROW(session.forward(ids.data(), 4), Error);  // more than max_chunk
  session.forward(ids.data(), 3);
  session.forward(ids.data(), 1);
  EXPECT_THROW(session.forward(ids.data(), 1), Error);  // the cache is full
  EXPECT_THROW(session.truncate(5), Error);             // past what it holds
  session.truncate(0);
  EXPECT_EQ(session.length(), 0);
}

TEST(Sampling, ArgmaxTakesTheFirstOfTies) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f};
  EXPECT_EQ(argmax(logits.data(), 4), 1);
}

TEST(Sampling, RepetitionPenaltyDividesPositiveAndMultipliesNegative) {
  std::vector<float> logits = {2.0f, -2.0f, 1.0f, 0.0f};
  apply_repetition_penalty(logits.data(), 4, {0, 1, 0, 3}, 2.0);  // id 0 twice: penalised once
  EXPECT_EQ(logits, (std::vector<float>{1.0f, -4.0f, 1.0f, 0.0f}));
}

TEST(Sampling, TopKKeepsTiesWithTheKth) {
  std::vector<float> logits = {1.0f, 3.0f, 3.0f, 2.0f, 0.0f};
  apply_top_k(logits.data(), 5, 2);
  EXPECT_EQ(logits, (std::vector<float>{-kInf, 3.0f, 3.0f, -kInf, -kInf}));
  std::vector<float> all = {1.0f, 2.0f};
  apply_top_k(all.data(), 2, 5);  // k past the vocabulary keeps everything
  EXPECT_EQ(all, (std::vector<float>{1.0f, 2.0f}));
}

std::vector<float> log_probs(const std::vector<double>& p) {
  std::vector<float> out;
  for (double x : p) out.push_back(static_cast<float>(std::log(x)));
  return out;
}

TEST(Sampling, TopPRemovesTheLeastLikelyTail) {
  // Ascending cumulative mass 0.05, 0.20, 0.50, 1.0; HF removes the tokens with cum <= 1 - top_p.
  std::vector<float> a = log_probs({0.5, 0.3, 0.15, 0.05});
  apply_top_p(a.data(), 4, 0.75);
  EXPECT_TRUE(std::isfinite(a[0]) && std::isfinite(a[1]));
  EXPECT_EQ(a[2], -kInf);
  EXPECT_EQ(a[3], -kInf);
  std::vector<float> b = log_probs({0.5, 0.3, 0.15, 0.05});
  apply_top_p(b.data(), 4, 0.9);
  EXPECT_TRUE(std::isfinite(b[2]));
  EXPECT_EQ(b[3], -kInf);
  std::vector<float> c = log_probs({0.5, 0.3, 0.15, 0.05});
  apply_top_p(c.data(), 4, 0.01);  // the most likely token always stays
  EXPECT_TRUE(std::isfinite(c[0]));
  EXPECT_EQ(c[1], -kInf);
}

TEST(Sampling, MinPScalesWithTheTopProbability) {
  std::vector<float> a = log_probs({0.5, 0.3, 0.15, 0.05});
  apply_min_p(a.data(), 4, 0.4);  // threshold 0.2
  EXPECT_TRUE(std::isfinite(a[0]) && std::isfinite(a[1]));
  EXPECT_EQ(a[2], -kInf);
  EXPECT_EQ(a[3], -kInf);
}

TEST(Sampling, TemperatureDividesLogits) {
  std::vector<float> a = {1.0f, -2.0f};
  apply_temperature(a.data(), 2, 0.5);
  EXPECT_EQ(a, (std::vector<float>{2.0f, -4.0f}));
}

TEST(Sampling, DrawsFollowTheDistribution) {
  SamplingParams p;
  p.do_sample = true;
  Sampler sampler(p, 123);
  std::map<int32_t, int> counts;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    std::vector<float> logits = log_probs({0.5, 0.3, 0.2});
    ++counts[sampler.next(logits.data(), 3, {})];
  }
  EXPECT_NEAR(counts[0] / double(n), 0.5, 0.015);
  EXPECT_NEAR(counts[1] / double(n), 0.3, 0.015);
  EXPECT_NEAR(counts[2] / double(n), 0.2, 0.015);
}

TEST(Sampling, BadParameters) {
  SamplingParams p;
  p.temperature = -1;
  EXPECT_THROW(validate_sampling_params(p), Error);
  p = {};
  p.top_p = 0.0;
  EXPECT_THROW(validate_sampling_params(p), Error);
  p = {};
  p.min_p = 1.5;
  EXPECT_THROW(validate_sampling_params(p), Error);
  p = {};
  p.top_k = -1;
  EXPECT_THROW(validate_sampling_params(p), Error);
  p = {};
  p.repetition_penalty = 0.0;
  EXPECT_THROW(validate_sampling_params(p), Error);
}

GenerateOptions sampled(uint64_t seed) {
  GenerateOptions o;
  o.max_new_tokens = 24;
  o.sampling.do_sample = true;
  o.sampling.temperature = 1.5;
  o.sampling.top_p = 0.95;
  o.sampling.min_p = 0.01;
  o.sampling.repetition_penalty = 1.1;
  o.seed = seed;
  return o;
}

TEST(Generate, SamplingWithASeedRepeatsExactly) {
  DecoderLM model(tiny_generate_args(true));
  model.initialize(3);
  const std::vector<int32_t> prompt = test_ids(9, 97, 5);
  const GenerateResult a = generate_tokens(InferenceWeights(model), prompt, sampled(42));
  const GenerateResult b = generate_tokens(InferenceWeights(model), prompt, sampled(42));
  const GenerateResult c = generate_tokens(InferenceWeights(model), prompt, sampled(43));
  EXPECT_EQ(a.ids, b.ids);
  EXPECT_NE(a.ids, c.ids);
  EXPECT_EQ(a.ids.size(), 24u);
  EXPECT_EQ(a.finish_reason, "length");
}

TEST(Generate, TopKOneEqualsGreedy) {
  DecoderLM model(tiny_generate_args(false));
  model.initialize(4);
  for (int64_t len : {1, 6, 17}) {
    const std::vector<int32_t> prompt = test_ids(len, 97, static_cast<uint32_t>(len));
    GenerateOptions greedy;
    greedy.max_new_tokens = 16;
    GenerateOptions top1 = sampled(9);
    top1.max_new_tokens = 16;
    top1.sampling.top_k = 1;
    top1.sampling.repetition_penalty = 1.0;
    EXPECT_EQ(generate_tokens(InferenceWeights(model), prompt, greedy).ids,
              generate_tokens(InferenceWeights(model), prompt, top1).ids);
  }
}

TEST(Generate, GreedyEqualsArgmaxOfTheFullForward) {
  DecoderLM model(tiny_generate_args(true));
  model.initialize(5);
  std::vector<int32_t> seq = test_ids(7, 97, 1);
  GenerateOptions o;
  o.max_new_tokens = 10;
  const GenerateResult r = generate_tokens(InferenceWeights(model), seq, o);
  ASSERT_EQ(r.ids.size(), 10u);
  for (int32_t id : r.ids) {
    const std::vector<float> logits = full_forward_logits(model, seq);
    EXPECT_EQ(id, argmax(logits.data() + (seq.size() - 1) * 97, 97));
    seq.push_back(id);
  }
}

// Chat turns through a PromptCache: each prefills only what its prompt adds to the cached ids and
// generates what a fresh session would (greedy); a prompt that leaves the cached ids early
// reuses only the shared prefix; a turn that outgrows the cache makes a larger one.
TEST(Generate, PromptCacheReusesTheSharedPrefix) {
  DecoderLM model(tiny_generate_args(false));
  model.initialize(9);
  const InferenceWeights weights(model);
  GenerateOptions o;
  o.max_new_tokens = 6;
  PromptCache cache;
  const auto turn = [&](const std::vector<int32_t>& prompt, int64_t want_cached) {
    const GenerateResult cached = generate_tokens(weights, prompt, o, {}, &cache);
    EXPECT_EQ(cached.cached_prompt_tokens, want_cached);
    EXPECT_EQ(cached.ids, generate_tokens(weights, prompt, o).ids);
    EXPECT_EQ(cache.session->length(), static_cast<int64_t>(cache.ids.size()));
    return cached.ids;
  };
  std::vector<int32_t> prompt = test_ids(7, 97, 11);
  const std::vector<int32_t> answer = turn(prompt, 0);
  const int64_t first_len = cache.session->max_len();
  EXPECT_EQ(first_len, 2 * (7 + 6));
  // The next turn: the whole history (the last generated id was never fed), then a new message.
  prompt.insert(prompt.end(), answer.begin(), answer.end());
  const std::vector<int32_t> message = test_ids(5, 97, 12);
  prompt.insert(prompt.end(), message.begin(), message.end());
  turn(prompt, 7 + 6 - 1);
  // A prompt that shares 3 ids with the cache.
  std::vector<int32_t> fork(prompt.begin(), prompt.begin() + 3);
  const std::vector<int32_t> rest = test_ids(4, 97, 13);
  fork.insert(fork.end(), rest.begin(), rest.end());
  turn(fork, 3);
  // The same prompt again: all but its last id come from the cache.
  turn(fork, static_cast<int64_t>(fork.size()) - 1);
  EXPECT_EQ(cache.session->max_len(), first_len);
  // More positions than the cache has: a larger session, nothing reused.
  const std::vector<int32_t> long_prompt = test_ids(30, 97, 14);
  turn(long_prompt, 0);
  EXPECT_EQ(cache.session->max_len(), 2 * (30 + 6));
}

TEST(Generate, StopsOnEosIncludingIt) {
  DecoderLM model(tiny_generate_args(true));
  model.initialize(6);
  const std::vector<int32_t> prompt = test_ids(5, 97, 2);
  GenerateOptions o;
  o.max_new_tokens = 12;
  const GenerateResult free_run = generate_tokens(InferenceWeights(model), prompt, o);
  o.eos_ids = {free_run.ids[3]};
  const GenerateResult r = generate_tokens(InferenceWeights(model), prompt, o);
  ASSERT_LE(r.ids.size(), 4u);
  EXPECT_EQ(r.ids.back(), free_run.ids[3]);
  EXPECT_EQ(r.finish_reason, "eos");
}

TEST(Generate, BadRequests) {
  ModelArgs a = tiny_generate_args(true, 97, 32);
  EXPECT_THROW(check_generate_request(a, 0, 4), Error);   // empty prompt
  EXPECT_THROW(check_generate_request(a, 33, 1), Error);  // past max positions
  EXPECT_THROW(check_generate_request(a, 30, 3), Error);  // would overflow the cache
  EXPECT_THROW(check_generate_request(a, 3, 0), Error);   // nothing to generate
  EXPECT_NO_THROW(check_generate_request(a, 30, 2));
  try {
    check_generate_request(a, 30, 3);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("max_position_embeddings is 32"), std::string::npos)
        << e.what();
  }
  DecoderLM model(a);
  model.initialize(1);
  EXPECT_THROW(generate_tokens(InferenceWeights(model), {}, GenerateOptions{}), Error);
}

// --device: selected as training.device is (one parser, parse_device_name), one line naming the
// flag where the build has no CUDA or the machine no such device; the CPU stays the ops' backend.
TEST(Generate, Devices) {
  EXPECT_NO_THROW(select_inference_device("cpu"));
  EXPECT_EQ(&backend(), &backend_named("cpu"));
  try {
    select_inference_device("cuda:0");
    EXPECT_EQ(backend().kind(), DeviceKind::cuda);
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_TRUE(m.rfind("--device cuda:0: this titan was built without CUDA (", 0) == 0 ||
                m.rfind("--device cuda:0: no CUDA device", 0) == 0)
        << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
  select_inference_device("cpu");
  EXPECT_EQ(&backend(), &backend_named("cpu"));
  EXPECT_EQ(test::error_of([] { select_inference_device("tpu"); }),
            "--device tpu: unknown device 'tpu' (cpu, cuda or cuda:N)");
}

// What CUDA inference cannot run yet is refused by name before the folder is loaded (its
// config.json only is read); the CPU takes the same folders.
TEST(Generate, CudaRefusesWhatItCannotRunYet) {
  const test::ScratchDir dir;
  const auto folder = [&](const std::string& name, const ModelArgs& args) {
    const std::string path = dir / name;
    std::filesystem::create_directories(path);
    write_hf_config(path + "/config.json", args, DType::f32);
    return path;
  };
  const std::string dense = folder("dense", test::tiny_generate_args(false));
  const std::string moe = folder("moe", test::tiny_moe());
  EXPECT_NO_THROW(check_inference_on_device("cuda", dense, ""));
  EXPECT_EQ(test::error_of([&] { check_inference_on_device("cuda:1", moe, ""); }),
            "--device cuda:1: a MoE model (sparse layers) is not implemented on CUDA yet (use "
            "--device cpu)");
  EXPECT_EQ(test::error_of([&] { check_inference_on_device("cuda", dense, dir / "adapter"); }),
            "--device cuda: merging a LoRA adapter at load (--adapter) is not implemented on "
            "CUDA yet (use --device cpu)");
  EXPECT_NO_THROW(check_inference_on_device("cpu", moe, dir / "adapter"));
}

TEST(TextStream, ReleasesWholeCharactersOnly) {
  const Tokenizer tok = Tokenizer::load(test::qwen3_tokenizer_dir());
  const std::string text = "naïve café 世界 🙂 done";
  const std::vector<int32_t> ids = tok.encode(text);
  TextStream stream(tok, {});
  std::string joined;
  for (int32_t id : ids) {
    const std::string piece = stream.push(id);
    EXPECT_EQ(piece.find("\xEF\xBF\xBD"), std::string::npos) << "partial UTF-8 released";
    joined += piece;
  }
  joined += stream.finish();
  EXPECT_EQ(joined, text);
  EXPECT_EQ(stream.text(), text);
}

TEST(TextStream, StopsBeforeAStopStringAndHoldsBackItsPrefix) {
  const Tokenizer tok = Tokenizer::load(test::qwen3_tokenizer_dir());
  const std::vector<int32_t> ids = tok.encode("one two three four");
  TextStream stream(tok, {"three", "xyz"});
  std::string joined;
  for (int32_t id : ids) {
    joined += stream.push(id);
    // Released text never contains the start of a stop string that is still pending.
    EXPECT_EQ(joined.find("thr"), std::string::npos);
    if (stream.stopped()) break;
  }
  EXPECT_TRUE(stream.stopped());
  joined += stream.finish();
  EXPECT_EQ(joined, "one two ");
}

}  // namespace
}  // namespace titan
