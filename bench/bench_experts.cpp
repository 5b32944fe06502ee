// The MoE experts kernels on one sparse layer, timed: forward and backward of every registered
// experts kernel except the reference, in each dtype it takes (fp32; bf16 GEMM operands with fp32
// accumulation), each checked first on a few tokens against the reference in the same dtype. In
// GFLOP/s of the expert GEMMs (forward 3, backward 6 of 2 * rows * h * Im each; the bf16 backward
// runs a seventh, which is not counted) and as a share of that dtype's GEMM ceiling measured in
// the same run. Routing is random, k distinct experts per token.
//
// usage: bench_experts [--tokens N] [--hidden H] [--inter IM] [--experts E] [--top-k K]
//                      [--steps N] [--threads N]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_main.h"
#include "titan/backend/cpu/gemm.h"
#include "titan/backend/cpu/threads.h"
#include "titan/core/dtype.h"
#include "titan/core/error.h"
#include "titan/core/rng.h"
#include "titan/dispatch/registry.h"

namespace titan {
namespace {

using titan::bench::now_seconds;

// Everything one experts call reads and writes, for `shape`.
struct ExpertsProblem {
  ExpertsShape shape;
  std::vector<float> x, dy, y, dx, weight, dweight, gate, up, down, dgate_w, dup_w, ddown_w;
  std::vector<uint16_t> gate_bf16, up_bf16, down_bf16;  // the weights rounded, for bf16 kernels
  std::vector<float> act_gate, act_up, act_act, sx, sy, sdgate, sdup, sdact, w_rows, dweight_rows,
      sout;
  std::vector<int32_t> index, row_of, offsets;

  explicit ExpertsProblem(const ExpertsShape& s) : shape(s) {
    const int64_t n = s.n_tokens, h = s.hidden, Im = s.inter, E = s.n_experts, k = s.top_k;
    const int64_t rows = s.rows();
    const auto randn = [](int64_t count, uint64_t seed, float std) {
      std::vector<float> v(static_cast<size_t>(count));
      Rng(seed).fill_normal(v.data(), count, 0.0f, std);
      return v;
    };
    x = randn(n * h, 1, 1.0f);
    dy = randn(n * h, 2, 1.0f);
    gate = randn(E * Im * h, 3, 0.02f);
    up = randn(E * Im * h, 4, 0.02f);
    down = randn(E * h * Im, 5, 0.02f);
    const auto rounded = [](const std::vector<float>& w) {
      std::vector<uint16_t> out(w.size());
      for (size_t i = 0; i < w.size(); ++i) out[i] = f32_to_bf16(w[i]);
      return out;
    };
    gate_bf16 = rounded(gate);
    up_bf16 = rounded(up);
    down_bf16 = rounded(down);
    for (auto* v : {&dgate_w, &dup_w}) v->assign(E * Im * h, 0.0f);
    ddown_w.assign(E * h * Im, 0.0f);
    for (auto* v : {&y, &dx}) v->resize(n * h);
    for (auto* v : {&weight, &dweight}) v->assign(rows, 1.0f / static_cast<float>(k));
    for (auto* v : {&act_gate, &act_up, &act_act, &sdgate, &sdup, &sdact}) v->resize(rows * Im);
    for (auto* v : {&sx, &sy, &sout}) v->resize(rows * h);
    for (auto* v : {&w_rows, &dweight_rows}) v->resize(rows);
    index.resize(rows);
    row_of.resize(rows);
    offsets.resize(E + 1);
    Rng pick(6);
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t j = 0; j < k; ++j) {
        int32_t e = 0;
        bool taken = true;
        while (taken) {
          e = static_cast<int32_t>(pick.next_u64() % static_cast<uint64_t>(E));
          taken = std::find(&index[t * k], &index[t * k] + j, e) != &index[t * k] + j;
        }
        index[t * k + j] = e;
      }
    }
  }
  ExpertsActivations act() {
    return {act_gate.data(), act_up.data(), act_act.data(), row_of.data(), offsets.data()};
  }
  ExpertsScratch scratch() {
    // w_rows, dweight_rows and out: experts_staged's backward (ops/moe_stages.h).
    return {sx.data(),    sy.data(),     sdgate.data(),       sdup.data(),
            sdact.data(), w_rows.data(), dweight_rows.data(), sout.data()};
  }
  void forward(const ExpertsKernel& kernel, DType dtype) {
    if (dtype == DType::bf16) {
      kernel.forward_bf16(y.data(), act(), scratch(), x.data(), index.data(), weight.data(),
                          {gate_bf16.data(), up_bf16.data(), down_bf16.data()}, shape);
    } else {
      kernel.forward(y.data(), act(), scratch(), x.data(), index.data(), weight.data(),
                     {gate.data(), up.data(), down.data()}, shape);
    }
  }
  void backward(const ExpertsKernel& kernel, DType dtype) {
    const ExpertGrads grads{dgate_w.data(), dup_w.data(), ddown_w.data()};
    if (dtype == DType::bf16) {
      kernel.backward_bf16(dx.data(), dweight.data(), grads, scratch(), dy.data(), act(), x.data(),
                           index.data(), weight.data(),
                           {gate_bf16.data(), up_bf16.data(), down_bf16.data()}, shape);
    } else {
      kernel.backward(dx.data(), dweight.data(), grads, scratch(), dy.data(), act(), x.data(),
                      index.data(), weight.data(), {gate.data(), up.data(), down.data()}, shape);
    }
  }
};

double max_rel_error(const std::vector<float>& got, const std::vector<float>& want) {
  double err = 0.0, ref = 1e-30;
  for (size_t i = 0; i < got.size(); ++i) {
    err = std::max(err, static_cast<double>(std::abs(got[i] - want[i])));
    ref = std::max(ref, static_cast<double>(std::abs(want[i])));
  }
  return err / ref;
}

int run(int argc, char** argv) {
  ExpertsShape shape{512, 1024, 384, 64, 8};
  int steps = 3, threads = default_thread_count();
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string arg = argv[i];
    const int64_t value = std::atoll(argv[i + 1]);
    if (arg == "--tokens")
      shape.n_tokens = value;
    else if (arg == "--hidden")
      shape.hidden = value;
    else if (arg == "--inter")
      shape.inter = value;
    else if (arg == "--experts")
      shape.n_experts = value;
    else if (arg == "--top-k")
      shape.top_k = value;
    else if (arg == "--steps")
      steps = static_cast<int>(value);
    else if (arg == "--threads")
      threads = static_cast<int>(value);
    else
      fail("unknown option ", arg);
  }
  TITAN_CHECK(shape.top_k >= 1 && shape.top_k <= shape.n_experts, "--top-k must be in [1, E]");
  set_thread_count(threads);
  const double ceiling_f32 = measure_gemm_ceiling_gflops();
  const double ceiling_bf16 = measure_gemm_bf16_ceiling_gflops();
  const double gemm_flops =
      2.0 * static_cast<double>(shape.rows()) * static_cast<double>(shape.hidden * shape.inter);
  std::printf(
      "experts: %lld tokens, h %lld, Im %lld, E %lld, k %lld (%.1f rows per expert), "
      "threads %d, GEMM ceiling fp32 %.1f GFLOP/s, bf16 %.1f GFLOP/s\n",
      static_cast<long long>(shape.n_tokens), static_cast<long long>(shape.hidden),
      static_cast<long long>(shape.inter), static_cast<long long>(shape.n_experts),
      static_cast<long long>(shape.top_k),
      static_cast<double>(shape.rows()) / static_cast<double>(shape.n_experts), threads,
      ceiling_f32, ceiling_bf16);

  const KernelEntry& reference = kernel_registry().get("experts_reference", OpKind::experts);
  const ExpertsKernel& reference_kernel = std::get<ExpertsKernel>(reference.impl);
  for (const KernelEntry* entry : kernel_registry().entries()) {
    if (entry->kind != OpKind::experts || entry == &reference) continue;
    const ExpertsKernel& kernel = std::get<ExpertsKernel>(entry->impl);
    for (const DType dtype : entry->dtypes) {
      // Checked first on a few tokens against the reference in the same dtype.
      ExpertsShape small = shape;
      small.n_tokens = 3;
      ExpertsProblem check(small), want(small);
      check.forward(kernel, dtype);
      check.backward(kernel, dtype);
      want.forward(reference_kernel, dtype);
      want.backward(reference_kernel, dtype);
      const double err = std::max({max_rel_error(check.y, want.y), max_rel_error(check.dx, want.dx),
                                   max_rel_error(check.ddown_w, want.ddown_w)});
      // In bf16 an fp32 summation difference may carry an intermediate across a rounding
      // boundary: one bf16 ulp (2^-8) in a weight gradient that, at 3 tokens, is one row's product.
      const double tolerance = dtype == DType::bf16 ? 1e-2 : 1e-4;
      TITAN_CHECK(err < tolerance, entry->name, " in ", dtype_name(dtype),
                  " disagrees with experts_reference (", err, ")");

      ExpertsProblem p(shape);
      p.forward(kernel, dtype);  // warm-up
      p.backward(kernel, dtype);
      double forward_s = 1e30, backward_s = 1e30;
      for (int s = 0; s < steps; ++s) {
        const double t0 = now_seconds();
        p.forward(kernel, dtype);
        const double t1 = now_seconds();
        p.backward(kernel, dtype);
        const double t2 = now_seconds();
        forward_s = std::min(forward_s, t1 - t0);
        backward_s = std::min(backward_s, t2 - t1);
      }
      const double peak = dtype == DType::bf16 ? ceiling_bf16 : ceiling_f32;
      const double fwd = 3 * gemm_flops / forward_s * 1e-9,
                   bwd = 6 * gemm_flops / backward_s * 1e-9;
      std::printf(
          "  %-20s %-4s forward %7.2f ms %6.1f GFLOP/s (%3.0f%%)  backward %7.2f ms %6.1f "
          "GFLOP/s (%3.0f%%)\n",
          entry->name.c_str(), std::string(dtype_name(dtype)).c_str(), forward_s * 1e3, fwd,
          100 * fwd / peak, backward_s * 1e3, bwd, 100 * bwd / peak);
    }
  }
  return 0;
}

}  // namespace
}  // namespace titan

int main(int argc, char** argv) {
  return titan::bench::run_main("bench_experts", titan::run, argc, argv);
}
