// What `titan verify-kernels` (dispatch/verify.h) checks every kernel with: the tolerances, the
// random inputs, and the list of checks a report collects. Internal to dispatch/: verify.cpp,
// verify_moe.cpp (the MoE kinds) and verify_vocab_parallel.cpp share it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "titan/core/dtype.h"
#include "titan/core/error.h"
#include "titan/core/rng.h"
#include "titan/dispatch/verify.h"

namespace titan::verify_checks {

// fp32 forms: the kernel and the reference (fp64 sums, one rounding at the end) differ by the
// kernel's fp32 roundings, at most `terms` + 4 on an output's path (one per term of its longest
// sum, a few for the steps around it), each at most 2^-24 of a partial sum. On these inputs
// (uniform in [-1, 1), or positive where the op needs it) no partial sum exceeds 16 times the
// largest output, so the normwise error is at most 16 (terms + 4) 2^-24: 1e-4 for 100 terms.
inline double fp32_tolerance(int64_t terms) {
  return 16.0 * static_cast<double>(terms + 4) * std::ldexp(1.0, -24);
}

// bf16 forms: each value rounded to bf16 moves by at most 2^-9 of itself, 2^-8 where the kernel
// and the reference round an intermediate on either side of a tie's boundary; an output passes
// through at most three such roundings (an operand, an intermediate, the output itself) and, as
// above, sums terms at most 16 times its size: 16 x 3 x 2^-8 < 2^-4. 2^-5 is kept: a wrong
// index, term, scale, sign or dtype moves an output by order one.
inline constexpr double kBf16Tolerance = 1.0 / 32.0;

inline std::vector<float> uniform(int64_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  Rng rng(seed, "verify-kernels");
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = lo + (hi - lo) * static_cast<float>(rng.uniform());
  return v;
}

inline std::vector<uint16_t> rounded(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  std::transform(v.begin(), v.end(), out.begin(), f32_to_bf16);
  return out;
}

inline std::vector<float> widened(const std::vector<uint16_t>& v) {
  std::vector<float> out(v.size());
  std::transform(v.begin(), v.end(), out.begin(), bf16_to_f32);
  return out;
}

// The values the bf16 forms see, as fp32: each rounded to bf16 and widened back.
inline std::vector<float> on_bf16_grid(const std::vector<float>& v) {
  return widened(rounded(v));
}

// max |got - want| / max |want|; +inf when got holds a NaN or an infinity.
inline double normwise_error(const float* got, const float* want, size_t n) {
  double diff = 0.0, scale = 0.0;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(got[i])) return std::numeric_limits<double>::infinity();
    diff = std::max(diff, std::fabs(static_cast<double>(got[i]) - want[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(want[i])));
  }
  return scale > 0.0 ? diff / scale : diff;
}

class Checks {
 public:
  explicit Checks(KernelReport& report) : report_(report) {}
  void add(const std::string& form, const std::string& output, const std::vector<float>& got,
           const std::vector<float>& want, double tolerance) {
    TITAN_CHECK(got.size() == want.size(), output, ": ", got.size(), " values against ",
                want.size());
    report_.checks.push_back(
        {form, output, normwise_error(got.data(), want.data(), got.size()), tolerance});
  }
  void add_bf16(const std::string& form, const std::string& output,
                const std::vector<uint16_t>& got, const std::vector<float>& want) {
    add(form, output, widened(got), want, kBf16Tolerance);
  }

 private:
  KernelReport& report_;
};

// The lm_head loss's inputs, on which verify.cpp checks the whole vocabulary and
// verify_vocab_parallel.cpp the ranks' rows: several chunks of tokens, token 5 not scored.
struct LmHeadLossInputs {
  static constexpr int64_t n = 24, hidden = 32, vocab = 300;
  std::vector<float> x = uniform(n * hidden, 1);             // (n, hidden)
  std::vector<float> weight = uniform(vocab * hidden, 2);    // (vocab, hidden)
  std::vector<float> dweight0 = uniform(vocab * hidden, 3);  // (vocab, hidden), d weight before
  std::vector<int32_t> targets = random_targets();           // (n)

 private:
  static std::vector<int32_t> random_targets() {
    std::vector<int32_t> targets(static_cast<size_t>(n));
    Rng rng(4, "verify-kernels targets");
    for (int32_t& t : targets) t = static_cast<int32_t>(rng.next_u64() % vocab);
    targets[5] = kIgnoreIndex;
    return targets;
  }
};

// One lm_head loss form's checks: each rank's loss (one for the whole vocabulary) against
// want_loss, and d x and d weight against theirs.
inline void add_lm_head_loss_checks(Checks& c, const std::string& form,
                                    const std::vector<float>& losses, float want_loss,
                                    const std::vector<float>& dx, const std::vector<float>& want_dx,
                                    const std::vector<float>& dweight,
                                    const std::vector<float>& want_dweight, double tolerance) {
  c.add(form, "loss", losses, std::vector<float>(losses.size(), want_loss), tolerance);
  c.add(form, "dx", dx, want_dx, tolerance);
  c.add(form, "dweight", dweight, want_dweight, tolerance);
}

// The vocabulary-parallel forms of the embedding and the lm_head loss
// (dispatch/verify_vocab_parallel.cpp).
void verify_embedding_vocab_parallel(const EmbeddingKernel& k, Checks& c);
void verify_lm_head_loss_vocab_parallel(const LmHeadLossKernel& k, bool takes_bf16, Checks& c);

// The MoE kinds (dispatch/verify_moe.cpp).
void verify_experts(const ExpertsKernel& k, Checks& c);
void verify_router(const RouterKernel& k, Checks& c);
void verify_moe_dispatch(const MoeDispatchKernel& k, Checks& c);
void verify_grouped_experts(const GroupedExpertsKernel& k, Checks& c);
void verify_moe_combine(const MoeCombineKernel& k, Checks& c);

}  // namespace titan::verify_checks
