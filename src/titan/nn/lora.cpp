#include "titan/nn/lora.h"

#include <algorithm>

#include "titan/core/error.h"
#include "titan/core/rng.h"
#include "titan/dispatch/device_ops.h"

namespace titan {

LoraRankRooms LoraLinear::rank_rooms(int64_t n) const {
  LoraScratch& sc = *scratch;
  const int64_t tokens = std::max(sc.room_tokens, n), r = std::max(sc.room_rank, rank),
                in = std::max(sc.room_in, in_features), out = std::max(sc.room_out, out_features);
  // fp32: low (2 N r), B^T (r out); then bf16: low (2 N r), A (r in), B and B^T (out r each).
  const int64_t floats = 2 * tokens * r + r * out, halves = 2 * tokens * r + r * in + 2 * out * r;
  if (sc.rank_rooms.data() == nullptr || tokens > sc.room_tokens || r > sc.room_rank ||
      in > sc.room_in || out > sc.room_out) {
    sc.rank_rooms = Buffer();  // the old rooms go back before the larger ones are made
    sc.rank_rooms = Buffer(backend().memory(),
                           static_cast<size_t>(floats) * sizeof(float) +
                               static_cast<size_t>(halves) * sizeof(uint16_t),
                           MemCategory::other);
    sc.room_tokens = tokens;
    sc.room_rank = r;
    sc.room_in = in;
    sc.room_out = out;
  }
  LoraRankRooms rooms;
  rooms.low = sc.rank_rooms.as<float>();
  rooms.b_t = rooms.low + 2 * tokens * r;
  rooms.low_bf16 = reinterpret_cast<uint16_t*>(rooms.low + floats);
  rooms.a_bf16 = rooms.low_bf16 + 2 * tokens * r;
  rooms.b_bf16 = rooms.a_bf16 + r * in;
  rooms.b_t_bf16 = rooms.b_bf16 + out * r;
  return rooms;
}

LoraDropoutCall LoraLinear::dropout_call() const {
  TITAN_CHECK(device_ops().lora_dropout, name,
              ": this device registers no LoRA dropout (DeviceOps::lora_dropout)");
  const LoraDropout& d = scratch->dropout;
  const uint64_t module = mix64(d.seed ^ fnv1a_hash(name));
  return {d.p, mix64(module ^ static_cast<uint64_t>(d.step)), d.first_row, d.seq_len,
          first_in_feature};
}

float* LoraLinear::dropout_room(int64_t n, int64_t slot) const {
  const auto values = static_cast<size_t>(n * in_features);
  const size_t bytes = values * (2 * sizeof(float) + sizeof(uint16_t));
  if (scratch->dropout_rooms.bytes() < bytes) {
    scratch->dropout_rooms = Buffer();  // the old rooms go back before the larger ones are made
    scratch->dropout_rooms = Buffer(backend().memory(), bytes, MemCategory::other);
  }
  return scratch->dropout_rooms.as<float>() + slot * static_cast<int64_t>(values);
}

uint16_t* LoraLinear::dropout_room_bf16(int64_t n) const {
  return reinterpret_cast<uint16_t*>(dropout_room(n, 2));
}

const float* LoraLinear::dropped(const float* x, int64_t n) const {
  if (!drops()) return x;
  float* masked = dropout_room(n, 0);
  device_ops().lora_dropout(masked, x, n, in_features, dropout_call(), false);
  return masked;
}

const uint16_t* LoraLinear::dropped_bf16(const uint16_t* x, int64_t n) const {
  if (!drops()) return x;
  // The rounded input widened, masked and scaled, and rounded again (PEFT under autocast rounds
  // dropout(x) once: the two differ where x * 1 / (1 - p) rounds off x's bf16 grid).
  float* masked = dropout_room(n, 0);
  device_ops().widen_bf16(masked, x, n * in_features);
  device_ops().lora_dropout(masked, masked, n, in_features, dropout_call(), false);
  uint16_t* rounded = dropout_room_bf16(n);
  device_ops().round_to_bf16(rounded, masked, n * in_features);
  return rounded;
}

void LoraLinear::forward_add(float* y, const float* x_in, int64_t n,
                             const LinearKernel& kernel) const {
  TITAN_CHECK(x_in != nullptr, name, ": LoRA needs the linear's input in fp32");
  const float* x = dropped(x_in, n);
  const LoraRankRooms rooms = rank_rooms(n);
  float* u = rooms.low;    // (N, rank) scaling * x A^T
  float* b_t = rooms.b_t;  // (rank, out) B^T
  kernel.forward(u, x, a, n, in_features, rank);
  device_ops().scale(u, scaling, n * rank);
  device_ops().transpose(b_t, b, out_features, rank);
  // y += u B: the kernel's input-gradient product (dx += dy W, no weight gradient) with W = B^T,
  // so the update is added in the GEMM, without an (N, out) temporary. Scaling the rank-wide u
  // rather than the product, as PEFT does, differs from it only in rounding.
  kernel.backward(y, nullptr, u, nullptr, b_t, n, out_features, rank, true);
}

void LoraLinear::backward(float* dx, const float* dy, const float* x_in, int64_t n,
                          const LinearKernel& kernel) const {
  TITAN_CHECK(x_in != nullptr && dy != nullptr, name,
              ": LoRA's backward needs the linear's input and output gradient in fp32");
  TITAN_CHECK(a_grad != nullptr && b_grad != nullptr, name, ": LoRA gradients not allocated");
  const float* x = dropped(x_in, n);
  float* low = rank_rooms(n).low;
  float* u = low;              // (N, rank) scaling * x A^T
  float* du = low + n * rank;  // (N, rank) scaling * dy B
  kernel.forward(u, x, a, n, in_features, rank);
  device_ops().scale(u, scaling, n * rank);
  // du = dy B, dB += dy^T u (u carries the scaling); then du *= scaling, dx += du A,
  // dA += du^T x.
  kernel.backward(du, b_grad, dy, u, b, n, rank, out_features, false);
  device_ops().scale(du, scaling, n * rank);
  if (!drops()) {
    kernel.backward(dx, a_grad, du, x, a, n, in_features, rank, true);
    return;
  }
  float* share = dropout_room(n, 1);  // (N, in) du A, before the mask
  kernel.backward(share, a_grad, du, x, a, n, in_features, rank, false);
  device_ops().lora_dropout(dx, share, n, in_features, dropout_call(), true);
}

const uint16_t* LoraLinear::round_weights(const LoraRankRooms& rooms, bool transposed) const {
  device_ops().round_to_bf16(rooms.a_bf16, a, rank * in_features);
  if (!transposed) {
    device_ops().round_to_bf16(rooms.b_bf16, b, out_features * rank);
    return rooms.b_bf16;
  }
  // Rounding is per element, so B^T rounded is B rounded, transposed.
  device_ops().transpose(rooms.b_t, b, out_features, rank);
  device_ops().round_to_bf16(rooms.b_t_bf16, rooms.b_t, rank * out_features);
  return rooms.b_t_bf16;
}

void LoraLinear::forward_add_bf16(float* y, const uint16_t* x_in, int64_t n,
                                  const LinearKernel& kernel) const {
  TITAN_CHECK(x_in != nullptr, name, ": LoRA in bf16 needs the linear's input rounded to bf16");
  TITAN_CHECK(kernel.forward_bf16 != nullptr && kernel.backward_bf16 != nullptr, name,
              ": LoRA in bf16 needs its linear kernel's bf16 forms");
  const uint16_t* x = dropped_bf16(x_in, n);
  const LoraRankRooms rooms = rank_rooms(n);
  const uint16_t* b_t = round_weights(rooms, true);
  float* u = rooms.low;               // (N, rank)
  uint16_t* u_bf16 = rooms.low_bf16;  // (N, rank)
  kernel.forward_bf16(u, x, rooms.a_bf16, n, in_features, rank);
  device_ops().scale(u, scaling, n * rank);
  device_ops().round_to_bf16(u_bf16, u, n * rank);
  // y += round(u) B^T through the input-gradient product, as forward_add does in fp32.
  kernel.backward_bf16(y, nullptr, u_bf16, nullptr, b_t, n, out_features, rank, true);
}

void LoraLinear::backward_bf16(float* dx, const uint16_t* dy, const uint16_t* x_in, int64_t n,
                               const LinearKernel& kernel) const {
  TITAN_CHECK(x_in != nullptr && dy != nullptr, name,
              ": LoRA's bf16 backward needs the linear's input and output gradient in bf16");
  TITAN_CHECK(a_grad != nullptr && b_grad != nullptr, name, ": LoRA gradients not allocated");
  const uint16_t* x = dropped_bf16(x_in, n);
  const LoraRankRooms rooms = rank_rooms(n);
  const uint16_t* b_bf16 = round_weights(rooms, false);
  const uint16_t* a_bf16 = rooms.a_bf16;
  float* low = rooms.low;
  uint16_t* low_bf16 = rooms.low_bf16;
  float* u = low;                           // (N, rank) scaling * x A^T, made again
  float* du = low + n * rank;               // (N, rank) scaling * dy B
  uint16_t* u_bf16 = low_bf16;              // (N, rank)
  uint16_t* du_bf16 = low_bf16 + n * rank;  // (N, rank)
  kernel.forward_bf16(u, x, a_bf16, n, in_features, rank);
  device_ops().scale(u, scaling, n * rank);
  device_ops().round_to_bf16(u_bf16, u, n * rank);
  kernel.backward_bf16(du, b_grad, dy, u_bf16, b_bf16, n, rank, out_features, false);
  device_ops().scale(du, scaling, n * rank);
  device_ops().round_to_bf16(du_bf16, du, n * rank);
  if (!drops()) {
    kernel.backward_bf16(dx, a_grad, du_bf16, x, a_bf16, n, in_features, rank, true);
    return;
  }
  float* share = dropout_room(n, 1);  // (N, in) round(du) A, unmasked
  kernel.backward_bf16(share, a_grad, du_bf16, x, a_bf16, n, in_features, rank, false);
  device_ops().lora_dropout(dx, share, n, in_features, dropout_call(), true);
}

}  // namespace titan

namespace titan {
namespace {

ExpertLoraShape pair_shape(const ExpertLora& l, const ExpertLoraPair& p, int64_t in, int64_t out) {
  return {l.n_experts, p.rank, in, out, l.scaling};
}

}  // namespace

float* ExpertLora::merged_room(int64_t slot) const {
  const int64_t size = n_experts * hidden * inter;
  if (scratch->merged.data() == nullptr) {
    scratch->merged = Buffer(backend().memory(),
                             static_cast<size_t>(2 * adapted_weights() * size) * sizeof(float),
                             MemCategory::other);
  }
  return scratch->merged.as<float>() + slot * size;
}

ExpertWeights ExpertLora::merged(const ExpertWeights& base) const {
  TITAN_CHECK(device_ops().expert_lora_merge && device_ops().expert_lora_backward, name,
              ": this device registers no LoRA-on-experts ops (DeviceOps::expert_lora_merge)");
  ExpertWeights w = base;
  const int64_t e = n_experts, h = hidden, im = inter;
  int64_t slot = 0;
  if (gate_up.rank > 0) {
    const ExpertLoraShape s = pair_shape(*this, gate_up, h, im);
    float* gate = merged_room(slot++);
    float* up = merged_room(slot++);
    device_ops().expert_lora_merge(gate, base.gate, gate_up.a, gate_up.b, s);
    device_ops().expert_lora_merge(up, base.up, gate_up.a, gate_up.b + im * gate_up.rank * e, s);
    w.gate = gate;
    w.up = up;
  }
  if (down.rank > 0) {
    float* d = merged_room(slot);
    device_ops().expert_lora_merge(d, base.down, down.a, down.b, pair_shape(*this, down, im, h));
    w.down = d;
  }
  return w;
}

ExpertWeightsBf16 ExpertLora::rounded(const ExpertWeights& merged,
                                      const ExpertWeightsBf16& base) const {
  ExpertWeightsBf16 w = base;
  const int64_t size = n_experts * hidden * inter;
  if (scratch->rounded.data() == nullptr) {
    scratch->rounded =
        Buffer(backend().memory(), static_cast<size_t>(adapted_weights() * size) * sizeof(uint16_t),
               MemCategory::other);
  }
  uint16_t* next = scratch->rounded.as<uint16_t>();
  const auto round = [&](const float* values) {
    device_ops().round_to_bf16(next, values, size);
    next += size;
    return next - size;
  };
  if (gate_up.rank > 0) {
    w.gate = round(merged.gate);
    w.up = round(merged.up);
  }
  if (down.rank > 0) w.down = round(merged.down);
  return w;
}

ExpertGrads ExpertLora::merged_grads() const {
  const int64_t size = n_experts * hidden * inter;
  int64_t slot = adapted_weights();
  ExpertGrads g;
  if (gate_up.rank > 0) {
    g.gate = merged_room(slot++);
    g.up = merged_room(slot++);
    device_ops().zero(g.gate, size);
    device_ops().zero(g.up, size);
  }
  if (down.rank > 0) {
    g.down = merged_room(slot);
    device_ops().zero(g.down, size);
  }
  return g;
}

void ExpertLora::backward(const ExpertGrads& dmerged) const {
  const int64_t e = n_experts, h = hidden, im = inter;
  if (gate_up.rank > 0) {
    TITAN_CHECK(gate_up.a_grad != nullptr && gate_up.b_grad != nullptr, name,
                ": LoRA gradients not allocated");
    const ExpertLoraShape s = pair_shape(*this, gate_up, h, im);
    const int64_t up_rows = im * gate_up.rank * e;  // B's offset of up's rows
    device_ops().expert_lora_backward(gate_up.a_grad, gate_up.b_grad, dmerged.gate, gate_up.a,
                                      gate_up.b, s);
    device_ops().expert_lora_backward(gate_up.a_grad, gate_up.b_grad + up_rows, dmerged.up,
                                      gate_up.a, gate_up.b + up_rows, s);
  }
  if (down.rank > 0) {
    TITAN_CHECK(down.a_grad != nullptr && down.b_grad != nullptr, name,
                ": LoRA gradients not allocated");
    device_ops().expert_lora_backward(down.a_grad, down.b_grad, dmerged.down, down.a, down.b,
                                      pair_shape(*this, down, im, h));
  }
}

}  // namespace titan
