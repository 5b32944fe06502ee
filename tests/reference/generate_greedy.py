"""Greedy generation with the real Transformers, for titan's generate test.

usage: python generate_greedy.py REQUEST RESPONSE
    REQUEST: {"runs": [{"key": K, "folder": F, "bf16_math": bool,
                        "bf16_kv_cache": bool}, ...],
              "prompts": [[ids...], ...], "max_new_tokens": N}.
    Each run loads its model folder (written by titan) in float32 and runs every prompt through
    AutoModelForCausalLM.generate(do_sample=False) with a static cache; the new ids (an ending eos
    included, nothing after it) go to RESPONSE as {"<key>": [[ids...], ...]}.

    A bf16 folder's weights are bf16 values upcast. bf16_math computes titan's bf16-weight
    math on them: the input of every matmul titan runs with bf16 operands (q/k/v/o, a dense MLP's
    gate/up/down, both GEMMs of each MoE expert, lm_head; not the MoE router) rounded to bf16,
    fp32 accumulation (a product of two bf16 values is exact in fp32); q/k/v_proj's outputs, the
    MLPs' and experts' gate and up, q and k after RoPE, and the logits rounded to bf16.
    bf16_kv_cache stores the keys (after k_norm and RoPE) and values rounded to bf16, as titan's
    bf16 KV cache and torch's bf16 static cache hold them, and attends over the rounded values.
    Both together are a bf16 model over a bf16 cache, whose attention titan computes in bf16: the
    probabilities exp(score - m) are rounded to bf16 before they weight the values, m the running
    max of titan's 128-key blocks up to the key's own (rounded_p_attention).
"""
import json
import re
import sys

import torch
from transformers import AutoModelForCausalLM
from transformers.cache_utils import StaticLayer

BF16_LINEAR = re.compile(r"(\.self_attn\.[qkvo]_proj|\.mlp\.(gate|up|down)_proj|^lm_head)$")
ROUNDED_OUTPUT = re.compile(r"(\.self_attn\.[qkv]_proj|\.mlp\.(gate|up)_proj|^lm_head)$")


def to_bf16_values(t):
    return t.to(torch.bfloat16).to(t.dtype)


rounded_expert_products = 0


def rounding_linear(x, weight, bias=None):
    global rounded_expert_products
    rounded_expert_products += 1
    return _linear(to_bf16_values(x), weight, bias)


_linear = torch.nn.functional.linear


def with_rounded_linear(forward, experts):
    """forward, with every torch.nn.functional.linear inside it taking its input rounded (the
    MoE experts module multiplies its stacked weights through it), and gate_up_proj's products
    returned rounded, as titan's experts compute silu(gate) * up from gate and up in bf16."""
    gate_up = experts.gate_up_proj.untyped_storage().data_ptr()

    def linear(x, weight, bias=None):
        out = rounding_linear(x, weight, bias)
        return to_bf16_values(out) if weight.untyped_storage().data_ptr() == gate_up else out

    def wrapped(*args, **kwargs):
        torch.nn.functional.linear = linear
        try:
            return forward(*args, **kwargs)
        finally:
            torch.nn.functional.linear = _linear

    return wrapped


# While on, the models' apply_rotary_pos_emb (looked up by name at each call) returns q and k
# rounded to bf16.
rounding_rope = {"on": False}


def with_rounded_outputs(apply_rotary_pos_emb):
    def wrapped(*args, **kwargs):
        q, k = apply_rotary_pos_emb(*args, **kwargs)
        if rounding_rope["on"]:
            q, k = to_bf16_values(q), to_bf16_values(k)
        return q, k
    wrapped.rounds = True
    return wrapped


def use_bf16_math(model):
    """Returns whether the model has MoE experts (whose products must then be seen rounded)."""
    modeling = sys.modules[type(model).__module__]
    if not getattr(modeling.apply_rotary_pos_emb, "rounds", False):
        modeling.apply_rotary_pos_emb = with_rounded_outputs(modeling.apply_rotary_pos_emb)
    rounded, experts = 0, False
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and BF16_LINEAR.search(name):
            module.register_forward_pre_hook(lambda m, args: (to_bf16_values(args[0]), *args[1:]))
            if ROUNDED_OUTPUT.search(name):
                module.register_forward_hook(lambda m, args, out: to_bf16_values(out))
            rounded += 1
        elif name.endswith(".mlp.experts"):
            module.forward = with_rounded_linear(module.forward, module)
            experts = True
    assert rounded > 0, "no linear matched"
    return experts


KEY_BLOCK = 128  # titan's attention key blocks (ops/attention.cpp, kBlockK)


def rounded_p_attention(module, query, key, value, attention_mask, scaling, dropout=0.0,
                        **kwargs):
    """Eager attention with titan's bf16 probabilities: out = sum_j round(exp(s_j - m_j))
    exp(m_j - M) v_j / sum_j exp(s_j - M), m_j the running max of the key blocks up to key j's."""
    modeling = sys.modules[type(module).__module__]
    key = modeling.repeat_kv(key, module.num_key_value_groups)
    value = modeling.repeat_kv(value, module.num_key_value_groups)
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        scores = scores + attention_mask[:, :, :, : key.shape[-2]]
    n_keys = scores.shape[-1]
    pad = (-n_keys) % KEY_BLOCK
    padded = torch.nn.functional.pad(scores, (0, pad), value=float("-inf"))
    block_max = padded.unflatten(-1, (-1, KEY_BLOCK)).amax(dim=-1)
    running = torch.cummax(block_max, dim=-1).values
    m_key = running.repeat_interleave(KEY_BLOCK, dim=-1)[..., :n_keys]
    m_last = running[..., -1:]
    e = torch.exp(scores - m_key)
    to_last = torch.exp(m_key - m_last)
    total = (e * to_last).sum(dim=-1, keepdim=True)
    out = torch.matmul(to_bf16_values(e) * to_last, value) / total
    return out.transpose(1, 2).contiguous(), None


_static_update = StaticLayer.update


def rounding_update(self, key_states, value_states, *args, **kwargs):
    return _static_update(self, to_bf16_values(key_states), to_bf16_values(value_states), *args,
                          **kwargs)


def main():
    request_path, response_path = sys.argv[1], sys.argv[2]
    with open(request_path) as f:
        request = json.load(f)
    torch.manual_seed(0)
    response = {}
    for run in request["runs"]:
        # The eager experts multiply through torch.nn.functional.linear, which the rounding wraps.
        rounding = {"experts_implementation": "eager"} if run.get("bf16_math") else {}
        bf16_attention = run.get("bf16_math", False) and run.get("bf16_kv_cache", False)
        if bf16_attention:
            rounding["attn_implementation"] = "eager"
        model = AutoModelForCausalLM.from_pretrained(run["folder"], dtype=torch.float32, **rounding)
        model.eval()
        modeling = sys.modules[type(model).__module__]
        if not hasattr(modeling, "_eager_attention_forward"):
            modeling._eager_attention_forward = modeling.eager_attention_forward
        modeling.eager_attention_forward = (
            rounded_p_attention if bf16_attention else modeling._eager_attention_forward)
        rounding_rope["on"] = run.get("bf16_math", False)
        experts = rounding_rope["on"] and use_bf16_math(model)
        products_before = rounded_expert_products
        StaticLayer.update = rounding_update if run.get("bf16_kv_cache", False) else _static_update
        eos = model.generation_config.eos_token_id
        outputs = []
        for prompt in request["prompts"]:
            input_ids = torch.tensor([prompt], dtype=torch.long)
            with torch.no_grad():
                out = model.generate(
                    input_ids,
                    attention_mask=torch.ones_like(input_ids),
                    do_sample=False,
                    max_new_tokens=request["max_new_tokens"],
                    cache_implementation="static",
                    eos_token_id=eos,
                    pad_token_id=eos[0] if isinstance(eos, list) else eos,
                )
            outputs.append(out[0, len(prompt):].tolist())
        # The experts must have multiplied through the rounding linear (not another
        # implementation of Transformers' experts interface).
        assert not experts or rounded_expert_products > products_before, run["key"]
        response[run["key"]] = outputs
    with open(response_path, "w") as f:
        json.dump(response, f)


if __name__ == "__main__":
    main()
