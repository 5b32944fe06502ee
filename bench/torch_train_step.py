"""The PyTorch eager side of bench_train_step: Transformers' Qwen3ForCausalLM in fp32 with sdpa
attention (with --autocast-bf16, its forward under torch.autocast("cpu", bfloat16): PyTorch's
mixed precision), the HF loss on the inputs as labels, torch.optim.AdamW. Prints the best step
time and the process's peak resident memory, with what it held before the first step (the fp32
weights, the interpreter and the libraries): PyTorch's CPU tensors are plain allocations, so the
growth is the step's own memory (gradients, AdamW moments, activations, autocast's bf16 copies)."""
import argparse
import resource
import time

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM


def main():
    p = argparse.ArgumentParser()
    for name in ["hidden", "intermediate", "layers", "heads", "kv-heads", "head-dim", "vocab",
                 "batch", "seq", "steps", "threads"]:
        p.add_argument(f"--{name}", type=int, required=True)
    p.add_argument("--autocast-bf16", action="store_true")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    config = Qwen3Config(hidden_size=a.hidden, intermediate_size=a.intermediate,
                         num_hidden_layers=a.layers, num_attention_heads=a.heads,
                         num_key_value_heads=a.kv_heads, head_dim=a.head_dim,
                         vocab_size=a.vocab, tie_word_embeddings=True,
                         max_position_embeddings=max(a.seq, 512))
    model = Qwen3ForCausalLM._from_config(config, attn_implementation="sdpa", dtype=torch.float32)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=8e-4, betas=(0.9, 0.95),
                                  weight_decay=0.1)
    ids = torch.randint(0, a.vocab, (a.batch, a.seq))

    def step():
        optimizer.zero_grad(set_to_none=False)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.autocast_bf16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()

    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    step()  # warm-up
    best = float("inf")
    for _ in range(a.steps):
        t0 = time.perf_counter()
        step()
        best = min(best, time.perf_counter() - t0)
    print(f"seconds_per_step {best:.6f}")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(f"peak_rss_gib {peak / 2**20:.4f} before_steps_gib {rss_before / 2**20:.4f}")


if __name__ == "__main__":
    main()
