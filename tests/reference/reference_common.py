"""What the model reference scripts (qwen3_reference.py, families_reference.py,
mixed_precision_reference.py) share: the batch and its labels, HF's label shift as titan's targets,
non-trivial norm weights, named tensor dicts, the safetensors file with its metadata, and for MoE
models the routing margin and titan's stacked-experts names. Each helper draws from torch's global
RNG in a fixed order, so a script's output depends only on its seed.
"""
import json

import torch
from safetensors.torch import save_file


def hf_targets(labels):
    """HF's CausalLM shift as a tensor: position s is scored against labels[s + 1]."""
    ignore = torch.full_like(labels[:, :1], -100)
    return torch.cat([labels[:, 1:], ignore], dim=1)


def make_batch(vocab_size, batch, seq):
    """Random input ids and HF's labels for them: the ids, with position 1 of every row ignored
    (-100) and, when seq > 4, position seq - 2 of row 0 too -- ignored tokens take no part in the
    loss or its mean."""
    ids = torch.randint(0, vocab_size, (batch, seq), dtype=torch.int64)
    labels = ids.clone()
    labels[:, 1] = -100
    if seq > 4:
        labels[0, seq - 2] = -100
    return ids, labels


def perturb_norms(model):
    """Non-trivial RMSNorm weights (HF initialises them to 1), so a kernel that ignored them would
    fail."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.1 * torch.randn_like(p))


def named(prefix, items):
    """{prefix + name: a detached copy} of (name, tensor) pairs."""
    return {f"{prefix}{k}": v.detach().clone() for k, v in items}


def metadata(overrides, config, batch, seq, **extra):
    """The config overrides as JSON strings plus what every reference file records."""
    meta = {k: json.dumps(v) for k, v in overrides.items()}
    meta.update(rms_norm_eps=json.dumps(config.rms_norm_eps), batch=str(batch), seq=str(seq),
                format="pt", **extra)
    return meta


def save_reference(tensors, path, meta):
    save_file({k: v.contiguous() for k, v in tensors.items()}, path, metadata=meta)


def routing_gap(router_logits, top_k):
    """The smallest gap between any token's k-th and (k+1)-th router probability."""
    gap = float("inf")
    for logits in router_logits:
        probs = torch.softmax(logits.float(), dim=-1).sort(dim=-1, descending=True).values
        gap = min(gap, (probs[:, top_k - 1] - probs[:, top_k]).min().item())
    return gap


def titan_layout(named):
    """Transformers 5's fused experts.gate_up_proj (E, 2 Im, h), gate rows first, as titan's
    stacked experts.gate_proj and experts.up_proj (E, Im, h); every other name unchanged."""
    out = {}
    for key, value in named:
        value = value.detach().clone()
        if key.endswith(".experts.gate_up_proj"):
            gate, up = value.chunk(2, dim=1)
            out[key.replace("gate_up_proj", "gate_proj")] = gate.contiguous()
            out[key.replace("gate_up_proj", "up_proj")] = up.contiguous()
        else:
            out[key] = value
    return out
