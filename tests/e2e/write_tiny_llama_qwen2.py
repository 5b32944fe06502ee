# Tiny Llama (tied embedding, Llama 3 RoPE) and Qwen2 (untied, q/k/v biases) Hugging Face folders
# from Transformers, WORK/llama and WORK/qwen2, each with the Qwen3 tokenizer's files; weights drawn
# with seed 0 at INIT_RANGE, biases random (HF initialises them to zero; a row-wise bias added
# twice, or not summed, or lost in a round trip must show).
# usage: write_tiny_llama_qwen2.py WORK TOKENIZER_DIR INIT_RANGE
import shutil
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

work, tokenizer, init_range = sys.argv[1], sys.argv[2], float(sys.argv[3])
common = dict(vocab_size=151936, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
              initializer_range=init_range, bos_token_id=151643, eos_token_id=151645)
cases = {
    "llama": (LlamaForCausalLM, LlamaConfig(**common, tie_word_embeddings=True, rope_theta=500000.0,
              rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                            "high_freq_factor": 4.0, "original_max_position_embeddings": 64})),
    "qwen2": (Qwen2ForCausalLM, Qwen2Config(**common, tie_word_embeddings=False)),
}
for name, (cls, config) in cases.items():
    torch.manual_seed(0)
    model = cls(config).eval()
    with torch.no_grad():
        for key, p in model.named_parameters():
            if key.endswith(".bias"):
                p.normal_(0.0, 0.1)
    model.save_pretrained(f"{work}/{name}", safe_serialization=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(f"{tokenizer}/{f}", f"{work}/{name}/{f}")
