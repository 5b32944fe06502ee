"""Hugging Face model folders between titan.cpp and the real Transformers library.

usage: python hf_folder_roundtrip.py load DIR
    DIR/request.json lists folders titan wrote: {"input_ids": [...], "folders": [{"name",
    "architecture", "tied", "compare": "logits" | "state_dict"}]}. Each DIR/<name> must load with
    AutoModelForCausalLM.from_pretrained with no missing, unexpected or mismatched keys (a tied
    lm_head aside, which must then be the embedding itself). "logits": the fp32 logits on
    input_ids go to DIR/out/<name>.safetensors for titan to compare. "state_dict": the same logits,
    and every tensor Transformers holds must equal the file's, bit for bit (Transformers 5 fuses
    the per-expert keys into gate_up_proj / down_proj; both layouts are handled), and the model is
    saved back with save_pretrained as DIR/out/<name>_resaved for titan to load. A folder with a
    tokenizer.json must also give a working AutoTokenizer. For a Qwen3-MoE model no token may be
    near a routing tie (a rounding difference could flip it): the gap is checked.
usage: python hf_folder_roundtrip.py save DIR
    Transformers writes tiny random Qwen3 and Qwen3-MoE folders with save_pretrained (tied and
    untied, fp32 and bf16, some sharded) as DIR/<name>, with DIR/out/<name>.safetensors holding input_ids
    (I32) and the fp32 logits of the saved weights.
"""
import json
import os
import sys

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import (AutoModelForCausalLM, AutoTokenizer, Qwen3Config, Qwen3ForCausalLM,
                          Qwen3MoeConfig, Qwen3MoeForCausalLM)

DENSE = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, vocab_size=97, max_position_embeddings=128,
             rms_norm_eps=1e-6, rope_theta=10000.0, bos_token_id=1, eos_token_id=2)
# Layers 0 and 2 sparse (5 experts, 2 per token), layer 1 dense through mlp_only_layers.
MOE = dict(DENSE, num_hidden_layers=3, num_experts=5, num_experts_per_tok=2,
           moe_intermediate_size=24, norm_topk_prob=True, mlp_only_layers=[1])
# name: (tie_word_embeddings, saved dtype, max_shard_size, moe)
SAVED = {
    "hf_tied_f32": (True, torch.float32, None, False),
    "hf_untied_f32": (False, torch.float32, "20KB", False),
    "hf_tied_bf16": (True, torch.bfloat16, None, False),
    "hf_untied_bf16": (False, torch.bfloat16, None, False),
    "hf_moe_f32": (False, torch.float32, "40KB", True),
    "hf_moe_bf16": (True, torch.bfloat16, None, True),
}
# The router's HF init (std 0.02) leaves the experts' probabilities within ~1e-3 of each other;
# scaled up, routing decisions have clear margins.
ROUTER_SCALE = 25.0
MIN_ROUTING_GAP = 1e-4
INPUT_IDS = [[3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46, 26, 43]]


def fail(message):
    print(f"FAIL: {message}")
    sys.exit(1)


def file_tensors(folder):
    """Every tensor of the folder's safetensors files, by name."""
    tensors = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".safetensors"):
            with safe_open(os.path.join(folder, name), "pt") as f:
                for key in f.keys():
                    tensors[key] = f.get_tensor(key)
    return tensors


def expected_state_dict(files, model_keys):
    """The file's per-expert keys in the layout the model holds them (fused in Transformers 5)."""
    expected = dict(files)
    for key in model_keys:
        for fused, parts in ((".mlp.experts.gate_up_proj", ("gate_proj", "up_proj")),
                             (".mlp.experts.down_proj", ("down_proj",))):
            if not key.endswith(fused):
                continue
            prefix = key[: -len(fused)] + ".mlp.experts."
            per_expert = []
            e = 0
            while f"{prefix}{e}.{parts[0]}.weight" in files:
                names = [f"{prefix}{e}.{p}.weight" for p in parts]
                per_expert.append(torch.cat([files[n] for n in names], dim=0))
                for n in names:
                    expected.pop(n)
                e += 1
            expected[key] = torch.stack(per_expert)
    return expected


def logits_of(name, model, ids):
    """fp32 logits; for an MoE model, after checking that no token is near a routing tie."""
    with torch.no_grad():
        if not hasattr(model.config, "num_experts"):
            return model(input_ids=ids).logits.float().contiguous()
        out = model(input_ids=ids, output_router_logits=True)
    k = model.config.num_experts_per_tok
    for logits in out.router_logits:
        probs = torch.softmax(logits.float(), dim=-1).sort(dim=-1, descending=True).values
        gap = (probs[:, k - 1] - probs[:, k]).min().item()
        if gap <= MIN_ROUTING_GAP:
            fail(f"{name}: a token is near a routing tie (gap {gap}); pick another seed")
    return out.logits.float().contiguous()


def check_loading_info(name, info, tied):
    allowed_missing = {"lm_head.weight"} if tied else set()
    missing = set(info["missing_keys"]) - allowed_missing
    if missing or info["unexpected_keys"] or info["mismatched_keys"] or info["error_msgs"]:
        fail(f"{name}: missing {sorted(missing)}, unexpected {info['unexpected_keys']}, "
             f"mismatched {info['mismatched_keys']}, errors {info['error_msgs']}")


def load(root):
    with open(os.path.join(root, "request.json")) as f:
        request = json.load(f)
    os.makedirs(os.path.join(root, "out"), exist_ok=True)
    ids = torch.tensor(request["input_ids"], dtype=torch.int64)
    for spec in request["folders"]:
        name = spec["name"]
        folder = os.path.join(root, name)
        experts = ({"experts_implementation": "eager"}
                   if spec["architecture"] == "Qwen3MoeForCausalLM" else {})
        model, info = AutoModelForCausalLM.from_pretrained(
            folder, output_loading_info=True, dtype=torch.float32, attn_implementation="eager",
            **experts)
        model.eval()
        check_loading_info(name, info, spec["tied"])
        if type(model).__name__ != spec["architecture"]:
            fail(f"{name}: loaded as {type(model).__name__}, expected {spec['architecture']}")
        embed = model.get_input_embeddings().weight
        if spec["tied"] != (model.lm_head.weight.data_ptr() == embed.data_ptr()):
            fail(f"{name}: lm_head tied is {not spec['tied']}, expected {spec['tied']}")
        logits = logits_of(name, model, ids)
        save_file({"logits": logits}, os.path.join(root, "out", f"{name}.safetensors"))
        if spec["compare"] == "state_dict":
            files = file_tensors(folder)
            state = model.state_dict()
            if spec["tied"]:
                state.pop("lm_head.weight", None)
            expected = expected_state_dict(files, state.keys())
            if set(expected) != set(state):
                fail(f"{name}: model keys {sorted(set(state) - set(expected))} not in the file, "
                     f"file keys {sorted(set(expected) - set(state))} not in the model")
            for key, value in state.items():
                if value.shape != expected[key].shape or not torch.equal(
                        value, expected[key].to(value.dtype)):
                    fail(f"{name}: {key} differs from the file")
            model.save_pretrained(os.path.join(root, "out", f"{name}_resaved"))
        if os.path.exists(os.path.join(folder, "tokenizer.json")):
            tokenizer = AutoTokenizer.from_pretrained(folder)
            if tokenizer("Hello, world!")["input_ids"] != [9707, 11, 1879, 0]:
                fail(f"{name}: the copied tokenizer encodes differently")
        print(f"{name}: loaded by Transformers, {len(model.state_dict())} tensors")


def save(root):
    os.makedirs(os.path.join(root, "out"), exist_ok=True)
    ids = torch.tensor(INPUT_IDS, dtype=torch.int64)
    for name, (tied, dtype, shard, moe) in SAVED.items():
        torch.manual_seed(4321)
        if moe:
            config = Qwen3MoeConfig(tie_word_embeddings=tied, **MOE)
            model = Qwen3MoeForCausalLM._from_config(config, attn_implementation="eager",
                                                     experts_implementation="eager",
                                                     dtype=torch.float32)
        else:
            config = Qwen3Config(tie_word_embeddings=tied, **DENSE)
            model = Qwen3ForCausalLM._from_config(config, attn_implementation="eager",
                                                  dtype=torch.float32)
        with torch.no_grad():  # non-trivial norm weights, so ignoring one would show
            for pname, p in model.named_parameters():
                if pname.endswith("norm.weight"):
                    p.add_(0.1 * torch.randn_like(p))
                if pname.endswith("mlp.gate.weight"):
                    p.mul_(ROUTER_SCALE)
        model = model.to(dtype)
        kwargs = {"max_shard_size": shard} if shard else {}
        model.save_pretrained(os.path.join(root, name), **kwargs)
        # The reference: the saved weights, loaded back in fp32 (not model.float(): to(bf16) also
        # rounded the rotary inv_freq buffer, which a fresh load recomputes in fp32).
        experts = {"experts_implementation": "eager"} if moe else {}
        model = AutoModelForCausalLM.from_pretrained(
            os.path.join(root, name), dtype=torch.float32, attn_implementation="eager",
            **experts).eval()
        logits = logits_of(name, model, ids)
        save_file({"input_ids": ids.to(torch.int32), "logits": logits},
                  os.path.join(root, "out", f"{name}.safetensors"))
        print(f"{name}: saved by Transformers")


def main():
    torch.set_num_threads(1)
    mode, root = sys.argv[1], sys.argv[2]
    {"load": load, "save": save}[mode](root)


if __name__ == "__main__":
    main()
