"""Reference side of tests/unit/test_hf_config_python.cpp, using the real transformers library.

  load DIR   for each DIR/<name>/config.json written by titan.cpp: load it with AutoConfig (and the
             generation_config.json with GenerationConfig), build the model from it, and write
             DIR/<name>/seen.json with the fields as Transformers understood them
  save DIR   write configs with Qwen3Config / Qwen3MoeConfig(...).save_pretrained into
             DIR/<name>/ and the fields they hold into DIR/<name>/expected.json

Fields use ModelArgs' names; absent ids are -1, rope values come from config.rope_parameters.
"""
import json
import os
import sys

import torch
from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig, Qwen3Config, Qwen3MoeConfig


def ids(value):
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def fields(config):
    rope = dict(config.rope_parameters)
    moe = config.model_type == "qwen3_moe"
    f = {
        "architecture": (config.architectures or [None])[0],
        "model_type": config.model_type,
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": getattr(config, "head_dim", config.hidden_size // config.num_attention_heads),
        "max_position_embeddings": config.max_position_embeddings,
        "rope_theta": float(rope["rope_theta"]),
        "rope_type": rope["rope_type"],
        "rope_factor": float(rope.get("factor", 1.0)),
        "rope_original_max_position_embeddings": rope.get("original_max_position_embeddings", 0)
        if rope["rope_type"] == "yarn" else 0,
        "rms_norm_eps": config.rms_norm_eps,
        "initializer_range": config.initializer_range,
        "tie_word_embeddings": config.tie_word_embeddings,
        "attention_bias": config.attention_bias,
        "bos_token_id": -1 if config.bos_token_id is None else config.bos_token_id,
        "eos_token_ids": ids(config.eos_token_id),
        "pad_token_id": -1 if config.pad_token_id is None else config.pad_token_id,
        "dtype": str(config.dtype).replace("torch.", "") if config.dtype is not None else None,
    }
    if moe:
        f.update({
            "num_experts": config.num_experts,
            "num_experts_per_tok": config.num_experts_per_tok,
            "moe_intermediate_size": config.moe_intermediate_size,
            "norm_topk_prob": config.norm_topk_prob,
            "router_aux_loss_coef": config.router_aux_loss_coef,
            "output_router_logits": config.output_router_logits,
            "decoder_sparse_step": config.decoder_sparse_step,
            "mlp_only_layers": list(config.mlp_only_layers),
        })
    return f


def load(d):
    for name in sorted(os.listdir(d)):
        folder = os.path.join(d, name)
        if not os.path.isfile(os.path.join(folder, "config.json")):
            continue
        config = AutoConfig.from_pretrained(folder)
        seen = fields(config)
        # Build the model on the meta device: shapes and counts without allocating weights.
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        seen["class"] = type(model).__name__
        seen["n_params"] = sum(p.numel() for p in model.parameters())
        seen["q_proj"] = list(model.model.layers[0].self_attn.q_proj.weight.shape)
        seen["lm_head_tied"] = model.lm_head.weight is model.model.embed_tokens.weight
        if os.path.isfile(os.path.join(folder, "generation_config.json")):
            g = GenerationConfig.from_pretrained(folder)
            seen["generation"] = {"eos_token_ids": ids(g.eos_token_id), "do_sample": g.do_sample,
                                  "pad_token_id": -1 if g.pad_token_id is None else g.pad_token_id}
        with open(os.path.join(folder, "seen.json"), "w") as f:
            json.dump(seen, f, indent=1)
    print("ok")


def save(d):
    configs = {
        "py_dense": Qwen3Config(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                                num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                max_position_embeddings=4096, tie_word_embeddings=True, bos_token_id=1,
                                eos_token_id=[2, 3], rope_parameters={"rope_type": "default", "rope_theta": 5e6},
                                rms_norm_eps=1e-5),
        "py_yarn": Qwen3Config(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=4,
                               rope_parameters={"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0,
                                                "original_max_position_embeddings": 1024}),
        "py_moe": Qwen3MoeConfig(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                                 num_attention_heads=4, num_key_value_heads=2, num_experts=8,
                                 num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True,
                                 mlp_only_layers=[1], decoder_sparse_step=1, eos_token_id=5),
    }
    for name, config in configs.items():
        config.architectures = ["Qwen3MoeForCausalLM" if config.model_type == "qwen3_moe" else "Qwen3ForCausalLM"]
        folder = os.path.join(d, name)
        config.save_pretrained(folder)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        expected = fields(AutoConfig.from_pretrained(folder))
        expected["n_params"] = sum(p.numel() for p in model.parameters())
        with open(os.path.join(folder, "expected.json"), "w") as f:
            json.dump(expected, f, indent=1)
    print("ok")


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("load", "save"):
        sys.exit(__doc__)
    {"load": load, "save": save}[sys.argv[1]](sys.argv[2])
