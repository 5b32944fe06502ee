"""Reference tensors for the Qwen3 model tests, computed by Hugging Face Transformers' own
Qwen3ForCausalLM (eager attention, float32) and torch.optim.AdamW.

For each tiny config it writes OUT_DIR/qwen3_<name>.safetensors holding the initial weights
("param.<hf name>"), input_ids and labels (I32), logits, loss, every parameter gradient
("grad.<hf name>") and the weights after one AdamW step ("updated.<hf name>"); the config and the
optimizer settings go in the file's __metadata__ as strings.

usage: python qwen3_reference.py OUT_DIR
"""
import json
import sys

import torch
from safetensors.torch import save_file
from transformers import Qwen3Config, Qwen3ForCausalLM

# name: (config overrides, batch, seq). Together they cover tied and untied embeddings, GQA ratios
# 1, 2 and 4, head_dim != hidden / heads, odd sequence lengths, batch > 1, and sequences longer
# than one 64-row attention block.
CONFIGS = {
    "tied_gqa2": (dict(hidden_size=32, intermediate_size=56, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                       tie_word_embeddings=True, vocab_size=97), 2, 7),
    "untied_mha": (dict(hidden_size=24, intermediate_size=40, num_hidden_layers=2,
                        num_attention_heads=2, num_key_value_heads=2, head_dim=12,
                        tie_word_embeddings=False, vocab_size=101), 3, 5),
    "gqa4_long": (dict(hidden_size=48, intermediate_size=72, num_hidden_layers=2,
                       num_attention_heads=8, num_key_value_heads=2, head_dim=8,
                       tie_word_embeddings=False, vocab_size=89), 2, 133),
    "tied_gqa4_odd": (dict(hidden_size=40, intermediate_size=64, num_hidden_layers=3,
                           num_attention_heads=4, num_key_value_heads=1, head_dim=20,
                           tie_word_embeddings=True, vocab_size=131), 1, 13),
}
ADAMW = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


def make(name, overrides, batch, seq, out_dir):
    torch.manual_seed(1234)
    config = Qwen3Config(rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=512,
                         attention_dropout=0.0, **overrides)
    model = Qwen3ForCausalLM._from_config(config, attn_implementation="eager",
                                          dtype=torch.float32)
    # Non-trivial norm weights, so a kernel that ignored them would fail.
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith("norm.weight"):
                p.add_(0.1 * torch.randn_like(p))
    params = {f"param.{k}": v.detach().clone() for k, v in model.named_parameters()}

    ids = torch.randint(0, config.vocab_size, (batch, seq), dtype=torch.int64)
    labels = ids.clone()
    labels[:, 1] = -100  # ignored tokens take no part in the loss or the mean
    if seq > 4:
        labels[0, seq - 2] = -100

    out = model(input_ids=ids, labels=labels)
    out.loss.backward()
    grads = {f"grad.{k}": v.grad.detach().clone() for k, v in model.named_parameters()}
    torch.optim.AdamW(model.parameters(), foreach=False, **ADAMW).step()
    updated = {f"updated.{k}": v.detach().clone() for k, v in model.named_parameters()}

    tensors = {**params, **grads, **updated,
               "input_ids": ids.to(torch.int32), "labels": labels.to(torch.int32),
               "logits": out.logits.detach().contiguous(), "loss": out.loss.detach().reshape(1)}
    meta = {k: json.dumps(v) for k, v in overrides.items()}
    meta.update(rms_norm_eps=json.dumps(config.rms_norm_eps), rope_theta="10000.0",
                max_position_embeddings="512", batch=str(batch), seq=str(seq),
                adamw=json.dumps(ADAMW), format="pt")
    save_file({k: v.contiguous() for k, v in tensors.items()},
              f"{out_dir}/qwen3_{name}.safetensors", metadata=meta)


def main():
    out_dir = sys.argv[1]
    torch.set_num_threads(1)
    for name, (overrides, batch, seq) in CONFIGS.items():
        make(name, overrides, batch, seq, out_dir)
    print(f"wrote {len(CONFIGS)} reference files to {out_dir}")


if __name__ == "__main__":
    main()
