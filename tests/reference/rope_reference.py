"""Reference side of tests/unit/test_rope_python.cpp: RoPE's cos and sin as Transformers'
LlamaRotaryEmbedding computes them (fp32), for Llama 3.x's llama3 scaling and default RoPE.

For each case it writes DIR/<name>/config.json (LlamaConfig.save_pretrained, which titan reads)
and DIR/<name>/rope.safetensors: positions (I32, P), cos and sin (F32, P x head_dim; HF repeats
the hd/2 angles twice). Positions run to the last one max_position_embeddings allows, where a
one-ulp difference in an inverse frequency turns into a visible angle error.

usage: python rope_reference.py DIR
"""
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding


def llama3(factor, low, high, original):
    return dict(rope_type="llama3", factor=factor, low_freq_factor=low, high_freq_factor=high,
                original_max_position_embeddings=original)


# name: (hidden_size, num_attention_heads, max_position_embeddings, rope_parameters)
CASES = {
    # Llama 3.1 8B and Llama 3.2 1B as published.
    "llama3_8b": (4096, 32, 131072, dict(rope_theta=500000.0, **llama3(8.0, 1.0, 4.0, 8192))),
    "llama3_1b": (2048, 32, 131072, dict(rope_theta=500000.0, **llama3(32.0, 1.0, 4.0, 8192))),
    # Factors whose wavelength bounds (1000 / 1.5, 1000 / 5) are not fp32 numbers.
    "llama3_odd": (256, 8, 8192, dict(rope_theta=10000.0, **llama3(6.0, 1.5, 5.0, 1000))),
    "default": (2048, 32, 8192, dict(rope_type="default", rope_theta=500000.0)),
}


def main(out_dir):
    torch.set_num_threads(1)
    for name, (hidden, heads, max_positions, rope) in CASES.items():
        config = LlamaConfig(hidden_size=hidden, num_attention_heads=heads, num_key_value_heads=heads,
                             intermediate_size=2 * hidden, num_hidden_layers=1, vocab_size=64,
                             max_position_embeddings=max_positions, rope_parameters=rope)
        folder = os.path.join(out_dir, name)
        config.save_pretrained(folder)
        positions = torch.cat([torch.arange(64), torch.linspace(64, max_positions - 1, 200).long()])
        x = torch.zeros(1, dtype=torch.float32)
        cos, sin = LlamaRotaryEmbedding(config=config)(x, positions[None, :])
        save_file({"positions": positions.to(torch.int32), "cos": cos[0].contiguous(),
                   "sin": sin[0].contiguous()}, os.path.join(folder, "rope.safetensors"))
    print(f"wrote {len(CASES)} cases to {out_dir}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
