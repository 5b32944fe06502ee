"""Reference side of tests/unit/test_hf_config_python.cpp, using the real transformers library.

  load DIR   for each DIR/<name>/config.json written by titan.cpp: load it with AutoConfig (and the
             generation_config.json with GenerationConfig), build the model from it, and write
             DIR/<name>/seen.json with the fields as Transformers understood them
  save DIR   write configs with Qwen3Config / Qwen3MoeConfig / Qwen2Config /
             LlamaConfig(...).save_pretrained into DIR/<name>/ and the fields they hold into
             DIR/<name>/expected.json

Fields use ModelArgs' names; absent ids are -1, rope values come from config.rope_parameters.
The feature flags (qk_norm, attention_bias for q/k/v, o_proj_bias, mlp_bias) are read off the
model Transformers builds from the config, not the config: they are what it computes.
"""
import json
import os
import sys

import torch
from transformers import (AutoConfig, AutoModelForCausalLM, GenerationConfig, LlamaConfig, Qwen2Config,
                          Qwen3Config, Qwen3MoeConfig)

# architectures[0] for each model_type, as the published configs have it.
ARCHITECTURES = {"qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM",
                 "qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM"}


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
        if rope["rope_type"] in ("yarn", "llama3") else 0,
        "rope_low_freq_factor": float(rope["low_freq_factor"]) if rope["rope_type"] == "llama3" else 0.0,
        "rope_high_freq_factor": float(rope["high_freq_factor"]) if rope["rope_type"] == "llama3" else 0.0,
        "rms_norm_eps": config.rms_norm_eps,
        "initializer_range": config.initializer_range,
        "tie_word_embeddings": config.tie_word_embeddings,
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


def built(config):
    """What Transformers builds from the config (on the meta device: shapes, no weights)."""
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    layer = model.model.layers[0]
    attention, mlp = layer.self_attn, layer.mlp
    gate = getattr(mlp, "gate_proj", None)  # a sparse layer's experts have no bias
    return {
        "class": type(model).__name__,
        "n_params": sum(p.numel() for p in model.parameters()),
        "q_proj": list(attention.q_proj.weight.shape),
        "lm_head_tied": model.lm_head.weight is model.model.embed_tokens.weight,
        "qk_norm": hasattr(attention, "q_norm"),
        "attention_bias": all(getattr(attention, n).bias is not None for n in ("q_proj", "k_proj", "v_proj")),
        "o_proj_bias": attention.o_proj.bias is not None,
        "mlp_bias": gate is not None and gate.bias is not None,
    }


def load(d):
    for name in sorted(os.listdir(d)):
        folder = os.path.join(d, name)
        if not os.path.isfile(os.path.join(folder, "config.json")):
            continue
        config = AutoConfig.from_pretrained(folder)
        seen = {**fields(config), **built(config)}
        if os.path.isfile(os.path.join(folder, "generation_config.json")):
            g = GenerationConfig.from_pretrained(folder)
            seen["generation"] = {"eos_token_ids": ids(g.eos_token_id), "do_sample": g.do_sample,
                                  "pad_token_id": -1 if g.pad_token_id is None else g.pad_token_id}
        with open(os.path.join(folder, "seen.json"), "w") as f:
            json.dump(seen, f, indent=1)
    print("ok")


def save(d):
    small = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_attention_heads=4)
    configs = {
        "py_dense": Qwen3Config(**small, num_hidden_layers=3, num_key_value_heads=2, head_dim=32,
                                max_position_embeddings=4096, tie_word_embeddings=True, bos_token_id=1,
                                eos_token_id=[2, 3], rope_parameters={"rope_type": "default", "rope_theta": 5e6},
                                rms_norm_eps=1e-5),
        "py_yarn": Qwen3Config(**small, num_hidden_layers=2, num_key_value_heads=4,
                               rope_parameters={"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0,
                                                "original_max_position_embeddings": 1024}),
        "py_moe": Qwen3MoeConfig(**small, num_hidden_layers=4, num_key_value_heads=2, num_experts=8,
                                 num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True,
                                 mlp_only_layers=[1], decoder_sparse_step=1, eos_token_id=5),
        # Llama 3.2's shape: tied, llama3 RoPE, several eos ids.
        "py_llama_tied": LlamaConfig(**small, num_hidden_layers=2, num_key_value_heads=2, tie_word_embeddings=True,
                                     max_position_embeddings=2048, bos_token_id=7, eos_token_id=[8, 9],
                                     rms_norm_eps=1e-5,
                                     rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                                      "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                      "original_max_position_embeddings": 256}),
        # Every Llama bias, an explicit head_dim, LlamaConfig's default ids (1, 2).
        "py_llama_bias": LlamaConfig(**small, num_hidden_layers=2, num_key_value_heads=1, head_dim=24,
                                     attention_bias=True, mlp_bias=True, pad_token_id=0,
                                     rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
        # Qwen2.5-0.5B's shape (tied) and 7B's (untied), the latter with the model cards' yarn.
        "py_qwen2_tied": Qwen2Config(**small, num_hidden_layers=2, num_key_value_heads=2, tie_word_embeddings=True,
                                     bos_token_id=4, eos_token_id=4, max_window_layers=1,
                                     rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
        "py_qwen2_untied": Qwen2Config(**small, num_hidden_layers=3, num_key_value_heads=4,
                                       rope_parameters={"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0,
                                                        "original_max_position_embeddings": 8192}),
    }
    for name, config in configs.items():
        config.architectures = [ARCHITECTURES[config.model_type]]
        folder = os.path.join(d, name)
        config.save_pretrained(folder)
        loaded = AutoConfig.from_pretrained(folder)
        expected = {**fields(loaded), **built(loaded)}
        for key in ("class", "q_proj", "lm_head_tied"):
            del expected[key]
        with open(os.path.join(folder, "expected.json"), "w") as f:
            json.dump(expected, f, indent=1)
    print("ok")


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("load", "save"):
        sys.exit(__doc__)
    {"load": load, "save": save}[sys.argv[1]](sys.argv[2])
