"""titan's LoRA dropout masks (src/titan/ops/lora_dropout.h), computed here from the formula that
header documents, so PEFT can train with the very masks titan draws.

  mix64(x)      = SplitMix64's output of x + 0x9e3779b97f4a7c15 (core/rng.h)
  module        = mix64(seed ^ fnv1a_64(module name, e.g. "model.layers.0.self_attn.q_proj"))
  call          = mix64(module ^ step)                 step: 1-based
  token         = mix64(mix64(call ^ row) ^ position)  row: in the step's whole global batch
  keep(feature) = (mix64(token ^ feature) >> 11) * 2^-53 >= p
  dropout(x)    = x * float32(1 / (1 - p)) where kept, else 0
"""
import numpy as np
import torch

MASK = (1 << 64) - 1


def fnv1a(text):
    h = 0xcbf29ce484222325
    for c in text.encode():
        h = ((h ^ c) * 0x100000001b3) & MASK
    return h


def mix64(x):
    """x: a numpy uint64 array (or scalar); arithmetic wraps modulo 2^64."""
    with np.errstate(over="ignore"):
        z = np.asarray(x, dtype=np.uint64) + np.uint64(0x9e3779b97f4a7c15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xbf58476d1ce4e5b9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94d049bb133111eb)
        return z ^ (z >> np.uint64(31))


def keep_mask(seed, module, step, rows, positions, features, p):
    """(len(rows), positions, features) booleans: whether titan keeps each input element."""
    call = mix64(mix64(np.uint64(seed) ^ np.uint64(fnv1a(module))) ^ np.uint64(step))
    r = np.asarray(rows, dtype=np.uint64)[:, None]
    pos = np.arange(positions, dtype=np.uint64)[None, :]
    token = mix64(mix64(call ^ r) ^ pos)
    bits = mix64(token[:, :, None] ^ np.arange(features, dtype=np.uint64)[None, None, :])
    return (bits >> np.uint64(11)).astype(np.float64) * 2.0**-53 >= p


class Where:
    """What the masks are keyed by now: the step and the micro-batch's first global row."""
    step = 1
    first_row = 0


class TitanDropout(torch.nn.Module):
    """PEFT's lora_dropout module replaced: titan's mask for `module` on an input (B, S, in)."""

    def __init__(self, module, p, seed, where):
        super().__init__()
        self.module, self.p, self.seed, self.where = module, p, seed, where

    def forward(self, x):
        if not self.training:
            return x
        b, s, f = x.shape
        rows = range(self.where.first_row, self.where.first_row + b)
        keep = torch.from_numpy(keep_mask(self.seed, self.module, self.where.step, rows, s, f,
                                          self.p))
        scale = torch.tensor(1.0 / (1.0 - self.p), dtype=torch.float32).to(x.dtype)
        return torch.where(keep, x * scale, torch.zeros((), dtype=x.dtype))


def install(model, p, seed):
    """Every LoRA layer of the PeftModel `model` drops out its input as titan does; returns the
    Where its masks read."""
    where = Where()
    count = 0
    for name, module in model.named_modules():
        if hasattr(module, "lora_dropout") and "default" in module.lora_dropout:
            titan_name = name.removeprefix("base_model.model.")
            module.lora_dropout["default"] = TitanDropout(titan_name, p, seed, where)
            count += 1
    assert count > 0, "no LoRA layer to drop out"
    return where
