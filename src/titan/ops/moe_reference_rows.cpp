#include "titan/ops/moe_reference_rows.h"

#include <cmath>
#include <vector>

#include "titan/core/dtype.h"
#include "titan/ops/moe_rows.h"

namespace titan::moe_reference {

using moe_rows::round_bf16;
using moe_rows::widen;

namespace {

// act, fp32: silu(gate) * up in fp64 from the kept gate and up, which the backward recomputes
// from them as the forward computed it; under bf16 from their roundings, rounded.
float product_of(float gate, float up) {
  const double g = gate;
  return static_cast<float>(g / (1.0 + std::exp(-g)) * up);
}
uint16_t product_of_bf16(uint16_t gate, uint16_t up) {
  return f32_to_bf16(product_of(bf16_to_f32(gate), bf16_to_f32(up)));
}

}  // namespace

void row_forward(double* out, const ExpertsActivations& act, const float* x_row, int64_t e,
                 int64_t r, const ExpertWeights& w, const ExpertsShape& shape) {
  const int64_t h = shape.hidden, Im = shape.inter;
  for (int64_t i = 0; i < Im; ++i) {
    double g = 0.0, u = 0.0;
    for (int64_t c = 0; c < h; ++c) {
      g += static_cast<double>(w.gate[(e * Im + i) * h + c]) * x_row[c];
      u += static_cast<double>(w.up[(e * Im + i) * h + c]) * x_row[c];
    }
    act.gate[r * Im + i] = static_cast<float>(g);
    act.up[r * Im + i] = static_cast<float>(u);
    act.act[r * Im + i] = product_of(act.gate[r * Im + i], act.up[r * Im + i]);
  }
  for (int64_t c = 0; c < h; ++c) {
    double sum = 0.0;
    for (int64_t i = 0; i < Im; ++i) {
      sum += static_cast<double>(w.down[(e * h + c) * Im + i]) * act.act[r * Im + i];
    }
    out[c] = sum;
  }
}

float row_backward(double* dx_sum, const ExpertGrads& dw, const float* dy_row, float weight,
                   const ExpertsActivations& act, const float* x_row, int64_t e, int64_t r,
                   const ExpertWeights& w, const ExpertsShape& shape) {
  const int64_t h = shape.hidden, Im = shape.inter;
  const double wr = weight;
  std::vector<double> dgate(static_cast<size_t>(Im)), dup(static_cast<size_t>(Im));
  std::vector<float> act_row(static_cast<size_t>(Im));  // recomputed, as the contract says
  for (int64_t i = 0; i < Im; ++i) {
    act_row[i] = product_of(act.gate[r * Im + i], act.up[r * Im + i]);
  }
  double d_weight = 0.0;
  for (int64_t i = 0; i < Im; ++i) {
    double g = 0.0;  // (dy down_e)_i, unweighted
    for (int64_t c = 0; c < h; ++c)
      g += static_cast<double>(w.down[(e * h + c) * Im + i]) * dy_row[c];
    d_weight += g * act_row[i];
    const double gate = act.gate[r * Im + i], sig = 1.0 / (1.0 + std::exp(-gate));
    const double dact = wr * g;
    dup[i] = dact * gate * sig;
    dgate[i] = dact * act.up[r * Im + i] * sig * (1.0 + gate * (1.0 - sig));
  }
  for (int64_t c = 0; c < h; ++c) {
    for (int64_t i = 0; i < Im; ++i) {
      if (dw.down != nullptr)
        dw.down[(e * h + c) * Im + i] += static_cast<float>(wr * dy_row[c] * act_row[i]);
    }
  }
  for (int64_t i = 0; i < Im; ++i) {
    for (int64_t c = 0; c < h; ++c) {
      if (dw.gate != nullptr)
        dw.gate[(e * Im + i) * h + c] += static_cast<float>(dgate[i] * x_row[c]);
      if (dw.up != nullptr) dw.up[(e * Im + i) * h + c] += static_cast<float>(dup[i] * x_row[c]);
      dx_sum[c] += w.gate[(e * Im + i) * h + c] * dgate[i] + w.up[(e * Im + i) * h + c] * dup[i];
    }
  }
  return static_cast<float>(d_weight);
}

void row_forward_bf16(double* out, const ExpertsActivations& act, const double* x_row, int64_t e,
                      int64_t r, const ExpertWeightsBf16& w, const ExpertsShape& shape) {
  const int64_t h = shape.hidden, Im = shape.inter;
  auto* act_bf16 = reinterpret_cast<uint16_t*>(act.act);
  auto* gate_bf16 = reinterpret_cast<uint16_t*>(act.gate);
  auto* up_bf16 = reinterpret_cast<uint16_t*>(act.up);
  for (int64_t i = 0; i < Im; ++i) {
    double g = 0.0, u = 0.0;
    for (int64_t c = 0; c < h; ++c) {
      g += widen(w.gate[(e * Im + i) * h + c]) * x_row[c];
      u += widen(w.up[(e * Im + i) * h + c]) * x_row[c];
    }
    // gate and up rounded to bf16 and kept so; act from those roundings.
    gate_bf16[r * Im + i] = f32_to_bf16(static_cast<float>(g));
    up_bf16[r * Im + i] = f32_to_bf16(static_cast<float>(u));
    act_bf16[r * Im + i] = product_of_bf16(gate_bf16[r * Im + i], up_bf16[r * Im + i]);
  }
  for (int64_t c = 0; c < h; ++c) {
    double sum = 0.0;
    for (int64_t i = 0; i < Im; ++i) {
      sum += widen(w.down[(e * h + c) * Im + i]) * widen(act_bf16[r * Im + i]);
    }
    out[c] = sum;
  }
}

float row_backward_bf16(double* dx_sum, const ExpertGrads& dw, const float* dy_row, float weight,
                        const ExpertsActivations& act, const double* x_row, int64_t e, int64_t r,
                        const ExpertWeightsBf16& w, const ExpertsShape& shape) {
  const int64_t h = shape.hidden, Im = shape.inter;
  const auto* gate_bf16 = reinterpret_cast<const uint16_t*>(act.gate);
  const auto* up_bf16 = reinterpret_cast<const uint16_t*>(act.up);
  std::vector<double> dy_down(static_cast<size_t>(h)), dgate(static_cast<size_t>(Im)),
      dup(static_cast<size_t>(Im));
  std::vector<uint16_t> act_row(static_cast<size_t>(Im));  // recomputed, as the contract says
  for (int64_t i = 0; i < Im; ++i) {
    act_row[i] = product_of_bf16(gate_bf16[r * Im + i], up_bf16[r * Im + i]);
  }
  // d weight = <dy, the expert's fp32 output>; down_proj's output gradient is weight * dy,
  // rounded.
  double d_weight = 0.0;
  for (int64_t c = 0; c < h; ++c) {
    double out = 0.0;
    for (int64_t i = 0; i < Im; ++i) {
      out += widen(w.down[(e * h + c) * Im + i]) * widen(act_row[i]);
    }
    d_weight += static_cast<double>(dy_row[c]) * static_cast<float>(out);
    dy_down[c] = round_bf16(weight * dy_row[c]);
  }
  for (int64_t i = 0; i < Im; ++i) {
    double dact = 0.0;
    for (int64_t c = 0; c < h; ++c) dact += widen(w.down[(e * h + c) * Im + i]) * dy_down[c];
    // SwiGLU's backward reads gate and up as kept: rounded to bf16.
    const double gate = widen(gate_bf16[r * Im + i]), sig = 1.0 / (1.0 + std::exp(-gate));
    const auto dact_f = static_cast<float>(dact);
    dup[i] = round_bf16(static_cast<float>(dact_f * gate * sig));
    dgate[i] = round_bf16(
        static_cast<float>(dact_f * widen(up_bf16[r * Im + i]) * sig * (1.0 + gate * (1.0 - sig))));
  }
  for (int64_t c = 0; c < h; ++c) {
    for (int64_t i = 0; i < Im; ++i) {
      if (dw.down != nullptr)
        dw.down[(e * h + c) * Im + i] += static_cast<float>(dy_down[c] * widen(act_row[i]));
    }
  }
  for (int64_t i = 0; i < Im; ++i) {
    for (int64_t c = 0; c < h; ++c) {
      if (dw.gate != nullptr)
        dw.gate[(e * Im + i) * h + c] += static_cast<float>(dgate[i] * x_row[c]);
      if (dw.up != nullptr) dw.up[(e * Im + i) * h + c] += static_cast<float>(dup[i] * x_row[c]);
      dx_sum[c] += widen(w.gate[(e * Im + i) * h + c]) * dgate[i] +
                   widen(w.up[(e * Im + i) * h + c]) * dup[i];
    }
  }
  return static_cast<float>(d_weight);
}

}  // namespace titan::moe_reference
