// LoRA under tensor parallel (models/lora.h: a column-wise linear's B and a row-wise linear's A
// cut like their base, the other matrix whole): a TP group's ranks run as threads of this process
// (dispatch/thread_group.h), each model and adapter loaded with its cut of one whole model's and
// adapter's values, two accumulated micro-batches of training against the whole model with the
// whole adapter in one process. Compared: the loss (the same on every rank, within 1e-5 relative of
// one process's), each cut matrix's gradient against its cut of one process's, and each whole
// matrix's gradient summed over the ranks (what the trainer's TP sum does, Parallelism) against one
// process's. With and without sequence parallel, on 2 and 4 ranks, with dropout (a row-wise input's
// mask keyed by its whole feature index) and in bf16 compute; the adapter's init drawn whole and
// cut.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "error_of.h"
#include "tiny_models.h"
#include "titan/core/rng.h"
#include "titan/dispatch/thread_group.h"
#include "titan/dispatch/verify_checks.h"
#include "titan/models/decoder_lm.h"
#include "titan/models/lora.h"
#include "titan/models/parallelize.h"
#include "titan/models/registry.h"
#include "titan/nn/shard_runs.h"
#include "unit/compare.h"

namespace titan {
namespace {

constexpr int64_t kBatch = 2, kSeq = 8, kMicroBatches = 2, kVocab = 96;
constexpr double kTolerance = 1e-5;

using Tensors = std::map<std::string, std::vector<float>>;

ModelArgs qwen3(int64_t kv_heads = 2) {
  ModelArgs a = test::tiny_dense(false);
  a.vocab_size = kVocab;
  a.num_key_value_heads = kv_heads;
  return a;
}

LoraOptions options(double dropout) {
  LoraOptions o;
  o.rank = 4;
  o.alpha = 8.0;
  o.target_modules = lora_module_names();
  o.dropout = dropout;
  return o;
}

ParallelizePlan tp_plan(const ModelArgs& args, int64_t rank, int64_t degree, bool sp) {
  ParallelAxes axes;
  axes.tp_index = rank;
  axes.tp_degree = degree;
  axes.sequence_parallel = sp;
  return parallelize_decoder(args, axes);
}

// Every tensor of `groups` by name.
Tensors values_of(const std::vector<ParamGroup>& groups, bool grads) {
  Tensors out;
  for (const ParamGroup& g : groups) {
    for (const ParamView& v : g.views()) {
      const float* p = (grads ? g.grads() : g.params()) + v.offset;
      out.emplace(v.spec.name, std::vector<float>(p, p + v.numel));
    }
  }
  return out;
}

// `groups` (cut by `plan`) loaded with their cuts of `whole`.
void load_cuts(std::vector<ParamGroup>& groups, const ParallelizePlan& plan, const Tensors& whole) {
  for (ParamGroup& g : groups) {
    for (const ParamView& v : g.views()) {
      const Shard cut = plan.placement_of(v.spec);
      const Shape shape = whole_param_spec(v.spec, plan).shape;
      copy_part_out(shard_box(shape, {cut}), whole.at(v.spec.name).data(), g.params() + v.offset);
    }
  }
}

// What a step left: its loss sum and the adapter's gradients.
struct Step {
  double loss = 0.0;
  Tensors grads;
};

// Two micro-batches of random tokens through `m` with `adapter` attached, both loaded with their
// cuts (by `plan`) of `weights` and `lora`.
Step lora_step(CausalLM& m, LoraAdapter& adapter, const ParallelizePlan& plan,
               const Tensors& weights, const Tensors& lora) {
  m.attach_lora(adapter);
  load_cuts(m.param_groups(), plan, weights);
  load_cuts(adapter.groups(), plan, lora);
  m.allocate_gradients();
  adapter.allocate_gradients();
  adapter.zero_gradients();
  Step step;
  Rng rng(5);
  for (int64_t micro = 0; micro < kMicroBatches; ++micro) {
    std::vector<int32_t> ids(kBatch * kSeq + 1);
    for (int32_t& id : ids) id = static_cast<int32_t>(rng.next_u64() % kVocab);
    std::vector<int32_t> inputs(ids.begin(), ids.end() - 1), labels(ids.begin() + 1, ids.end());
    labels[3] = kIgnoreIndex;
    adapter.begin_dropout(17, 1, micro * kBatch, kSeq);
    ForwardOptions o;
    o.compute_grad = true;
    o.grad_scale = 1.0f / 30.0f;
    step.loss += m.forward(inputs.data(), labels.data(), kBatch, kSeq, o).loss_sum;
    m.backward();
    adapter.end_dropout();
  }
  step.grads = values_of(adapter.groups(), true);
  return step;
}

struct Case {
  int degree = 2;
  bool sequence_parallel = false;
  double dropout = 0.0;
  DType dtype = DType::f32;
  double tolerance = kTolerance;
};

void expect_group_equals_one_process(const ModelArgs& args, const Case& c) {
  const LoraOptions o = options(c.dropout);
  // The base's init and a random adapter (B nonzero, so that A's gradients read the linears).
  Tensors weights, lora;
  {
    const std::unique_ptr<CausalLM> m = make_model(args);
    m->initialize(3);
    weights = values_of(m->param_groups(), false);
    LoraAdapter adapter(args, o);
    Rng rng(7);
    for (ParamGroup& g : adapter.groups()) rng.fill_normal(g.params(), g.numel(), 0.0f, 0.1f);
    lora = values_of(adapter.groups(), false);
  }
  const std::unique_ptr<CausalLM> whole_model = make_model(args, {}, c.dtype);
  LoraAdapter whole_adapter(args, o);
  const Step whole = lora_step(*whole_model, whole_adapter, ParallelizePlan(), weights, lora);

  std::vector<Step> ranks(static_cast<size_t>(c.degree));
  std::vector<Tensors> summed(static_cast<size_t>(c.degree));
  run_vocab_ranks_in_threads(args.vocab_size, c.degree, [&](const VocabShard& shard) {
    const int64_t rank = shard.start / shard.rows;
    const ParallelizePlan plan = tp_plan(args, rank, c.degree, c.sequence_parallel);
    const std::unique_ptr<CausalLM> m = make_model(args, {}, c.dtype, Residency::committed, plan);
    LayerCollectives collectives;
    collectives.sum_partials = [&](float* x, int64_t count) { shard.all_reduce_sum(x, count); };
    collectives.all_reduce_max = [&](float* x, int64_t count) { shard.all_reduce_max(x, count); };
    if (c.sequence_parallel) {
      // Made of the group's sum: a rank's blocks placed in zeros and summed over the group.
      collectives.all_gather = [&](const float* in, float* out, int64_t count, int64_t parts) {
        std::vector<float> all(static_cast<size_t>(parts * c.degree * count), 0.0f);
        for (int64_t p = 0; p < parts; ++p) {
          std::copy(in + p * count, in + (p + 1) * count,
                    all.begin() + (p * c.degree + rank) * count);
        }
        shard.all_reduce_sum(all.data(), static_cast<int64_t>(all.size()));
        std::copy(all.begin(), all.end(), out);
      };
      collectives.reduce_scatter = [&](const float* in, float* out, int64_t count, int64_t parts) {
        std::vector<float> sum(in, in + parts * c.degree * count);
        shard.all_reduce_sum(sum.data(), static_cast<int64_t>(sum.size()));
        for (int64_t p = 0; p < parts; ++p) {
          const auto at = sum.begin() + (p * c.degree + rank) * count;
          std::copy(at, at + count, out + p * count);
        }
      };
    }
    m->set_layer_collectives(collectives);
    LoraAdapter adapter(args, o, plan);
    Step step = lora_step(*m, adapter, plan, weights, lora);
    // The whole matrices' partial gradients summed over the group, as the trainer sums them.
    for (ParamGroup& g : adapter.groups()) {
      for (const ParamView& v : g.views()) {
        if (plan.placement_of(v.spec).count > 1) continue;
        std::vector<float>& grad = step.grads.at(v.spec.name);
        shard.all_reduce_sum(grad.data(), static_cast<int64_t>(grad.size()));
      }
    }
    ranks[static_cast<size_t>(rank)] = std::move(step);
  });

  const std::string where =
      std::to_string(c.degree) + " ranks" + (c.sequence_parallel ? ", sequence parallel" : "") +
      (c.dropout > 0 ? ", dropout" : "") + ", " + std::string(dtype_name(c.dtype));
  int64_t cut_pairs = 0;
  for (int rank = 0; rank < c.degree; ++rank) {
    const Step& got = ranks[static_cast<size_t>(rank)];
    EXPECT_EQ(got.loss, ranks[0].loss) << where << ": rank " << rank;
    EXPECT_NEAR(got.loss, whole.loss, c.tolerance * std::abs(whole.loss)) << where;
    const ParallelizePlan plan = tp_plan(args, rank, c.degree, c.sequence_parallel);
    for (const ParamGroupSpec& g : lora_param_specs(args, o)) {
      for (const ParamSpec& p : g.params) {
        const Shard cut = plan.placement_of(p);
        cut_pairs += cut.count > 1 ? 1 : 0;
        std::vector<float> want(static_cast<size_t>(shape_numel(p.shape) / cut.count));
        copy_part_out(shard_box(p.shape, {cut}), whole.grads.at(p.name).data(), want.data());
        const std::vector<float>& have = got.grads.at(p.name);
        ASSERT_EQ(have.size(), want.size()) << where << ": " << p.name;
        testing::expect_close(where + ": rank " + std::to_string(rank) + " " + p.name, have.data(),
                              want.data(), static_cast<int64_t>(want.size()), c.tolerance);
      }
    }
  }
  // Every layer's seven pairs: q, k, v, gate, up cut on B, o and down on A.
  EXPECT_EQ(cut_pairs, c.degree * 7 * args.num_hidden_layers) << where;
}

TEST(LoraTensorParallel, GradientsEqualOneProcessWithAndWithoutSequenceParallel) {
  for (const bool sp : {false, true}) {
    expect_group_equals_one_process(qwen3(), {.degree = 2, .sequence_parallel = sp});
  }
  expect_group_equals_one_process(qwen3(4), {.degree = 4, .sequence_parallel = true});
}

TEST(LoraTensorParallel, DropoutMasksARowWiseInputByItsWholeFeatureIndex) {
  expect_group_equals_one_process(qwen3(), {.degree = 2, .dropout = 0.3});
  expect_group_equals_one_process(qwen3(),
                                  {.degree = 2, .sequence_parallel = true, .dropout = 0.3});
}

// bf16 compute: partial sums in another order may round an intermediate to the neighbouring bf16
// value: within the project's bf16 tolerance (dispatch/verify_checks.h), as test_tensor_parallel.
TEST(LoraTensorParallel, Bf16ComputeEqualsOneProcessInBf16) {
  for (const bool sp : {false, true}) {
    expect_group_equals_one_process(qwen3(), {.degree = 2,
                                              .sequence_parallel = sp,
                                              .dtype = DType::bf16,
                                              .tolerance = verify_checks::kBf16Tolerance});
  }
}

TEST(LoraTensorParallel, InitIsTheWholeInitCut) {
  const ModelArgs args = qwen3();
  LoraAdapter whole(args, options(0.0));
  whole.initialize(9);
  const Tensors want = values_of(whole.groups(), false);
  for (int64_t rank = 0; rank < 2; ++rank) {
    const ParallelizePlan plan = tp_plan(args, rank, 2, false);
    LoraAdapter cut(args, options(0.0), plan);
    cut.initialize(9);
    for (const ParamGroup& g : cut.groups()) {
      for (const ParamView& v : g.views()) {
        const Shard placement = plan.placement_of(v.spec);
        const Shape shape = whole_param_spec(v.spec, plan).shape;
        std::vector<float> part(static_cast<size_t>(v.numel));
        copy_part_out(shard_box(shape, {placement}), want.at(v.spec.name).data(), part.data());
        EXPECT_TRUE(std::equal(part.begin(), part.end(), g.params() + v.offset))
            << "rank " << rank << " " << v.spec.name;
      }
    }
  }
}

TEST(LoraTensorParallel, AModelRefusesAnAdapterNotCutByItsPlan) {
  const ModelArgs args = qwen3();
  const std::unique_ptr<CausalLM> m =
      make_model(args, {}, DType::f32, Residency::committed, tp_plan(args, 0, 2, false));
  LoraAdapter whole(args, options(0.0));
  const std::string error = test::error_of([&] { m->attach_lora(whole); });
  EXPECT_NE(error.find("not cut by the model's tensor-parallel plan"), std::string::npos) << error;
}

}  // namespace
}  // namespace titan
