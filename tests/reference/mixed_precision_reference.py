"""Reference data for bf16 mixed-precision training, from Hugging Face Transformers' Qwen3 and
Qwen3-MoE models (eager attention and experts, float32 master weights) on tiny random configs,
computed three ways on the same weights and batch:

  fp32       the plain float32 step;
  bf16_mm    titan's mixed precision as PyTorch ops: every matmul weight (q/k/v/o, gate/up/down,
             each expert's gate_up/down, the lm_head, tied or not; not the MoE router) and the
             matmul's input are rounded to bf16, the product accumulates in fp32 and stays fp32,
             except q/k/v_proj's, the MLPs' and experts' gate and up projections' and the
             lm_head's (the logits), rounded to bf16 as titan keeps them; q and k after their
             norms and RoPE are rounded before attention (each of these roundings passes the
             gradient through unchanged); in the backward the output's gradient is rounded to
             bf16 before the two products (d input, d weight), which accumulate in fp32;
             attention multiplies bf16 operands (titan's blockwise kernels with bf16 GEMMs): in
             its forward q k^T on those q and k, and P V with the probabilities rounded, as
             exp(score - row max) before the division by the row sum (PyTorch's CPU flash
             attention, whose fp32 row sum is of the unrounded values); in its backward the output's
             gradient, the probabilities and the score gradients rounded, each computed in fp32
             first, and its row term reads the output rounded (as o_proj reads it); norms, RoPE, softmax, SwiGLU, the router, the routing weights' product and
             sum, and the loss stay fp32. Products of bf16 values are exact
             in fp32, so this equals titan's bf16 step up to fp32 summation order;
  autocast   torch.autocast("cpu", dtype=torch.bfloat16), the way PyTorch users train in bf16
             (it also rounds every linear's output, attention's matmuls and the q/k norms' outputs
             to bf16).

bf16_mm_spread.<name> (F32 (1)) is how far bf16_mm's tensor moves under summation-order noise
(see JITTER_ULPS), relative to its largest magnitude.

For each case it writes OUT_DIR/<case>/model/ (save_pretrained, fp32) and
OUT_DIR/<case>/reference.safetensors with input_ids, targets (I32; HF's labels shifted left),
and for each way W in (fp32, bf16_mm, autocast): W.loss (F32 (1); with output_router_logits in
the config, HF's loss: cross-entropy + router_aux_loss_coef * the load-balancing loss),
W.logits (F32 (B, S, V)) and W.grad.<name> for every parameter (titan's names: the fused
experts.gate_up_proj as experts.gate_proj and experts.up_proj).

The MoE cases route every token to the same experts in all three ways, and no token is near a tie
between its k-th and (k+1)-th expert (which a summation-order difference could flip): the script
checks both, so the comparisons measure rounding, not routing.

usage: python mixed_precision_reference.py OUT_DIR
"""
import os
import sys

import torch
import torch.nn.functional as F
from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM
from transformers.models.qwen3 import modeling_qwen3
from transformers.models.qwen3.modeling_qwen3 import repeat_kv
from transformers.models.qwen3_moe import modeling_qwen3_moe
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts, Qwen3MoeTopKRouter

from reference_common import (hf_targets, make_batch, metadata, named, perturb_norms, routing_gap,
                              save_reference, titan_layout)

BATCH, SEQ = 2, 24
# h 64 with 4 heads of 16: wide enough that a bf16 rounding is one of many terms in every sum.
# initializer_range 0.1, not HF's 0.02, so the layers move the residual stream well beyond the
# embedding and the rounding of every matmul shows in the loss.
TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
            initializer_range=0.1, rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2)
# The MoE cases: 8 experts of width 32, 2 per token, in every layer (all_sparse, whose loss
# includes the load-balancing loss) or in layer 1 only (mixed); norm_topk_prob both ways.
TINY_MOE = dict(TINY, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
                decoder_sparse_step=1, tie_word_embeddings=False)
# name: (model class, seed, config). The MoE seeds are ones where autocast and bf16_mm route
# every token as fp32 does (checked below; autocast rounds the router's logits to bf16, which at
# most seeds moves 1 to 4 of the 96 (token, layer) choices).
CASES = {
    "qwen3_tied": (Qwen3ForCausalLM, 1357, dict(TINY, tie_word_embeddings=True)),
    "qwen3_untied": (Qwen3ForCausalLM, 1357, dict(TINY, tie_word_embeddings=False)),
    "qwen3_moe_all_sparse": (Qwen3MoeForCausalLM, 3,
                             dict(TINY_MOE, mlp_only_layers=[], norm_topk_prob=True,
                                  output_router_logits=True, router_aux_loss_coef=0.02)),
    "qwen3_moe_mixed": (Qwen3MoeForCausalLM, 4,
                        dict(TINY_MOE, mlp_only_layers=[0], norm_topk_prob=False)),
}
# Smallest allowed gap between a token's k-th and (k+1)-th router probability: titan and bf16_mm
# differ by fp32 summation order (~1e-6 in a probability), far below it.
MIN_ROUTING_GAP = 1e-4


def bf16(t):
    return t.to(torch.bfloat16).to(torch.float32)


# Summation-order noise: titan sums each product in another order than PyTorch, so a value about
# to be rounded to bf16 may differ by a few fp32 ulps, and where it sits by a rounding boundary
# the two round it apart; through attention such a flip moves later roundings and the gradients
# (by ~1e-3 of a tensor's scale, more than fp32 summation order itself). To measure how far that
# noise alone moves this step, bf16_mm is rerun with every rounded value first scaled by
# 1 + JITTER_ULPS * 2^-23 * u, u uniform in [-1, 1]; SPREAD_RUNS such runs give each tensor's
# spread, which bounds titan's distance from bf16_mm (tests/unit/test_mixed_precision.cpp).
# The spread is heavy-tailed (a rare flip moves a tensor far more than the usual few): with the
# attention's probabilities rounded too, three runs measured 1.3e-4 for a norm weight's gradient
# whose spread over twelve was 1.9e-3, and titan, one more draw, fell between. Eight runs.
JITTER_ULPS = 4
SPREAD_RUNS = 8
jitter = {"on": False}


def rounded(t):
    if jitter["on"]:
        t = t * (1 + JITTER_ULPS * 2.0 ** -23 * (2 * torch.rand_like(t) - 1))
    return bf16(t)


class Bf16Matmul(torch.autograd.Function):
    """y = round(x) round(W)^T + b in fp32 (round_output: y rounded to bf16 too, the rounding
    passing the gradient through unchanged); backward rounds dy once for both products."""

    @staticmethod
    def forward(ctx, x, weight, bias, round_output=False):
        xr, wr = rounded(x), bf16(weight)
        ctx.save_for_backward(xr, wr)
        ctx.has_bias = bias is not None
        y = xr @ wr.t()
        y = y + bias if bias is not None else y
        return rounded(y) if round_output else y

    @staticmethod
    def backward(ctx, dy):
        xr, wr = ctx.saved_tensors
        dyr = rounded(dy)
        dx = dyr @ wr
        dw = dyr.reshape(-1, dyr.shape[-1]).t() @ xr.reshape(-1, xr.shape[-1])
        db = dy.reshape(-1, dy.shape[-1]).sum(0) if ctx.has_bias else None
        return dx, dw, db, None


class RoundedStraightThrough(torch.autograd.Function):
    """x rounded to bf16; the gradient passes unchanged, as through titan's rounding points."""

    @staticmethod
    def forward(ctx, x):
        return rounded(x)

    @staticmethod
    def backward(ctx, dx):
        return dx


class Bf16GemmAttention(torch.autograd.Function):
    """softmax(q k^T scaling + mask) v for q, k, v holding bf16 values (k and v repeated per query
    head), with the unnormalised probabilities exp(s - max) rounded to bf16 for the product with v
    and the row sums taken before that rounding: titan's forward under bf16 (which rounds against
    each key block's running max; at these lengths one block holds every key). Its backward is
    titan's FlashAttention-2 backward under bf16: dout, the
    probabilities P (for dv) and the score gradients dS = P (dP - delta) scaling (for dq, dk) are
    rounded to bf16 before the products they feed, each computed in fp32 first; delta, each row's
    dout . out, from the unrounded dout and the output rounded to bf16, as training keeps it (the
    rounding o_proj reads)."""

    @staticmethod
    def forward(ctx, q, k, v, mask, scaling):
        scores = q @ k.transpose(2, 3) * scaling
        if mask is not None:
            scores = scores + mask
        row_max = scores.amax(dim=-1, keepdim=True)
        e = torch.exp(scores - row_max)
        row_sum = e.sum(dim=-1, keepdim=True)
        p = e / row_sum
        out = (rounded(e) @ v) / row_sum
        ctx.save_for_backward(q, k, v, p, out)
        ctx.scaling = scaling
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, p, out = ctx.saved_tensors
        dout_r = rounded(dout)
        delta = (dout * rounded(out)).sum(-1, keepdim=True)
        dv = rounded(p).transpose(2, 3) @ dout_r
        ds = p * (dout_r @ v.transpose(2, 3) - delta) * ctx.scaling
        ds_r = rounded(ds)
        return ds_r @ k, ds_r.transpose(2, 3) @ q, dv, None, None


# While on, eager attention (both models' modules look it up by name at each call) reads q and k
# rounded to bf16, after their norms and RoPE (v comes rounded from v_proj), and its backward
# multiplies in bf16 (Bf16GemmAttention).
bf16_attention = {"on": False}


def rounding_attention(original):
    def forward(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        if not bf16_attention["on"]:
            return original(module, query, key, value, attention_mask, scaling, dropout, **kwargs)
        assert dropout == 0.0, "the reference models attention without dropout"
        query = RoundedStraightThrough.apply(query)
        key = RoundedStraightThrough.apply(key)
        groups = module.num_key_value_groups
        out = Bf16GemmAttention.apply(query, repeat_kv(key, groups), repeat_kv(value, groups),
                                      attention_mask, scaling)
        return out.transpose(1, 2).contiguous(), None
    return forward


for _modeling in (modeling_qwen3, modeling_qwen3_moe):
    _modeling.eager_attention_forward = rounding_attention(_modeling.eager_attention_forward)


def bf16_forward(module, round_output=False):
    def forward(x):
        return Bf16Matmul.apply(x, module.weight, module.bias, round_output)
    return forward


def bf16_experts_forward(experts):
    """Transformers' eager Qwen3MoeExperts.forward with each expert's two linears as Bf16Matmul:
    the gathered rows and silu(gate) * up rounded, gate and up rounded as they come out of
    gate_up_proj, the routing weights' product and the index_add_ sum in fp32."""
    def forward(hidden_states, top_k_index, top_k_weights):
        final_hidden_states = torch.zeros_like(hidden_states)
        expert_mask = F.one_hot(top_k_index, num_classes=experts.num_experts).permute(2, 1, 0)
        for expert_idx in range(experts.num_experts):
            top_k_pos, token_idx = torch.where(expert_mask[expert_idx])
            if token_idx.numel() == 0:
                continue
            current_state = hidden_states[token_idx]
            gate, up = Bf16Matmul.apply(current_state, experts.gate_up_proj[expert_idx], None,
                                        True).chunk(2, dim=-1)
            current = Bf16Matmul.apply(F.silu(gate) * up, experts.down_proj[expert_idx], None)
            current = current * top_k_weights[token_idx, top_k_pos, None]
            final_hidden_states.index_add_(0, token_idx, current)
        return final_hidden_states
    return forward


def use_bf16_matmuls(model):
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Linear):  # the MoE router is a Qwen3MoeTopKRouter: not rounded
            # The experts are not Linears: gate_proj and up_proj are the dense MLPs'.
            keeps_output = m is model.lm_head or name.endswith(
                ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"))
            m.forward = bf16_forward(m, round_output=keeps_output)
        elif isinstance(m, Qwen3MoeExperts):
            m.forward = bf16_experts_forward(m)


def record_routing(model):
    """A list that each MoE router call appends (logits, chosen experts) to."""
    calls = []
    for m in model.modules():
        if isinstance(m, Qwen3MoeTopKRouter):
            m.register_forward_hook(
                lambda module, args, out: calls.append((out[0].detach(), out[2].detach())))
    return calls


def step(model, ids, labels, prefix, autocast=False):
    model.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = model(input_ids=ids, labels=labels)
    out.loss.backward()
    tensors = named(prefix + "grad.",
                    titan_layout((k, v.grad.float()) for k, v in model.named_parameters()).items())
    tensors[prefix + "loss"] = out.loss.detach().float().reshape(1)
    tensors[prefix + "logits"] = out.logits.detach().float()
    return tensors, out.loss.item()


def make(name, model_class, seed, overrides, out_dir):
    torch.manual_seed(seed)
    is_moe = model_class is Qwen3MoeForCausalLM
    config = (Qwen3MoeConfig if is_moe else Qwen3Config)(**overrides)
    config.architectures = [model_class.__name__]
    extra = dict(experts_implementation="eager") if is_moe else {}
    model = model_class._from_config(config, attn_implementation="eager", dtype=torch.float32,
                                     **extra)
    perturb_norms(model)
    ids, labels = make_batch(config.vocab_size, BATCH, SEQ)
    folder = os.path.join(out_dir, name)
    model.save_pretrained(os.path.join(folder, "model"))

    tensors = {"input_ids": ids.to(torch.int32), "targets": hf_targets(labels).to(torch.int32)}
    routing = record_routing(model)
    fp32, loss_fp32 = step(model, ids, labels, "fp32.")
    autocast, loss_autocast = step(model, ids, labels, "autocast.", autocast=True)
    use_bf16_matmuls(model)
    bf16_attention["on"] = True
    bf16_mm, loss_bf16 = step(model, ids, labels, "bf16_mm.")
    jitter["on"] = True
    spread = {}
    for _ in range(SPREAD_RUNS):
        jittered, _ = step(model, ids, labels, "bf16_mm.")
        for key, value in jittered.items():
            ref = bf16_mm[key]
            rel = ((value - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).reshape(1)
            spread_name = "bf16_mm_spread." + key[len("bf16_mm."):]
            spread[spread_name] = torch.maximum(spread.get(spread_name, rel), rel)
    jitter["on"] = False
    bf16_attention["on"] = False
    tensors.update(spread)
    tensors.update(fp32)
    tensors.update(autocast)
    tensors.update(bf16_mm)
    print(f"{name}: loss fp32 {loss_fp32:.6f}, bf16 matmuls {loss_bf16:.6f}, "
          f"autocast {loss_autocast:.6f}")
    if is_moe:
        # One call per sparse layer in each step: fp32, autocast, bf16_mm, then the jittered
        # bf16_mm runs, whose spread means something only if they route as the others do.
        steps = ["fp32", "autocast", "bf16 matmuls"] + ["jittered bf16 matmuls"] * SPREAD_RUNS
        layers = len(routing) // len(steps)
        assert layers * len(steps) == len(routing), f"{name}: {len(routing)} router calls"
        fp32_calls = routing[:layers]
        for i, way in enumerate(steps[1:], start=1):
            for (_, chosen), (_, other) in zip(fp32_calls, routing[i * layers:(i + 1) * layers]):
                assert torch.equal(chosen, other), f"{name}: {way} routes differently"
        bf16_calls = routing[2 * layers:3 * layers]
        gap = routing_gap([logits for logits, _ in bf16_calls], config.num_experts_per_tok)
        print(f"{name}: {layers} sparse layers, smallest routing gap {gap:.3e}")
        assert gap > MIN_ROUTING_GAP, f"{name}: a token is near a routing tie ({gap})"
    save_reference(tensors, os.path.join(folder, "reference.safetensors"),
                   metadata(overrides, config, BATCH, SEQ))


def main():
    out_dir = sys.argv[1]
    for name, (model_class, seed, overrides) in CASES.items():
        make(name, model_class, seed, overrides, out_dir)


if __name__ == "__main__":
    main()
