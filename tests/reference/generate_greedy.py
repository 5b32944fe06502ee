"""Greedy generation with the real Transformers, for titan's generate test.

usage: python generate_greedy.py REQUEST RESPONSE
    REQUEST: {"runs": [{"key": K, "folder": F, "bf16_matmul_inputs": bool,
                        "bf16_kv_cache": bool}, ...],
              "prompts": [[ids...], ...], "max_new_tokens": N}.
    Each run loads its model folder (written by titan) in float32 and runs every prompt through
    AutoModelForCausalLM.generate(do_sample=False) with a static cache; the new ids (an ending eos
    included, nothing after it) go to RESPONSE as {"<key>": [[ids...], ...]}.

    A bf16 folder's weights are bf16 values upcast. bf16_matmul_inputs computes titan's bf16-weight
    math on them: the input of every linear titan runs with bf16 operands (q/k/v/o, a dense MLP's
    gate/up/down, lm_head; not the MoE router or experts) rounded to bf16, fp32 accumulation (a
    product of two bf16 values is exact in fp32). bf16_kv_cache stores the keys (after k_norm and
    RoPE) and values rounded to bf16, as titan's bf16 KV cache and torch's bf16 static cache hold
    them, and attends over the rounded values.
"""
import json
import re
import sys

import torch
from transformers import AutoModelForCausalLM
from transformers.cache_utils import StaticLayer

BF16_LINEAR = re.compile(r"(\.self_attn\.[qkvo]_proj|\.mlp\.(gate|up|down)_proj|^lm_head)$")


def to_bf16_values(t):
    return t.to(torch.bfloat16).to(t.dtype)


def round_matmul_inputs(model):
    rounded = 0
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and BF16_LINEAR.search(name):
            module.register_forward_pre_hook(lambda m, args: (to_bf16_values(args[0]), *args[1:]))
            rounded += 1
    assert rounded > 0, "no linear matched"


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
        model = AutoModelForCausalLM.from_pretrained(run["folder"], dtype=torch.float32)
        model.eval()
        if run.get("bf16_matmul_inputs", False):
            round_matmul_inputs(model)
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
        response[run["key"]] = outputs
    with open(response_path, "w") as f:
        json.dump(response, f)


if __name__ == "__main__":
    main()
