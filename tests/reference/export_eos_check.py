"""The exported model folder carries what generation needs: Transformers' generate stops on EOS.

usage: python export_eos_check.py DIR
    DIR is a folder titan exported. Its config.json and generation_config.json must name the
    tokenizer's EOS (and its pad, where the tokenizer has one). For each prompt, greedy generation
    with EOS switched off shows where the model first emits EOS; generation with the folder's own
    generation config must then end exactly there. At least one prompt must reach EOS, or the check
    would assert nothing.
"""
import json
import os
import sys

from transformers import AutoModelForCausalLM, AutoTokenizer


def main(folder):
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    with open(os.path.join(folder, "config.json")) as f:
        config = json.load(f)
    with open(os.path.join(folder, "generation_config.json")) as f:
        generation = json.load(f)
    eos = tok.eos_token_id
    assert eos is not None, "the tokenizer has no EOS"
    for name, c in (("config.json", config), ("generation_config.json", generation)):
        assert c.get("eos_token_id") == eos, f"{name}: eos_token_id {c.get('eos_token_id')}, the tokenizer's is {eos}"
        if tok.pad_token_id is not None:
            assert c.get("pad_token_id") == tok.pad_token_id, f"{name}: pad_token_id {c.get('pad_token_id')}"
    reached = 0
    for prompt in ["The", "\n\n", "foo", "A hacker", "In the"]:
        ids = tok(prompt, return_tensors="pt").input_ids
        n = ids.shape[1]
        free = model.generate(ids, max_new_tokens=200, do_sample=False, eos_token_id=None,
                              pad_token_id=eos)[0, n:].tolist()
        if eos not in free:
            continue
        reached += 1
        stop = free.index(eos)
        out = model.generate(ids, max_new_tokens=200, do_sample=False)[0, n:].tolist()
        assert out == free[: stop + 1], f"{prompt!r}: generate gave {len(out)} tokens, EOS is token {stop + 1}"
        print(f"{prompt!r}: stops on EOS after {stop + 1} tokens")
    assert reached > 0, "no prompt reached EOS in 200 tokens: train longer for this check"


if __name__ == "__main__":
    main(sys.argv[1])
