// `titan verify-kernels` for the MoE kinds (dispatch/verify.h): the fused experts, and the four
// stages (ops/moe_stages.h) each against its reference on the same inputs.
#include <algorithm>
#include <string>
#include <vector>

#include "titan/dispatch/verify_checks.h"
#include "titan/ops/moe.h"
#include "titan/ops/moe_stages.h"

namespace titan::verify_checks {
namespace {

// The shape every MoE check runs: 24 tokens, h 32, experts of 48, 4 experts, 2 per token.
ExpertsShape check_shape() {
  ExpertsShape s;
  s.n_tokens = 24, s.hidden = 32, s.inter = 48, s.n_experts = 4, s.top_k = 2;
  return s;
}

// Each token on two different experts; expert 3 gets none, so an empty group is exercised.
std::vector<int32_t> check_routing(const ExpertsShape& s) {
  std::vector<int32_t> index(static_cast<size_t>(s.rows()));
  for (int64_t t = 0; t < s.n_tokens; ++t) {
    index[t * s.top_k] = static_cast<int32_t>(t % 3);
    index[t * s.top_k + 1] = static_cast<int32_t>((t + 1) % 3);
  }
  return index;
}

std::vector<float> as_floats(const std::vector<int32_t>& v) {
  return {v.begin(), v.end()};
}

}  // namespace

// One MoE layer's experts: buffers for a kernel's forward and backward.
struct ExpertsRun {
  ExpertsShape shape;
  std::vector<float> gate, up, act, x_rows, y_rows, dgate, dup, dact, w_rows, dweight_rows;
  std::vector<int32_t> row_of, offsets;
  ExpertsActivations activations;
  ExpertsScratch scratch;
  explicit ExpertsRun(const ExpertsShape& s) : shape(s) {
    const auto rows = static_cast<size_t>(s.rows());
    for (auto* v : {&gate, &up, &act, &dgate, &dup, &dact}) v->assign(rows * s.inter, 0.0f);
    // x_rows: under bf16 experts_staged's recomputed outputs lie past the bf16 rows.
    x_rows.assign(rows * s.hidden * 2, 0.0f);
    y_rows.assign(rows * s.hidden, 0.0f);
    w_rows.assign(rows, 0.0f);
    dweight_rows.assign(rows, 0.0f);
    row_of.assign(rows, 0);
    offsets.assign(static_cast<size_t>(s.n_experts + 1), 0);
    activations = {gate.data(), up.data(), act.data(), row_of.data(), offsets.data()};
    scratch = {x_rows.data(), y_rows.data(), dgate.data(),        dup.data(),
               dact.data(),   w_rows.data(), dweight_rows.data(), x_rows.data() + rows * s.hidden};
  }
};

void verify_experts(const ExpertsKernel& k, Checks& c) {
  const ExpertsShape s = check_shape();
  if (k.check) {
    const std::string violated = k.check(s);
    TITAN_CHECK(violated.empty(),
                "the experts check's shape breaks the kernel's constraint: ", violated);
  }
  const int64_t E = s.n_experts, h = s.hidden, Im = s.inter, n = s.n_tokens, kk = s.top_k;
  const std::vector<float> x = uniform(n * h, 1), gate_w = uniform(E * Im * h, 2),
                           up_w = uniform(E * Im * h, 3), down_w = uniform(E * h * Im, 4),
                           weight = uniform(n * kk, 5, 0.1f, 1.0f), dy = uniform(n * h, 6);
  // Each token on two different experts; expert 3 gets none, so an empty group is exercised.
  std::vector<int32_t> index(static_cast<size_t>(n * kk));
  for (int64_t t = 0; t < n; ++t) {
    index[t * kk] = static_cast<int32_t>(t % 3);
    index[t * kk + 1] = static_cast<int32_t>((t + 1) % 3);
  }
  const double tolerance = fp32_tolerance(std::max({h, Im, n}));
  const auto run = [&](const ExpertsKernel& kernel, bool bf16, std::vector<float>& y,
                       std::vector<float>& dx, std::vector<float>& dweight,
                       std::vector<float>& dw_all) {
    ExpertsRun r(s);
    const ExpertWeights w{gate_w.data(), up_w.data(), down_w.data()};
    const std::vector<uint16_t> g16 = rounded(gate_w), u16 = rounded(up_w), d16 = rounded(down_w);
    const ExpertWeightsBf16 w16{g16.data(), u16.data(), d16.data()};
    y.assign(static_cast<size_t>(n * h), 0.0f);
    dx.assign(y.size(), 0.0f);
    dweight.assign(static_cast<size_t>(n * kk), 0.0f);
    dw_all.assign(static_cast<size_t>(3 * E * Im * h), 0.0f);
    const ExpertGrads dw{dw_all.data(), dw_all.data() + E * Im * h, dw_all.data() + 2 * E * Im * h};
    if (bf16) {
      kernel.forward_bf16(y.data(), r.activations, r.scratch, x.data(), index.data(), weight.data(),
                          w16, s);
      kernel.backward_bf16(dx.data(), dweight.data(), dw, r.scratch, dy.data(), r.activations,
                           x.data(), index.data(), weight.data(), w16, s);
    } else {
      kernel.forward(y.data(), r.activations, r.scratch, x.data(), index.data(), weight.data(), w,
                     s);
      kernel.backward(dx.data(), dweight.data(), dw, r.scratch, dy.data(), r.activations, x.data(),
                      index.data(), weight.data(), w, s);
    }
  };
  const ExpertsKernel reference{experts_forward_reference,
                                experts_backward_reference,
                                {},
                                experts_forward_bf16_reference,
                                experts_backward_bf16_reference};
  for (const bool bf16 : {false, true}) {
    if (bf16 && k.forward_bf16 == nullptr) break;
    std::vector<float> y, dx, dweight, dw, want_y, want_dx, want_dweight, want_dw;
    run(k, bf16, y, dx, dweight, dw);
    run(reference, bf16, want_y, want_dx, want_dweight, want_dw);
    // The bf16 reference rounds the same operands and intermediates; an intermediate the two
    // round differently moves by a bf16 step.
    const double tol = bf16 ? kBf16Tolerance : tolerance;
    c.add(bf16 ? "forward_bf16" : "forward", "y", y, want_y, tol);
    const std::string form = bf16 ? "backward_bf16" : "backward";
    c.add(form, "dx", dx, want_dx, tol);
    c.add(form, "drouting_weight", dweight, want_dweight, tol);
    c.add(form, "dweights (gate, up, down)", dw, want_dw, tol);
  }
}

void verify_router(const RouterKernel& k, Checks& c) {
  const int64_t n = 24, E = 8, top_k = 3;
  const std::vector<float> logits = uniform(n * E, 1, -3.0f, 3.0f), dweight = uniform(n * top_k, 2),
                           dprobs_all = uniform(E, 3);
  for (const bool norm : {true, false}) {
    const std::string form = norm ? "" : " unnormalised";
    std::vector<int32_t> index(n * top_k), want_index(n * top_k);
    std::vector<float> weight(n * top_k), want_weight(n * top_k), probs(n * E), want_probs(n * E);
    k.forward(index.data(), weight.data(), probs.data(), logits.data(), n, E, top_k, norm);
    router_topk_forward_reference(want_index.data(), want_weight.data(), want_probs.data(),
                                  logits.data(), n, E, top_k, norm);
    c.add("forward" + form, "index", as_floats(index), as_floats(want_index), 0.0);
    c.add("forward" + form, "weight", weight, want_weight, fp32_tolerance(E));
    c.add("forward" + form, "probs", probs, want_probs, fp32_tolerance(E));
    // The backward from the reference's probabilities and picks.
    std::vector<float> dlogits(n * E), want_dlogits(n * E);
    k.backward(dlogits.data(), dweight.data(), dprobs_all.data(), want_probs.data(),
               want_index.data(), n, E, top_k, norm);
    router_topk_backward_reference(want_dlogits.data(), dweight.data(), dprobs_all.data(),
                                   want_probs.data(), want_index.data(), n, E, top_k, norm);
    c.add("backward" + form, "dlogits", dlogits, want_dlogits, fp32_tolerance(E));
  }
}

void verify_moe_dispatch(const MoeDispatchKernel& k, Checks& c) {
  const ExpertsShape s = check_shape();
  const int64_t R = s.rows(), h = s.hidden;
  const std::vector<int32_t> index = check_routing(s);
  std::vector<int32_t> row_of(R), offsets(s.n_experts + 1), want_row_of(R),
      want_offsets(s.n_experts + 1);
  k.plan(row_of.data(), offsets.data(), index.data(), s);
  moe_dispatch_plan_reference(want_row_of.data(), want_offsets.data(), index.data(), s);
  c.add("plan", "row_of", as_floats(row_of), as_floats(want_row_of), 0.0);
  c.add("plan", "offsets", as_floats(offsets), as_floats(want_offsets), 0.0);
  // The gathers and the backward on the reference's plan: a copy is exact.
  const std::vector<float> x = uniform(s.n_tokens * h, 4), dx_rows = uniform(R * h, 5),
                           dweight_rows = uniform(R, 6);
  std::vector<float> rows(R * h), want_rows(R * h);
  k.forward(rows.data(), x.data(), want_row_of.data(), s);
  moe_dispatch_forward_reference(want_rows.data(), x.data(), want_row_of.data(), s);
  c.add("forward", "x_rows", rows, want_rows, 0.0);
  if (k.forward_bf16 != nullptr) {
    std::vector<uint16_t> rows16(R * h), want_rows16(R * h);
    k.forward_bf16(rows16.data(), x.data(), want_row_of.data(), s);
    moe_dispatch_forward_bf16_reference(want_rows16.data(), x.data(), want_row_of.data(), s);
    c.add("forward_bf16", "x_rows", widened(rows16), widened(want_rows16), 0.0);
  }
  std::vector<float> dx(s.n_tokens * h), want_dx(dx.size()), dweight(R), want_dweight(R);
  k.backward(dx.data(), dweight.data(), dx_rows.data(), dweight_rows.data(), want_row_of.data(), s);
  moe_dispatch_backward_reference(want_dx.data(), want_dweight.data(), dx_rows.data(),
                                  dweight_rows.data(), want_row_of.data(), s);
  c.add("backward", "dx", dx, want_dx, fp32_tolerance(s.top_k));
  c.add("backward", "dweight", dweight, want_dweight, 0.0);
}

void verify_grouped_experts(const GroupedExpertsKernel& k, Checks& c) {
  const ExpertsShape s = check_shape();
  const int64_t R = s.rows(), h = s.hidden, Im = s.inter, E = s.n_experts;
  const std::vector<int32_t> index = check_routing(s);
  std::vector<int32_t> row_of(R), offsets(E + 1);
  moe_dispatch_plan_reference(row_of.data(), offsets.data(), index.data(), s);
  const std::vector<float> x_rows = uniform(R * h, 1), gate_w = uniform(E * Im * h, 2),
                           up_w = uniform(E * Im * h, 3), down_w = uniform(E * h * Im, 4),
                           w_rows = uniform(R, 5, 0.1f, 1.0f), dy_rows = uniform(R * h, 6);
  const std::vector<uint16_t> x16 = rounded(x_rows), g16 = rounded(gate_w), u16 = rounded(up_w),
                              d16 = rounded(down_w);
  struct Out {
    std::vector<float> out, dx_rows, dweight_rows, dw;
  };
  using Forward = decltype(k.forward);
  using Backward = decltype(k.backward);
  using ForwardBf16 = decltype(k.forward_bf16);
  using BackwardBf16 = decltype(k.backward_bf16);
  const auto run = [&](Forward fwd, Backward bwd, ForwardBf16 fwd16, BackwardBf16 bwd16) {
    std::vector<float> ga(R * Im), ua(R * Im), aa(R * Im), dg(R * Im), du(R * Im), da(R * Im),
        so(R * h);
    const ExpertsActivations act{ga.data(), ua.data(), aa.data(), row_of.data(), offsets.data()};
    const ExpertsScratch scratch{nullptr,   nullptr, dg.data(), du.data(),
                                 da.data(), nullptr, nullptr,   so.data()};
    Out o{std::vector<float>(R * h), dy_rows, std::vector<float>(R),
          std::vector<float>(3 * E * Im * h, 0.0f)};
    const ExpertGrads dw{o.dw.data(), o.dw.data() + E * Im * h, o.dw.data() + 2 * E * Im * h};
    if (fwd16 != nullptr) {
      const ExpertWeightsBf16 w{g16.data(), u16.data(), d16.data()};
      fwd16(o.out.data(), act, scratch, x16.data(), offsets.data(), w, s);
      bwd16(o.dx_rows.data(), o.dweight_rows.data(), dw, scratch, w_rows.data(), act, x16.data(),
            offsets.data(), w, s);
    } else {
      const ExpertWeights w{gate_w.data(), up_w.data(), down_w.data()};
      fwd(o.out.data(), act, scratch, x_rows.data(), offsets.data(), w, s);
      bwd(o.dx_rows.data(), o.dweight_rows.data(), dw, scratch, w_rows.data(), act, x_rows.data(),
          offsets.data(), w, s);
    }
    return o;
  };
  for (const bool bf16 : {false, true}) {
    if (bf16 && k.forward_bf16 == nullptr) break;
    const Out got = bf16 ? run(nullptr, nullptr, k.forward_bf16, k.backward_bf16)
                         : run(k.forward, k.backward, nullptr, nullptr);
    const Out want = bf16 ? run(nullptr, nullptr, grouped_experts_forward_bf16_reference,
                                grouped_experts_backward_bf16_reference)
                          : run(grouped_experts_forward_reference,
                                grouped_experts_backward_reference, nullptr, nullptr);
    const double tol = bf16 ? kBf16Tolerance : fp32_tolerance(std::max(h, Im));
    c.add(bf16 ? "forward_bf16" : "forward", "out_rows", got.out, want.out, tol);
    const std::string form = bf16 ? "backward_bf16" : "backward";
    c.add(form, "dx_rows", got.dx_rows, want.dx_rows, tol);
    c.add(form, "drouting_weight", got.dweight_rows, want.dweight_rows, tol);
    c.add(form, "dweights (gate, up, down)", got.dw, want.dw, tol);
  }
}

void verify_moe_combine(const MoeCombineKernel& k, Checks& c) {
  const ExpertsShape s = check_shape();
  const int64_t R = s.rows(), h = s.hidden;
  const std::vector<int32_t> index = check_routing(s);
  std::vector<int32_t> row_of(R), offsets(s.n_experts + 1);
  moe_dispatch_plan_reference(row_of.data(), offsets.data(), index.data(), s);
  const std::vector<float> out_rows = uniform(R * h, 1), weight = uniform(R, 2, 0.1f, 1.0f),
                           dy = uniform(s.n_tokens * h, 3);
  std::vector<float> y(s.n_tokens * h), want_y(y.size());
  k.forward(y.data(), out_rows.data(), row_of.data(), index.data(), weight.data(), s);
  moe_combine_forward_reference(want_y.data(), out_rows.data(), row_of.data(), index.data(),
                                weight.data(), s);
  c.add("forward", "y", y, want_y, fp32_tolerance(s.top_k));
  std::vector<float> dy_rows(R * h), want_dy_rows(R * h), w_rows(R), want_w_rows(R);
  k.backward(dy_rows.data(), w_rows.data(), dy.data(), weight.data(), row_of.data(), s);
  moe_combine_backward_reference(want_dy_rows.data(), want_w_rows.data(), dy.data(), weight.data(),
                                 row_of.data(), s);
  c.add("backward", "dy_rows", dy_rows, want_dy_rows, 0.0);
  c.add("backward", "w_rows", w_rows, want_w_rows, 0.0);
}

}  // namespace titan::verify_checks
