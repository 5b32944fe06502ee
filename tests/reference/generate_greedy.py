"""Greedy generation with the real Transformers, for titan's generate test.

usage: python generate_greedy.py REQUEST RESPONSE
    REQUEST: {"folders": [...], "prompts": [[ids...], ...], "max_new_tokens": N}. For each model
    folder (written by titan), every prompt is run through
    AutoModelForCausalLM.generate(do_sample=False) in float32 with a static cache (a bf16 folder
    too: its weights upcast, fp32 compute, which is titan's bf16-weight math), and the new
    ids (an ending eos included, nothing after it) go to RESPONSE as
    {"<folder>": [[ids...], ...]}.
"""
import json
import sys

import torch
from transformers import AutoModelForCausalLM


def main():
    request_path, response_path = sys.argv[1], sys.argv[2]
    with open(request_path) as f:
        request = json.load(f)
    torch.manual_seed(0)
    response = {}
    for folder in request["folders"]:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        model.eval()
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
        response[folder] = outputs
    with open(response_path, "w") as f:
        json.dump(response, f)


if __name__ == "__main__":
    main()
