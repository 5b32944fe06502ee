#!/usr/bin/env bash
# Issue 41's speed bar on a machine with an NVIDIA GPU: titan's training step on cuda beside
# PyTorch's on the same GPU, in one run, at Qwen3-0.6B's dims (28 layers, hidden 1024, 16/8 heads x
# 128, FFN 3072, vocab 151936, tied) and torchtitan's debugmodel's (hidden 256, 8 layers, FFN 3072,
# 16/8 heads x 128, vocab 2048), batch 8 x 2048, bf16 mixed precision (fp32 parameters, bf16
# matmul operands, fp32 accumulation), AdamW and clipping to norm 1 on both sides.
#   titan: `titan train --training.device=cuda` with the built-in flavor (the default corpus;
#     loss on every position but each row's last), 11 steps logged one by one; the median of steps
#     4-11 (3 warm-ups; fewer if the run timed out, the table says how many), peak memory the
#     accounted allocator's and the device's own count in use (cudaMemGetInfo, which also holds
#     the CUDA context and cuBLASLt's workspace), MFU against the device's datasheet peak
#     (src/titan/backend/datasheet_peak.h).
#   PyTorch: bench/torch_train_step.py --device cuda, eager and torch.compile: Transformers'
#     Qwen3ForCausalLM, sdpa, torch.autocast bf16, fused AdamW, clip_grad_norm_; 3 warm-ups and the
#     median of 8 steps; peak torch.cuda.max_memory_allocated (and _reserved). Its MFU counts
#     titan's model FLOPs per token (docs/PERFORMANCE.md) against the same peak.
# usage: scripts/cuda-train-step-bench.sh [TITAN_BINARY [OUT_DIR]]. Every run has a timeout (525 s
# in all at worst: a titan run cut short still reports the steps it logged); the table is printed
# last and written to OUT_DIR/train_step.txt. scripts/cuda-device-check.sh runs it after its checks.
# PyTorch eager at 0.6B's dims peaked at 75.5 GiB on the H200 (issue 41): an 80 GB H100 may not
# hold it (its row then says "no result"); titan's plan for the same step is 27.8 GiB.
# Nothing here has run on a GPU yet.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
titan=${1:-build-cuda/titan}
out=${2:-${OUT:-$(mktemp -d)}}
runs=$(mktemp -d)
status=0
# run NAME TIMEOUT LOG COMMAND...: its output to LOG (and the terminal); a failure noted.
run() {
  local name=$1 limit=$2 log=$3 rc
  shift 3
  echo "== $name (at most ${limit} s)"
  timeout "$limit" "$@" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  if [ "$rc" -ne 0 ]; then echo "FAIL  $name (exit $rc)"; status=1; fi
}
# bench MODEL FLAVOR TORCH_DIMS TITAN_LIMIT EAGER_LIMIT COMPILE_LIMIT
bench() {
  local model=$1 flavor=$2 dims=$3
  run "titan $model on cuda" "$4" "$runs/$model.titan.txt" "$titan" train \
    --model.flavor="$flavor" --training.device=cuda --training.mixed_precision_param=bfloat16 \
    --training.seq_len=2048 --training.local_batch_size=8 --training.steps=11 \
    --lr_scheduler.warmup_steps=2 --metrics.log_freq=1 --checkpoint.last_save_in_hf=false \
    --job.dump_folder="$runs/$model"
  # shellcheck disable=SC2086  # dims is a list of flags
  run "PyTorch eager $model" "$5" "$runs/$model.eager.txt" python3 bench/torch_train_step.py \
    $dims --batch 8 --seq 2048 --warmup 3 --steps 8 --threads 1 --device cuda --autocast-bf16
  # shellcheck disable=SC2086
  run "PyTorch torch.compile $model" "$6" "$runs/$model.compile.txt" python3 \
    bench/torch_train_step.py $dims --batch 8 --seq 2048 --warmup 3 --steps 8 --threads 1 \
    --device cuda --autocast-bf16 --compile
}
bench 0.6B 0.6B "--hidden 1024 --intermediate 3072 --layers 28 --heads 16 --kv-heads 8 \
  --head-dim 128 --vocab 151936" 150 60 150
bench debugmodel debugmodel "--hidden 256 --intermediate 3072 --layers 8 --heads 16 --kv-heads 8 \
  --head-dim 128 --vocab 2048" 45 30 90
echo "== issue 41's bar: titan >= 1.2x PyTorch eager's tokens/s, >= 30 % MFU, peak <= eager's"
python3 - "$runs" << 'PY' | tee "$out/train_step.txt"
import json, re, statistics, sys
runs = sys.argv[1]

def titan(model):
    try:
        rows = [json.loads(l) for l in open(f"{runs}/{model}/metrics.jsonl") if l.strip()]
    except OSError:
        return None
    rows = [r for r in rows if "tokens_per_second" in r]
    timed = [r for r in rows if r["step"] >= 4] or rows[1:]
    if not timed:
        return None
    tps = statistics.median(r["tokens_per_second"] for r in timed)
    mfu = statistics.median(r["mfu"] for r in timed)
    # MFU's denominator and the model FLOPs per token, as titan counted them.
    peak_tflops = timed[0]["tflops"] / timed[0]["mfu"] * 100
    flops_per_token = timed[0]["tflops"] * 1e12 / timed[0]["tokens_per_second"]
    peak = max(r["memory_peak_gib"] for r in rows)
    device = max(r.get("device_memory_in_use_gib", float("nan")) for r in rows)
    return dict(tps=tps, mfu=mfu, peak=peak, device=device, steps=len(timed),
                peak_tflops=peak_tflops, flops=flops_per_token)

def torch(model, kind):
    try:
        text = open(f"{runs}/{model}.{kind}.txt").read()
    except OSError:
        return None
    s = re.search(r"median_seconds_per_step (\S+)", text)
    m = re.search(r"peak_allocated_gib (\S+) peak_reserved_gib (\S+)", text)
    if not s or not m:
        return None
    return dict(tps=8 * 2048 / float(s.group(1)), peak=float(m.group(1)),
                reserved=float(m.group(2)))

print(f"{'model':<11}{'run':<16}{'tokens/s':>10}{'MFU %':>8}{'peak GiB':>10}  notes")
for model in ["0.6B", "debugmodel"]:
    t, e, c = titan(model), torch(model, "eager"), torch(model, "compile")
    if t:
        print(f"{model:<11}{'titan':<16}{t['tps']:>10.0f}{t['mfu']:>8.1f}{t['peak']:>10.2f}  "
              f"median of {t['steps']} steps; device in use {t['device']:.2f} GiB; "
              f"peak {t['peak_tflops']:.0f} TFLOP/s")
    else:
        print(f"{model:<11}{'titan':<16}{'no result':>10}")
    for name, r in [("torch eager", e), ("torch.compile", c)]:
        if not r:
            print(f"{model:<11}{name:<16}{'no result':>10}")
            continue
        mfu = f"{100 * r['tps'] * t['flops'] / (t['peak_tflops'] * 1e12):>8.1f}" if t else f"{'-':>8}"
        ratio = f"titan / this {t['tps'] / r['tps']:.2f}x; " if t else ""
        print(f"{model:<11}{name:<16}{r['tps']:>10.0f}{mfu}{r['peak']:>10.2f}  "
              f"{ratio}reserved {r['reserved']:.2f} GiB")
PY
exit $status
