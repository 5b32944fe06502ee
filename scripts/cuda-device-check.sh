#!/usr/bin/env bash
# The CUDA backend's checks on a machine with an NVIDIA GPU, in one run (a few minutes on an H200;
# every step has a timeout, the whole stays under 8): titan_cuda_smoke and titan_cuda_kernels_test
# (every CUDA kernel against its op's fp32 reference -- the step-wide sum_squares_all,
# adamw_step_all and round_to_bf16_all against the per-array ops, bit for bit -- plainly and under
# compute-sanitizer's memcheck,
# the kernels test also under racecheck (the row kernels share memory between a block's threads),
# then titan_cuda_step_kernels_check (host-side: every kernel a dense or MoE fp32 or bf16 step
# binds on CUDA is registered there), then 10 training steps of the tiny Qwen3 in fp32 with training.device =
# "cuda" against the same run on the CPU (each step's loss and grad norm within 1e-5 relative; the
# CUDA backend's fp32 GEMMs never use TF32), its step-5 asynchronous checkpoint resumed on the CPU
# (steps 6-10 the same), and 2 steps under memcheck; then 10 steps in bf16 mixed precision against
# the CPU's bf16 run (each step's loss within 2 %, train_bf16_curve.sh's bound), saving synchronous
# checkpoints and the HF export from the device: its step 5 resumed on the CPU (steps 6-10 within
# the same bound), its step-10 checkpoint exported on the CPU byte-equal to its export; then 10
# fp32 steps of a tiny Qwen2 (linear biases) made by Transformers against the CPU; then 10 fp32
# steps of the tiny Qwen3-MoE (load-balancing loss on) against the CPU; then 10 fp32 LoRA steps of
# the tiny Qwen3 (dropout on) against the CPU, its PEFT adapter held to the CPU's; then
# generation and eval on cuda: a tiny Qwen3 folder made by Transformers, titan generate's greedy
# ids on cuda equal to the CPU's (fp32 weights, and bf16 weights over a bf16 KV cache; decode steps
# are not captured as CUDA graphs yet, so there is no graphs-off run to compare), titan eval's loss
# within 1e-5 relative of the CPU's, and generate once under memcheck; then bench_cuda_gemm beside
# PyTorch's matmul on the same shapes (bench/cuda_gemm_torch.py), then bench_cuda_gemm again (the
# clock moves between runs); then bench_cuda_decode: Qwen3-0.6B dims with random bf16 weights (a
# folder Transformers writes), batch 1 after a 512-token prompt, tokens/s and its share of the HBM
# bound at bench_cuda_gemm's copy rate; then cuDNN's attention forward and backward
# (bench_cuda_attention) beside PyTorch's scaled_dot_product_attention at Qwen3-0.6B's shapes (8 x
# 2048, 16/8 heads x 128, bf16, causal; bench/cuda_attention_torch.py); a summary of every step last.
# Issue 41's speed bar -- the whole bf16 training step beside PyTorch eager and torch.compile -- is
# scripts/cuda-train-step-bench.sh, up to 9 minutes of its own: a second device call.
# Build the binaries first, where nvcc is (no GPU needed):
#   cmake -S . -B build-cuda -DTITAN_CUDA=ON -DTITAN_BUILD_TESTS=OFF -DTITAN_BUILD_BENCH=ON
#   cmake --build build-cuda --target titan_cuda_smoke bench_cuda_gemm titan_cuda_kernels_test \
#     titan_cuda_step_kernels_check titan_cli bench_cuda_decode bench_cuda_attention \
#     titan_cudnn_attention_graphs_check
# titan_cuda_kernels_test links libtitan, so oneDNN (libdnnl.so.2), which a GPU machine may not
# have: put the build machine's libraries it needs in .devlibs/ (git-ignored) and carry it with the
# binaries (titan and titan_cuda_step_kernels_check link the same libraries as the kernels test):
#   mkdir -p .devlibs && echo /.devlibs/ >> .git/info/exclude && cp -L $(ldd
#     build-cuda/titan_cuda_kernels_test | awk '/dnnl|OpenCL|gomp/ {print $3}') .devlibs/
# and, for a rebuild there, cudnn-frontend's headers (not on the GPU machines):
#   cp -r .venv/lib/python3*/site-packages/include .devlibs/cudnn-frontend-include
# If the smoke test or the benchmark cannot load there (another CUDA or C++ runtime), the script
# builds them with that machine's nvcc; the kernels test needs the whole library, which it builds
# there with cmake only where cmake and titan's dependencies are (else its step fails, saying why). Results also go to $OUT when it is set (the device tool's
# output folder).
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH
export LD_LIBRARY_PATH=$PWD/.devlibs:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
# cuDNN and NVRTC (attention_cuda_cudnn; the binaries need libcudnn.so.9 and libnvrtc.so.13): the
# system's, else the nvidia-cudnn-cu13 and CUDA 13 wheels' under python3 (nvidia/cudnn/lib,
# nvidia/cu13/lib).
for lib_and_dir in libcudnn.so.9:cudnn libnvrtc.so.13:cu13; do
  lib=${lib_and_dir%%:*} dir=${lib_and_dir##*:}
  if ldconfig -p 2> /dev/null | grep -q "$lib" || [ -e "/usr/local/cuda/lib64/$lib" ] ||
    [ -e "/usr/local/cuda/lib/$lib" ]; then continue; fi
  wheel_lib=$(python3 -c 'import os, sys, nvidia; print(os.path.join(list(nvidia.__path__)[0], sys.argv[1], "lib"))' "$dir" 2> /dev/null)
  if [ -n "$wheel_lib" ] && [ -e "$wheel_lib/$lib" ]; then
    export LD_LIBRARY_PATH=$wheel_lib:$LD_LIBRARY_PATH
    echo "== $lib from $wheel_lib"
  else
    echo "== no $lib on this machine: the CUDA binaries will not load"
  fi
done
out=${OUT:-$(mktemp -d)}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
smoke=build-cuda/titan_cuda_smoke bench=build-cuda/bench/bench_cuda_gemm
kernels=build-cuda/titan_cuda_kernels_test
step_kernels=build-cuda/titan_cuda_step_kernels_check titan=build-cuda/titan
decode=build-cuda/bench/bench_cuda_decode
attention_bench=build-cuda/bench/bench_cuda_attention
if [ ! -x "$smoke" ] || [ ! -x "$bench" ] || ldd "$smoke" "$bench" | grep -q "not found"; then
  echo "== building with this machine's nvcc"
  common=(-std=c++20 -O2 -arch=sm_90 -Isrc src/titan/backend/device_buffer.cpp
          src/titan/backend/cuda/cuda_backend.cu -lcublasLt)
  nvcc "${common[@]}" -Itests tests/cuda/cuda_smoke.cpp src/titan/backend/gemm_reference.cpp \
    src/titan/core/allocator.cpp \
    -o /tmp/titan_cuda_smoke || exit 1
  nvcc "${common[@]}" -Ibench bench/bench_cuda_gemm.cpp -o /tmp/bench_cuda_gemm || exit 1
  smoke=/tmp/titan_cuda_smoke bench=/tmp/bench_cuda_gemm
fi
summary=()
status=0
step() {  # step NAME TIMEOUT COMMAND...: runs it, notes ok or FAIL (and the exit status)
  local name=$1 limit=$2 rc
  shift 2
  echo "== $name"
  timeout "$limit" "$@"
  rc=$?
  if [ "$rc" -eq 0 ]; then summary+=("ok    $name"); else summary+=("FAIL  $name (exit $rc)"); status=1; fi
}
memcheck=(compute-sanitizer --tool memcheck --error-exitcode 1)
step "titan_cuda_smoke" 60 "$smoke"
step "titan_cuda_smoke under memcheck" 180 "${memcheck[@]}" "$smoke"
unloadable() { [ ! -x "$1" ] || ldd "$1" | grep -q "not found"; }
# Host-side: cuDNN attention's graphs pass cudnn-frontend's validation for SM 90.
if unloadable build-cuda/titan_cudnn_attention_graphs_check; then
  summary+=("FAIL  titan_cudnn_attention_graphs_check: not built or not loadable")
  status=1
else
  step "titan_cudnn_attention_graphs_check" 60 build-cuda/titan_cudnn_attention_graphs_check
fi
if { unloadable "$kernels" || unloadable "$step_kernels" || unloadable "$titan" ||
  unloadable "$decode" || unloadable "$attention_bench"; } && command -v cmake > /dev/null; then
  echo "== building titan_cuda_kernels_test, titan_cuda_step_kernels_check, titan and the benchmarks here"
  timeout 60 cmake -S . -B /tmp/build-cuda -DTITAN_CUDA=ON -DTITAN_BUILD_TESTS=OFF \
    -DTITAN_BUILD_BENCH=ON -DCUDNN_FRONTEND_INCLUDE_DIR="$PWD/.devlibs/cudnn-frontend-include" \
    > /dev/null &&
    timeout 300 cmake --build /tmp/build-cuda -j"$(nproc)" --target titan_cuda_kernels_test \
      titan_cuda_step_kernels_check titan_cli bench_cuda_decode bench_cuda_attention > /dev/null &&
    kernels=/tmp/build-cuda/titan_cuda_kernels_test &&
    step_kernels=/tmp/build-cuda/titan_cuda_step_kernels_check titan=/tmp/build-cuda/titan &&
    decode=/tmp/build-cuda/bench/bench_cuda_decode &&
    attention_bench=/tmp/build-cuda/bench/bench_cuda_attention
fi
if [ ! -x "$kernels" ] || ldd "$kernels" | grep "not found"; then
  echo "== titan_cuda_kernels_test cannot run here: missing, or libraries not found (see the header)"
  summary+=("FAIL  titan_cuda_kernels_test: not built or not loadable")
  status=1
else
  # Its table also goes to $OUT (the device tool returns only the output's tail).
  step "titan_cuda_kernels_test" 120 bash -o pipefail -c '"$0" | tee "$1"' "$kernels" \
    "$out/kernels_test.txt"
  step "titan_cuda_kernels_test under memcheck" 180 "${memcheck[@]}" "$kernels"
  step "titan_cuda_kernels_test under racecheck" 120 \
    compute-sanitizer --tool racecheck --error-exitcode 1 "$kernels"
fi
if unloadable "$step_kernels" || unloadable "$titan"; then
  echo "== titan_cuda_step_kernels_check or titan cannot run here: missing, or libraries not found"
  summary+=("FAIL  the tiny Qwen3 on cuda: titan or the step kernels check missing or unloadable")
  status=1
else
  step "titan_cuda_step_kernels_check" 60 "$step_kernels"
  # The tiny Qwen3 (the default corpus), fp32, 10 steps of 2 x 64 tokens; the CPU run on 4 threads
  # is the reference. The cuda run saves an asynchronous checkpoint at step 5 (staged through the
  # device's copies), which the CPU resumes from: its steps 6-10 must equal the reference too.
  # metrics.peak_tflops: CUDA has no measured peak yet (any value; MFU is not compared).
  tiny=(train --model.flavor=tiny --training.steps=10 --lr_scheduler.warmup_steps=2
        --training.seq_len=64 --training.local_batch_size=2 --checkpoint.last_save_in_hf=false
        --metrics.log_freq=1 --metrics.peak_tflops=67)
  saves=(--checkpoint.enable=true --checkpoint.interval=5 --checkpoint.async_mode=async)
  runs=$(mktemp -d)
  # within_steps NAME REF GOT FIRST BOUND KEYS: each step from FIRST on of metrics file GOT (its
  # last row of each step) within BOUND relative of REF's, in each of KEYS (comma-separated).
  within_steps() {
    step "$1" 30 python3 -c "$(cat << 'PY'
import json, sys
ref_path, got_path, first, bound, keys = sys.argv[1:6]
first, bound, keys = int(first), float(bound), keys.split(",")
def steps(path):
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return {r["step"]: [r[k] for k in keys] for r in rows
            if "grad_norm" in r and r["step"] >= first}
ref, got = steps(ref_path), steps(got_path)
assert sorted(ref) == sorted(got) == list(range(first, 11)), (sorted(ref), sorted(got))
worst = 0.0
for s in sorted(ref):
    rel = max(abs(g - r) / abs(r) for r, g in zip(ref[s], got[s]))
    worst = max(worst, rel)
    pairs = "  ".join(f"{k} {r:.9f} {g:.9f}" for k, r, g in zip(keys, ref[s], got[s]))
    print(f"step {s:2d}  {pairs}  rel {rel:.2e}")
print(f"worst relative difference {worst:.2e} (bound {bound:g})")
sys.exit(0 if worst <= bound else 1)
PY
)" "$2" "$3" "$4" "$5" "$6"
  }
  equal_steps() { within_steps "$1" "$2" "$3" "$4" 1e-5 loss,grad_norm; }
  step "tiny Qwen3, 10 steps on the CPU" 180 "$titan" "${tiny[@]}" --threads 4 \
    --job.dump_folder="$runs/cpu"
  step "tiny Qwen3, 10 steps on cuda" 120 bash -o pipefail -c '"$0" "${@:2}" | tee "$1"' \
    "$titan" "$out/tiny_cuda.txt" "${tiny[@]}" "${saves[@]}" --training.device=cuda \
    --job.dump_folder="$runs/cuda"
  equal_steps "tiny Qwen3: cuda's losses and grad norms within 1e-5 relative of the CPU's" \
    "$runs/cpu/metrics.jsonl" "$runs/cuda/metrics.jsonl" 1
  cp -r "$runs/cuda" "$runs/resumed"
  step "tiny Qwen3: cuda's step-5 checkpoint resumed on the CPU" 180 "$titan" "${tiny[@]}" \
    "${saves[@]}" --checkpoint.load_step=5 --threads 4 --job.dump_folder="$runs/resumed"
  equal_steps "tiny Qwen3: the CPU's steps 6-10 from cuda's checkpoint equal the CPU run's" \
    "$runs/cpu/metrics.jsonl" "$runs/resumed/metrics.jsonl" 6
  step "tiny Qwen3, 2 steps on cuda under memcheck" 240 "${memcheck[@]}" "$titan" "${tiny[@]}" \
    --training.steps=2 --training.device=cuda --job.dump_folder="$runs/cuda_memcheck"
  # bf16 mixed precision: the same 10 steps. Both runs round at the same points (fp32 master
  # weights, bf16 matmul operands, fp32 accumulation) with sums in other orders, so losses are held
  # to the CPU's bf16 bound against fp32 (2 %, train_bf16_curve.sh). The cuda run saves
  # synchronously at steps 5 and 10 (a tensor at a time through pinned host memory) and exports the
  # model at the end: the CPU resumes its step 5, and exports its step 10 (titan convert), which
  # must give the export's weight files byte for byte.
  bf16=(--training.mixed_precision_param=bfloat16)
  sync_saves=(--checkpoint.enable=true --checkpoint.interval=5 --checkpoint.async_mode=disabled)
  step "tiny Qwen3 bf16, 10 steps on the CPU" 180 "$titan" "${tiny[@]}" "${bf16[@]}" --threads 4 \
    --job.dump_folder="$runs/cpu_bf16"
  step "tiny Qwen3 bf16, 10 steps on cuda (synchronous saves, HF export)" 120 \
    bash -o pipefail -c '"$0" "${@:2}" | tee "$1"' "$titan" "$out/tiny_cuda_bf16.txt" \
    "${tiny[@]}" "${bf16[@]}" "${sync_saves[@]}" --checkpoint.last_save_in_hf=true \
    --training.device=cuda --job.dump_folder="$runs/cuda_bf16"
  within_steps "tiny Qwen3 bf16: cuda's losses within 2 % of the CPU's" \
    "$runs/cpu_bf16/metrics.jsonl" "$runs/cuda_bf16/metrics.jsonl" 1 0.02 loss
  cp -r "$runs/cuda_bf16" "$runs/resumed_bf16"
  step "tiny Qwen3 bf16: cuda's synchronous step-5 checkpoint resumed on the CPU" 180 "$titan" \
    "${tiny[@]}" "${bf16[@]}" "${sync_saves[@]}" --checkpoint.load_step=5 --threads 4 \
    --job.dump_folder="$runs/resumed_bf16"
  within_steps "tiny Qwen3 bf16: the CPU's steps 6-10 from cuda's checkpoint within 2 %" \
    "$runs/cpu_bf16/metrics.jsonl" "$runs/resumed_bf16/metrics.jsonl" 6 0.02 loss
  step "tiny Qwen3 bf16: cuda's step-10 checkpoint exported on the CPU" 60 "$titan" convert \
    "$runs/cuda_bf16/checkpoint/step-10" "$runs/cpu_export"
  step "tiny Qwen3 bf16: cuda's HF export byte-equal to the CPU's export of its step 10" 30 \
    bash -c 'cd "$0" && ls model*.safetensors* > /dev/null &&
      for f in model*.safetensors*; do cmp "$f" "$1/$f" || exit 1; done' \
    "$runs/cuda_bf16/hf" "$runs/cpu_export"
  # Qwen2's linear biases (q/k/v): a tiny untied Qwen2 folder made by Transformers with random
  # biases (tests/fixtures' Qwen3 tokenizer), 10 fp32 steps from it on cuda against the CPU.
  qwen2="$runs/qwen2_folder"
  step "tiny Qwen2 folder with random biases (Transformers)" 120 python3 - "$qwen2" \
    tests/fixtures/qwen3-tokenizer << 'PY'
import shutil, sys, torch
from transformers import Qwen2Config, Qwen2ForCausalLM
folder, tokenizer = sys.argv[1:]
config = Qwen2Config(vocab_size=151936, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                     initializer_range=0.02, bos_token_id=151643, eos_token_id=151645,
                     tie_word_embeddings=False)
torch.manual_seed(0)
model = Qwen2ForCausalLM(config).eval()
with torch.no_grad():
    for key, p in model.named_parameters():
        if key.endswith(".bias"):
            p.normal_(0.0, 0.1)
model.save_pretrained(folder, safe_serialization=True)
for f in ("tokenizer.json", "tokenizer_config.json"):
    shutil.copy(f"{tokenizer}/{f}", f"{folder}/{f}")
PY
  qwen2_run=(train --preset hf --model.hf_assets_path="$qwen2" --checkpoint.initial_load_path="$qwen2"
             --checkpoint.initial_load_in_hf=true --checkpoint.last_save_in_hf=false
             --training.steps=10 --lr_scheduler.warmup_steps=2 --training.seq_len=64
             --training.local_batch_size=2 --metrics.log_freq=1 --metrics.peak_tflops=67)
  step "tiny Qwen2, 10 steps on the CPU" 180 "$titan" "${qwen2_run[@]}" --threads 4 \
    --job.dump_folder="$runs/qwen2_cpu"
  step "tiny Qwen2, 10 steps on cuda" 120 "$titan" "${qwen2_run[@]}" --training.device=cuda \
    --job.dump_folder="$runs/qwen2_cuda"
  equal_steps "tiny Qwen2 (biases): cuda's losses and grad norms within 1e-5 relative of the CPU's" \
    "$runs/qwen2_cpu/metrics.jsonl" "$runs/qwen2_cuda/metrics.jsonl" 1
  # The tiny Qwen3-MoE (router, dispatch, grouped experts, combine and the load-balancing loss on
  # cuda), fp32, the same 10 steps against the CPU.
  moe=("${tiny[@]}" --model.flavor=tiny_moe --model.output_router_logits=true)
  step "tiny Qwen3-MoE, 10 steps on the CPU" 180 "$titan" "${moe[@]}" --threads 4 \
    --job.dump_folder="$runs/moe_cpu"
  step "tiny Qwen3-MoE, 10 steps on cuda" 120 "$titan" "${moe[@]}" --training.device=cuda \
    --job.dump_folder="$runs/moe_cuda"
  equal_steps "tiny Qwen3-MoE: cuda's losses and grad norms within 1e-5 relative of the CPU's" \
    "$runs/moe_cpu/metrics.jsonl" "$runs/moe_cuda/metrics.jsonl" 1
  # Generation and eval (titan generate / eval --device cuda): a tiny untied Qwen3 folder made by
  # Transformers, its weights spread (initializer_range 0.2) so that greedy choices are far from
  # ties the summation orders could flip; two prompts' greedy ids (and text) on cuda equal the
  # CPU's, with fp32 weights and with bf16 weights over a bf16 KV cache (each prompt and its 24
  # tokens within the first 128 keys, where CUDA's bf16 attention rounds P against the same max as
  # the CPU's decode path); eval's loss within 1e-5 relative.
  qwen3="$runs/qwen3_folder"
  step "tiny Qwen3 folder (Transformers)" 120 python3 - "$qwen3" tests/fixtures/qwen3-tokenizer \
    "$runs/eval.jsonl" "$runs/prompts.jsonl" << 'PY'
import json, shutil, sys, torch
from transformers import Qwen3Config, Qwen3ForCausalLM
folder, tokenizer, data, prompts = sys.argv[1:]
config = Qwen3Config(vocab_size=151936, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                     max_position_embeddings=512, initializer_range=0.2, bos_token_id=151643,
                     eos_token_id=151645, tie_word_embeddings=False)
torch.manual_seed(0)
Qwen3ForCausalLM(config).eval().save_pretrained(folder, safe_serialization=True)
for f in ("tokenizer.json", "tokenizer_config.json"):
    shutil.copy(f"{tokenizer}/{f}", f"{folder}/{f}")
with open(data, "w") as f:
    for i in range(8):
        f.write(json.dumps({"text": f"Line {i}: the quick brown fox jumps over the lazy dog."}) + "\n")
with open(prompts, "w") as f:
    for p in ("The quick brown fox", "Once upon a time, in a land far away"):
        f.write(json.dumps({"prompt": p}) + "\n")
PY
  for dtype in float32 bfloat16; do
    gen=(generate --model "$qwen3" --prompts "$runs/prompts.jsonl" --greedy --max-new-tokens 24
         --dtype "$dtype")
    step "tiny Qwen3 generate $dtype on the CPU" 60 bash -c '"$0" "${@:2}" > "$1"' "$titan" \
      "$runs/gen_cpu_$dtype.jsonl" "${gen[@]}" --threads 4
    step "tiny Qwen3 generate $dtype on cuda" 60 bash -c '"$0" "${@:2}" > "$1"' "$titan" \
      "$runs/gen_cuda_$dtype.jsonl" "${gen[@]}" --device cuda
    step "tiny Qwen3 $dtype: cuda's greedy ids equal the CPU's" 10 \
      cmp "$runs/gen_cpu_$dtype.jsonl" "$runs/gen_cuda_$dtype.jsonl"
  done
  cp "$runs"/gen_*.jsonl "$out/" 2> /dev/null
  evaluate=(eval --model "$qwen3" --data "$runs/eval.jsonl" --seq-len 32 --dtype float32)
  step "tiny Qwen3 eval on the CPU" 60 bash -c '"$0" "${@:2}" > "$1"' "$titan" \
    "$runs/eval_cpu.txt" "${evaluate[@]}" --threads 4
  step "tiny Qwen3 eval on cuda" 60 bash -c '"$0" "${@:2}" > "$1"' "$titan" \
    "$runs/eval_cuda.txt" "${evaluate[@]}" --device cuda
  step "tiny Qwen3 eval: cuda's loss within 1e-5 relative of the CPU's" 10 python3 -c '
import sys
loss = [float(open(p).read().split()[1]) for p in sys.argv[1:]]
print(f"loss cpu {loss[0]:.9f} cuda {loss[1]:.9f} rel {abs(loss[1] - loss[0]) / abs(loss[0]):.2e}")
sys.exit(0 if abs(loss[1] - loss[0]) <= 1e-5 * abs(loss[0]) else 1)' \
    "$runs/eval_cpu.txt" "$runs/eval_cuda.txt"
  step "tiny Qwen3 generate on cuda under memcheck" 120 "${memcheck[@]}" "$titan" generate \
    --model "$qwen3" --prompt "The quick brown fox" --greedy --max-new-tokens 8 --device cuda
  # LoRA on the tiny Qwen3 (rank 8, alpha 16, every projection, dropout 0.1: CUDA's masks must be
  # the CPU's), fp32, 10 steps on cuda against the CPU (losses and grad norms within 1e-5), each
  # exporting its PEFT adapter. adapter_config.json is byte-equal; the weights cannot be (cuBLASLt
  # and oneDNN sum in other orders), so each tensor is held normwise (max |cuda - cpu| / max |cpu|)
  # within 1e-4: ten AdamW updates, each differing by about the gradients' relative difference
  # (the 1e-5 the grad norms are held to).
  lora=(--lora.rank=8 --lora.alpha=16 --lora.dropout=0.1 --checkpoint.last_save_in_hf=true)
  step "tiny Qwen3 LoRA, 10 steps on the CPU" 180 "$titan" "${tiny[@]}" "${lora[@]}" --threads 4 \
    --job.dump_folder="$runs/lora_cpu"
  step "tiny Qwen3 LoRA, 10 steps on cuda" 120 bash -o pipefail -c '"$0" "${@:2}" | tee "$1"' \
    "$titan" "$out/tiny_cuda_lora.txt" "${tiny[@]}" "${lora[@]}" --training.device=cuda \
    --job.dump_folder="$runs/lora_cuda"
  equal_steps "tiny Qwen3 LoRA: cuda's losses and grad norms within 1e-5 relative of the CPU's" \
    "$runs/lora_cpu/metrics.jsonl" "$runs/lora_cuda/metrics.jsonl" 1
  step "tiny Qwen3 LoRA: cuda's PEFT adapter_config.json byte-equal to the CPU's" 10 \
    cmp "$runs/lora_cuda/adapter/adapter_config.json" "$runs/lora_cpu/adapter/adapter_config.json"
  step "tiny Qwen3 LoRA: cuda's PEFT adapter within 1e-4 normwise of the CPU's" 60 python3 - \
    "$runs/lora_cpu/adapter" "$runs/lora_cuda/adapter" << 'PY'
import sys
from safetensors.torch import load_file
cpu, cuda = (load_file(f"{d}/adapter_model.safetensors") for d in sys.argv[1:3])
assert sorted(cpu) == sorted(cuda) and cpu, (sorted(cpu), sorted(cuda))
worst = 0.0
for key in sorted(cpu):
    ref, got = cpu[key].double(), cuda[key].double()
    assert ref.shape == got.shape, (key, ref.shape, got.shape)
    worst = max(worst, ((got - ref).abs().max() / ref.abs().max()).item())
print(f"{len(cpu)} tensors; worst normwise difference {worst:.2e} (bound 1e-4)")
sys.exit(0 if worst <= 1e-4 else 1)
PY
fi
echo "== bench_cuda_gemm"
"$bench" | tee "$out/titan_gemm.txt"
echo "== PyTorch on the same shapes"
timeout 300 python3 bench/cuda_gemm_torch.py | tee "$out/torch_gemm.txt"
echo "== bench_cuda_gemm again"
"$bench" | tee "$out/titan_gemm_2.txt"
# Decode against the HBM bound: Qwen3-0.6B's dims, random bf16 weights written by Transformers
# (tied, as Qwen3-0.6B), at bench_cuda_gemm's first copy rate.
copy_rate=$(sed -nE 's/^copy_on_device of .*: ([0-9.]+) GB\/s.*/\1/p' "$out/titan_gemm.txt")
if unloadable "$decode" || [ -z "$copy_rate" ]; then
  summary+=("FAIL  bench_cuda_decode: not built or not loadable, or no copy rate")
  status=1
else
  big=$(mktemp -d)
  step "Qwen3-0.6B dims folder, random bf16 weights (Transformers)" 120 python3 - "$big" << 'PY'
import sys, torch
from transformers import Qwen3Config, Qwen3ForCausalLM
config = Qwen3Config(vocab_size=151936, hidden_size=1024, intermediate_size=3072,
                     num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                     head_dim=128, max_position_embeddings=40960, tie_word_embeddings=True,
                     torch_dtype="bfloat16")
torch.manual_seed(0)
Qwen3ForCausalLM(config).to(torch.bfloat16).save_pretrained(sys.argv[1], safe_serialization=True)
PY
  step "bench_cuda_decode: Qwen3-0.6B dims bf16, batch 1 after 512 tokens" 120 \
    bash -o pipefail -c '"$0" "${@:2}" | tee "$1"' "$decode" "$out/decode.txt" --model "$big" \
    --copy-rate "$copy_rate" --prompt 512 --new 128
  rm -rf "$big"
fi
# cuDNN's fused attention beside PyTorch's SDPA (default choice and each backend) on one shape.
if unloadable "$attention_bench"; then
  summary+=("FAIL  bench_cuda_attention: not built or not loadable")
  status=1
else
  step "bench_cuda_attention (cuDNN, 8 x 2048, 16/8 heads x 128, bf16)" 120 \
    bash -o pipefail -c '"$0" | tee "$1"' "$attention_bench" "$out/titan_attention.txt"
fi
step "PyTorch scaled_dot_product_attention on the same shape" 180 \
  bash -o pipefail -c 'python3 "$0" | tee "$1"' bench/cuda_attention_torch.py \
  "$out/torch_attention.txt"
echo "== summary"
printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
exit $status
