"""Reference data for bf16 mixed-precision training, from Hugging Face Transformers' Qwen3 models
(eager attention, float32 master weights) on tiny random configs, computed three ways on the same
weights and batch:

  fp32       the plain float32 step;
  bf16_mm    titan's mixed precision as PyTorch ops: every matmul weight (q/k/v/o, gate/up/down,
             the lm_head, tied or not; not the MoE router) and the matmul's input are rounded to
             bf16, the product accumulates in fp32 and stays fp32; in the backward the output's
             gradient is rounded to bf16 before the two products (d input, d weight), which
             accumulate in fp32; norms, RoPE, attention, softmax, the router and the loss stay
             fp32. Products of bf16 values are exact in fp32, so this equals titan's bf16 step up
             to fp32 summation order;
  autocast   torch.autocast("cpu", dtype=torch.bfloat16), the way PyTorch users train in bf16
             (it also rounds every linear's output, attention's matmuls and the q/k norms' outputs
             to bf16).

For each case it writes OUT_DIR/<case>/model/ (save_pretrained, fp32) and
OUT_DIR/<case>/reference.safetensors with input_ids, targets (I32; HF's labels shifted left),
and for each way W in (fp32, bf16_mm, autocast): W.loss (F32 (1)), W.logits (F32 (B, S, V)) and
W.grad.<hf name> for every parameter.

usage: python mixed_precision_reference.py OUT_DIR
"""
import os
import sys

import torch
import torch.nn.functional as F
from transformers import Qwen3Config, Qwen3ForCausalLM

from reference_common import hf_targets, make_batch, metadata, named, perturb_norms, save_reference

BATCH, SEQ = 2, 24
# h 64 with 4 heads of 16: wide enough that a bf16 rounding is one of many terms in every sum.
# initializer_range 0.1, not HF's 0.02, so the layers move the residual stream well beyond the
# embedding and the rounding of every matmul shows in the loss.
TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
            initializer_range=0.1, rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2)
CASES = {
    "qwen3_tied": dict(tie_word_embeddings=True),
    "qwen3_untied": dict(tie_word_embeddings=False),
}


def bf16(t):
    return t.to(torch.bfloat16).to(torch.float32)


class Bf16Matmul(torch.autograd.Function):
    """y = round(x) round(W)^T + b in fp32; backward rounds dy once for both products."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        xr, wr = bf16(x), bf16(weight)
        ctx.save_for_backward(xr, wr)
        ctx.has_bias = bias is not None
        y = xr @ wr.t()
        return y + bias if bias is not None else y

    @staticmethod
    def backward(ctx, dy):
        xr, wr = ctx.saved_tensors
        dyr = bf16(dy)
        dx = dyr @ wr
        dw = dyr.reshape(-1, dyr.shape[-1]).t() @ xr.reshape(-1, xr.shape[-1])
        db = dy.reshape(-1, dy.shape[-1]).sum(0) if ctx.has_bias else None
        return dx, dw, db


def bf16_forward(module):
    def forward(x):
        return Bf16Matmul.apply(x, module.weight, module.bias)
    return forward


def use_bf16_matmuls(model):
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Linear) and not name.endswith("mlp.gate"):
            m.forward = bf16_forward(m)


def step(model, ids, labels, prefix, autocast=False):
    model.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = model(input_ids=ids, labels=labels)
    out.loss.backward()
    tensors = named(prefix + "grad.", ((k, v.grad.float()) for k, v in model.named_parameters()))
    tensors[prefix + "loss"] = out.loss.detach().float().reshape(1)
    tensors[prefix + "logits"] = out.logits.detach().float()
    return tensors, out.loss.item()


def make(name, overrides, out_dir):
    torch.manual_seed(1357)
    config = Qwen3Config(**{**TINY, **overrides})
    config.architectures = ["Qwen3ForCausalLM"]
    model = Qwen3ForCausalLM._from_config(config, attn_implementation="eager",
                                          dtype=torch.float32)
    perturb_norms(model)
    ids, labels = make_batch(config.vocab_size, BATCH, SEQ)
    folder = os.path.join(out_dir, name)
    model.save_pretrained(os.path.join(folder, "model"))

    tensors = {"input_ids": ids.to(torch.int32), "targets": hf_targets(labels).to(torch.int32)}
    fp32, loss_fp32 = step(model, ids, labels, "fp32.")
    autocast, loss_autocast = step(model, ids, labels, "autocast.", autocast=True)
    use_bf16_matmuls(model)
    bf16_mm, loss_bf16 = step(model, ids, labels, "bf16_mm.")
    tensors.update(fp32)
    tensors.update(autocast)
    tensors.update(bf16_mm)
    print(f"{name}: loss fp32 {loss_fp32:.6f}, bf16 matmuls {loss_bf16:.6f}, "
          f"autocast {loss_autocast:.6f}")
    save_reference(tensors, os.path.join(folder, "reference.safetensors"),
                   metadata(overrides, config, BATCH, SEQ))


def main():
    out_dir = sys.argv[1]
    for name, overrides in CASES.items():
        make(name, overrides, out_dir)


if __name__ == "__main__":
    main()
