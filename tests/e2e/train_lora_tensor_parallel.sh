#!/usr/bin/env bash
# LoRA under tensor parallel (models/lora.h: a column-wise linear's B and a row-wise linear's A
# cut like their base, the other matrix whole and its gradient summed over the TP group) through
# `titan launch` (mpirun, oversubscribed, one thread a rank), on the default tiny Qwen3 (a random
# frozen base) with a rank-8 adapter on all seven projections, against one process with the same
# global batch:
#  - TP 2 (sequence parallel), TP 2 without sequence parallel, FSDP 2 x TP 2: 10 losses and grad
#    norms within 1e-5 relative; the exported adapters hold the one process's tensors and shapes;
#    the start-up line counts the whole adapter and model, as the one process's;
#  - lora.dropout 0.1 under TP 2: the same (a row-wise input's mask keyed by its whole feature);
#  - at a learning rate no update survives rounding (1e-30), started from the one process's trained
#    adapter (lora.initial_adapter, each rank reading its cuts), the PEFT adapter folder TP 2 and
#    FSDP 2 x TP 2 write (each tensor gathered onto rank 0 just before it is written) is the one
#    process's byte for byte;
#  - checkpoints: TP 2's step-4 checkpoint is the one process's layout (the adapter's tensors
#    whole; an asynchronous save's the synchronous one's byte for byte) and resumes on one process, one process's resumes on TP 2 and FSDP 2 x TP 2, each
#    continuing within 1e-5 of the uninterrupted one process;
#  - against PEFT: 3 steps of TP 2 from a PEFT adapter folder (lora.initial_adapter, read into
#    each rank's cuts) on train_lora.sh's chat model, PEFT's steps and its trained adapter read
#    back by PeftModel.from_pretrained from the TP 2 export (tests/reference/lora_reference.py);
#  - expert parallel on tiny_moe with the attention adapted: EP 2 and TP 2 x EP 2 the same way
#    (10 steps, lr 1e-5), EP 2's adapter folder byte for byte at lr 1e-30;
#  - refused with one line: lora.merge_on_export and lora.base_dtype = "bfloat16" under TP, titan
#    plan of a LoRA run under TP (LoRA on the experts under EP: train_expert_parallel.sh).
# usage: train_lora_tensor_parallel.sh TITAN PYTHON
set -euo pipefail
titan="$1"
python="$2"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source_dir="$(cd "$(dirname "$0")/../.." && pwd)"
. "$(dirname "$0")/layout_runs.sh"
. "$(dirname "$0")/lora_setup.sh"

common=(--training.steps=10 --training.seq_len=64 --training.local_batch_size=1
        --training.global_batch_size=4 --lr_scheduler.warmup_steps=2 --metrics.log_freq=1
        --threads 1 --lora.rank=8 --lora.alpha=16 --checkpoint.last_save_in_hf=true)
tp2=(--parallelism.tensor_parallel_degree=2)
no_sp=(--parallelism.enable_sequence_parallel=false)
# same_lora_line REF RUN...: each RUN's start-up line counting the adapter's and the model's
# parameters is REF's (the whole model's, not rank 0's parts).
same_lora_line() {
  local reference="$1" name
  shift
  for name in "$@"; do
    diff <(grep "^LoRA: rank" "$work/$reference.log") <(grep "^LoRA: rank" "$work/$name.log") \
      || { echo "$name: the LoRA line differs from $reference's"; exit 1; }
  done
}

run single 1
run tp2 2 "${tp2[@]}"
one_line "$work/tp2.log" "^LoRA: rank 8, alpha 16"
run tp2-no-sp 2 "${tp2[@]}" "${no_sp[@]}"
run fsdp2tp2 4 "${tp2[@]}"
grep -q "dp_shard 2" "$work/fsdp2tp2.log" || { echo "fsdp2tp2: not FSDP 2"; cat "$work/fsdp2tp2.log"; exit 1; }
equal_to_single --adapter single 1 tp2 tp2-no-sp fsdp2tp2
same_lora_line single tp2 fsdp2tp2
run drop-single 1 --lora.dropout=0.1
run drop-tp2 2 "${tp2[@]}" --lora.dropout=0.1
equal_to_single --adapter drop-single 1 drop-tp2

# Nothing moves at lr 1e-30 -- from an adapter with no zero element: PEFT's init has B = 0, where
# an update of 1e-30 times AdamW's normalised step survives and carries the gradient's last bits.
# Each rank reads its cut of the one process's trained adapter (lora.initial_adapter), and the
# export gathers it back whole.
still=(--training.steps=2 --optimizer.lr=1e-30 --lora.initial_adapter="$work/single/adapter")
run still-single 1 "${still[@]}"
run still-tp2 2 "${still[@]}" "${tp2[@]}"
run still-fsdp2tp2 4 "${still[@]}" "${tp2[@]}"
for name in still-tp2 still-fsdp2tp2; do
  for f in adapter_model.safetensors adapter_config.json; do
    cmp "$work/still-single/adapter/$f" "$work/$name/adapter/$f" || { echo "$name: $f differs from one process's"; exit 1; }
  done
  echo "$name: adapter folder byte for byte the one process's"
done

# Checkpoints at step 4 (the adapter and its AdamW state, whole), resumed on the other layouts.
ckpt=(--checkpoint.enable=true --checkpoint.interval=4 --checkpoint.keep_latest_k=0)
run ck-single 1 "${ckpt[@]}"
run ck-tp2 2 "${ckpt[@]}" "${tp2[@]}"
"$python" - "$work/ck-single/checkpoint/step-4" "$work/ck-tp2/checkpoint/step-4" <<'PY'
import sys
from safetensors import safe_open
def shapes(folder):
    with safe_open(f"{folder}/model.safetensors", "pt") as f:
        return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
single, tp2 = map(shapes, sys.argv[1:])
assert single == tp2, "ck-tp2's checkpoint is not the one process's layout"
assert any(".lora_B." in k for k in single), sorted(single)[:4]
print(f"ck-tp2: step-4 checkpoint holds the one process's {len(single)} adapter tensors, whole")
PY
equal_to_single --adapter single 1 ck-tp2
# An asynchronous save gathers every tensor at once into rank 0's staging copy: the same files.
run ck-tp2-async 2 "${ckpt[@]}" "${tp2[@]}" --checkpoint.async_mode=async
cmp "$work/ck-tp2/checkpoint/step-4/model.safetensors" "$work/ck-tp2-async/checkpoint/step-4/model.safetensors" \
  || { echo "ck-tp2-async: step-4 checkpoint differs from the synchronous save's"; exit 1; }
echo "ck-tp2-async: step-4 checkpoint byte for byte the synchronous save's"
resumed() {  # NAME NPROC FROM ARGS...: FROM's step-4 checkpoint resumed in a new dump folder
  local name="$1" n="$2" from="$3"
  shift 3
  mkdir -p "$work/$name/checkpoint"
  cp -r "$work/$from/checkpoint/step-4" "$work/$name/checkpoint/"
  run "$name" "$n" "${ckpt[@]}" "$@"
  grep -q "resumed step 4 from" "$work/$name.log" || { echo "$name: did not resume"; cat "$work/$name.log"; exit 1; }
}
resumed tp2-to-1 1 ck-tp2
resumed 1-to-tp2 2 ck-single "${tp2[@]}"
resumed 1-to-fsdp2tp2 4 ck-single "${tp2[@]}"
equal_to_single --adapter single 5 tp2-to-1 1-to-tp2 1-to-fsdp2tp2

# Expert parallel on tiny_moe with the attention adapted (the experts' pairs are refused under EP):
# EP 2 and TP 2 x EP 2 against one process, at learning rate 1e-5 as the EP x TP tests (at 8e-4
# the tiny MoE's routing flips on AdamW's near-cancelling moments), and the adapter folder byte
# for byte at 1e-30.
moe=(--model.flavor=tiny_moe --model.output_router_logits=true --model.router_aux_loss_scope=local
     --lora.target_modules=q_proj,k_proj,v_proj,o_proj)
ep2=(--parallelism.expert_parallel_degree=2)
run moe-single 1 "${moe[@]}" --optimizer.lr=1e-5
run moe-ep2 2 "${moe[@]}" "${ep2[@]}" --optimizer.lr=1e-5
run moe-tp2ep2 2 "${moe[@]}" "${ep2[@]}" "${tp2[@]}" --optimizer.lr=1e-5
equal_to_single --adapter moe-single 1 moe-ep2 moe-tp2ep2
same_lora_line moe-single moe-ep2 moe-tp2ep2
moe_still=(--training.steps=2 --optimizer.lr=1e-30 --lora.initial_adapter="$work/moe-single/adapter")
run moe-still-single 1 "${moe[@]}" "${moe_still[@]}"
run moe-still-ep2 2 "${moe[@]}" "${ep2[@]}" "${moe_still[@]}"
for f in adapter_model.safetensors adapter_config.json; do
  cmp "$work/moe-still-single/adapter/$f" "$work/moe-still-ep2/adapter/$f" || { echo "moe-still-ep2: $f differs from one process's"; exit 1; }
done
echo "moe-still-ep2: adapter folder byte for byte the one process's"

# Against PEFT: train_lora.sh's chat model and a PEFT init, 3 steps of TP 2.
reference="$source_dir/tests/reference/lora_reference.py"
"$titan" tokenizer train --vocab-size 512 --out "$work/model" \
  /usr/share/doc/jargon-text/jargon.txt.gz > /dev/null 2>&1
rm "$work/model/titan.json"
"$python" "$source_dir/tests/reference/chat_sft_reference.py" make "$work/model" \
  "$source_dir/tests/fixtures/chat_templates.json" > /dev/null 2>&1
"$python" "$reference" init "$work/model" "$work/init" 8 16 \
  q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj > /dev/null 2>&1
cp "$source_dir/tests/fixtures/chat_data/lora-sft.jsonl" "$work/sft.jsonl"
lora_arguments "$work/model" "$work/sft.jsonl" "$work/init" 8
"$titan" launch --nproc 2 train "${lora[@]}" "${tp2[@]}" --threads 1 --training.local_batch_size=2 \
  --training.global_batch_size=4 --checkpoint.last_save_in_hf=true \
  --metrics.save_jsonl="$work/peft-tp2.jsonl" --job.dump_folder="$work/peft-tp2" \
  > "$work/peft-tp2.log" 2>&1 || { cat "$work/peft-tp2.log"; exit 1; }
"$python" "$reference" check "$work/model" "$work/sft.jsonl" "$work/init" \
  "$work/peft-tp2.jsonl" "$work/peft-tp2/adapter" 3 2 1e-3 1e-4 > "$work/reference.log" 2>&1 \
  || { cat "$work/reference.log"; exit 1; }
grep -E "^(adapter|LoRA)" "$work/reference.log" | sed 's/^/TP 2: /'

# What is not built under TP: one line each, from the config alone (one process: before the mesh).
expect_refusal() {  # NAME PATTERN COMMAND...
  local name="$1" pattern="$2"
  shift 2
  if "$@" > "$work/$name.out" 2>&1; then echo "$name: not refused"; cat "$work/$name.out"; exit 1; fi
  [ "$(wc -l < "$work/$name.out")" = 1 ] && grep -q -- "$pattern" "$work/$name.out" \
    || { echo "$name: expected one line matching '$pattern':"; cat "$work/$name.out"; exit 1; }
}
expect_refusal merged "^titan train: error: lora.merge_on_export = true under parallelism.tensor_parallel_degree 2: merging" \
  "$titan" train "${common[@]}" "${tp2[@]}" --lora.merge_on_export=true \
  --job.dump_folder="$work/bad1"
expect_refusal base-bf16 "^titan train: error: lora.base_dtype = \"bfloat16\" under parallelism.tensor_parallel_degree 2: " \
  "$titan" train "${common[@]}" "${tp2[@]}" --lora.base_dtype=bfloat16 \
  --training.mixed_precision_param=bfloat16 --job.dump_folder="$work/bad2"
expect_refusal plan "^titan plan: error: lora.rank 8 under parallelism.tensor_parallel_degree 2: LoRA under tensor or expert parallel is not planned yet" \
  "$titan" plan "${common[@]}" "${tp2[@]}" --nproc 2
echo "train_lora_tensor_parallel: ok"
