"""The PyTorch side of bench_train_step and of the CUDA benchmark (scripts/cuda-device-check.sh).

On the CPU (the default): Transformers' Qwen3ForCausalLM in fp32 with sdpa attention (with
--autocast-bf16, its forward under torch.autocast("cpu", bfloat16): PyTorch's mixed precision), the
HF loss on the inputs as labels, torch.optim.AdamW. Prints the best step time and the process's
peak resident memory, with what it held before the first step (the fp32 weights, the interpreter
and the libraries): PyTorch's CPU tensors are plain allocations, so the growth is the step's own
memory (gradients, AdamW moments, activations, autocast's bf16 copies).

With --device cuda, issue 41's recipe: fp32 parameters, the forward under
torch.autocast("cuda", bfloat16) (with --autocast-bf16), fused AdamW, gradient clipping to norm 1
(titan's default max_norm), sdpa; --compile wraps the model in torch.compile. --warmup steps, then
--steps timed steps, each ended by torch.cuda.synchronize(): prints the median step time and
torch.cuda.max_memory_allocated / max_memory_reserved (the caching allocator's peak in use, and
what it held from the device)."""
import argparse
import resource
import statistics
import time

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM


def build_model(a):
    config = Qwen3Config(hidden_size=a.hidden, intermediate_size=a.intermediate,
                         num_hidden_layers=a.layers, num_attention_heads=a.heads,
                         num_key_value_heads=a.kv_heads, head_dim=a.head_dim,
                         vocab_size=a.vocab, tie_word_embeddings=True,
                         max_position_embeddings=max(a.seq, 512))
    return Qwen3ForCausalLM._from_config(config, attn_implementation="sdpa", dtype=torch.float32)


def run_cuda(a):
    torch.manual_seed(0)
    device = torch.device("cuda")
    model = build_model(a).to(device)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=8e-4, betas=(0.9, 0.95),
                                  weight_decay=0.1, fused=True)
    forward = torch.compile(model) if a.compile else model
    ids = torch.randint(0, a.vocab, (a.batch, a.seq), device=device)

    def step():
        optimizer.zero_grad(set_to_none=False)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=a.autocast_bf16):
            loss = forward(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        optimizer.step()

    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    print(f"median_seconds_per_step {statistics.median(times):.6f}")
    print(f"peak_allocated_gib {torch.cuda.max_memory_allocated() / 2**30:.4f} "
          f"peak_reserved_gib {torch.cuda.max_memory_reserved() / 2**30:.4f}")
    print(f"device {torch.cuda.get_device_name()}")


def main():
    p = argparse.ArgumentParser()
    for name in ["hidden", "intermediate", "layers", "heads", "kv-heads", "head-dim", "vocab",
                 "batch", "seq", "steps", "threads"]:
        p.add_argument(f"--{name}", type=int, required=True)
    p.add_argument("--autocast-bf16", action="store_true")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--compile", action="store_true", help="torch.compile the model (cuda only)")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps first (cuda only)")
    a = p.parse_args()
    if a.device == "cuda":
        run_cuda(a)
        return
    if a.compile or a.warmup != 1:
        p.error("--compile and --warmup are for --device cuda")
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = build_model(a)
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
