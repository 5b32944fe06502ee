// Activation checkpointing: what a training step keeps of each decoder layer's forward for its
// backward and what the backward computes again (torchtitan's activation_checkpoint.mode and
// selective_ac_option; train/job_config.h reads them). Recomputation runs the same kernels on the
// same inputs, so every mode computes the same losses and gradients to the bit.
#pragma once

#include <cstdint>
#include <string>

namespace titan {

struct ActivationCheckpointing {
  enum class Mode {
    none,    // every layer keeps everything its backward reads
    full,    // every layer keeps only its input; its forward runs again in its backward
    layers,  // selective "N": every N-th layer as under full, the others as under none
    ops,     // selective "op": every layer keeps its matmuls' and attention's outputs; its two
             // RMSNorms' outputs (and their bf16 roundings) are made again in its backward
  };
  Mode mode = Mode::none;
  int64_t every = 0;  // Mode::layers: N > 0

  static ActivationCheckpointing none() { return {}; }
  static ActivationCheckpointing full() { return {Mode::full, 0}; }
  static ActivationCheckpointing every_nth_layer(int64_t n) { return {Mode::layers, n}; }
  static ActivationCheckpointing ops() { return {Mode::ops, 0}; }

  // Whether layer i (0-based) keeps only its input. As torchtitan's layer count, "N" recomputes
  // the N-th, 2N-th, ... layer: i + 1 a multiple of N.
  bool recomputes_layer(int64_t i) const {
    return mode == Mode::full || (mode == Mode::layers && (i + 1) % every == 0);
  }
  // Whether the layers keep no RMSNorm output (selective "op").
  bool remakes_norms() const { return mode == Mode::ops; }
  // The same for a LoRA run: under none too (DecoderLM::Retention::lora says why).
  bool lora_remakes_norms() const { return mode == Mode::ops || mode == Mode::none; }
  // As the config spells it: "none", "full", "selective op", "selective 2".
  std::string name() const {
    switch (mode) {
      case Mode::none:
        return "none";
      case Mode::full:
        return "full";
      case Mode::layers:
        return "selective " + std::to_string(every);
      case Mode::ops:
        return "selective op";
    }
    return "";
  }
  bool operator==(const ActivationCheckpointing&) const = default;
};

}  // namespace titan
