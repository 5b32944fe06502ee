#!/usr/bin/env bash
# lora.base_dtype = "bfloat16" under FSDP (distributed/fsdp.h: the frozen base's shards of the
# weights read only in bf16 held as bf16 rows, loaded straight into bf16 and sent by the gathers as
# they are), against the unsharded bf16-base run (train_lora.sh checks that one against PEFT and
# the fp32 masters' run):
# - FSDP 2, 3 steps: the losses and the exported PEFT adapter bit-identical to one process's, on
#   a tied Qwen3 folder, an untied Llama one, a Qwen2 one (q/k/v biases, fp32 shards) and a
#   Qwen3-MoE one (its stacked experts held in bf16 shards too; the attention adapted). A global
#   batch of 2 rows, one a micro-batch: one process accumulates row 1's adapter gradients then row
#   2's, the 2 ranks all-reduce the same two sums, so every sum is in the same order (with 2
#   threads or more rows per rank they are not, and the losses differ in the 5th digit after 3
#   steps: the fp32 reassociation seen through bf16 roundings). Also bit-identical to FSDP 2 with
#   fp32 masters (lora.base_dtype = "float32": its gathers round each rank's rows into the same
#   bf16 values);
# - lora.merge_on_export on FSDP 2: the merged fp32 folder byte for byte the one-process bf16
#   base's (its shards widened exactly, the adapter's update added in fp32 as there);
# - resume across FSDP 2 -> 1: 2 steps on FSDP 2 saving a checkpoint (the adapter and its AdamW
#   state: the frozen base is not in it, as without FSDP), 2 more on one process: steps 3-4 equal
#   the uninterrupted one-process run's bit for bit;
# - HSDP 2 x 2 (4 ranks): 3 steps bit-identical to HSDP with fp32 masters (the same sums);
# - titan plan counts the bf16 shards (the plan's bytes against the allocator's are
#   test_training_plan's and plan_memory.sh's).
# usage: train_lora_base_fsdp.sh TITAN PYTHON
set -euo pipefail
titan=$(realpath "$1")
python="$2"
source_dir="$(cd "$(dirname "$0")/../.." && pwd)"
. "$(dirname "$0")/lora_setup.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
. "$(dirname "$0")/mpi_env.sh"
reference="$source_dir/tests/reference/lora_reference.py"

"$titan" tokenizer train --vocab-size 512 --out "$work/qwen3" \
  /usr/share/doc/jargon-text/jargon.txt.gz > /dev/null 2>&1
rm "$work/qwen3/titan.json"
"$python" "$source_dir/tests/reference/chat_sft_reference.py" make "$work/qwen3" \
  "$source_dir/tests/fixtures/chat_templates.json" > /dev/null 2>&1
for fam in llama qwen2 qwen3_moe; do
  mkdir -p "$work/$fam"
  cp "$work/qwen3"/tokenizer*.json "$work/$fam/"
  "$python" "$reference" family "$work/qwen3" "$work/$fam" "$fam" > /dev/null 2>&1
done
all=q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj
for fam in qwen3 llama qwen2; do
  "$python" "$reference" init "$work/$fam" "$work/$fam-init" 8 16 "$all" > /dev/null 2>&1
done
cp "$source_dir/tests/fixtures/chat_data/lora-sft.jsonl" "$work/sft.jsonl"

# run NAME NPROC FAMILY ARGS...: 3 bf16 steps of a global batch of 2 rows (one per micro-batch),
# one thread per rank; metrics in $work/NAME.jsonl, the run's folder $work/NAME.
run() {
  local name="$1" nproc="$2" fam="$3"
  shift 3
  lora_arguments "$work/$fam" "$work/sft.jsonl" "$work/$fam-init" 8
  local train=("$titan" train)
  [ "$nproc" = 1 ] || train=("$titan" launch --nproc "$nproc" train)
  "${train[@]}" "${lora[@]}" --threads 1 --training.local_batch_size=1 \
    --training.global_batch_size=2 --training.mixed_precision_param=bfloat16 \
    --checkpoint.last_save_in_hf=true --metrics.save_jsonl="$work/$name.jsonl" \
    --job.dump_folder="$work/$name" "$@" > "$work/$name.log" 2>&1 || { cat "$work/$name.log"; exit 1; }
}
# same_losses A B [STEPS]: the two runs' losses bit for bit (steps 1-3, or those listed).
same_losses() {
  "$python" - "$work/$1.jsonl" "$work/$2.jsonl" "${3:-1,2,3}" <<'PY'
import json, sys
steps = [int(s) for s in sys.argv[3].split(",")]
a, b = ({r["step"]: r["loss"] for r in map(json.loads, open(p)) if "loss" in r} for p in sys.argv[1:3])
assert sorted(b) == steps and all(a[s] == b[s] for s in steps), (sys.argv[1:3], a, b)
PY
}
same_adapter() {
  cmp "$work/$1/adapter/adapter_model.safetensors" "$work/$2/adapter/adapter_model.safetensors" \
    || { echo "$1 and $2: the exported adapters differ"; exit 1; }
}
shard=(--parallelism.data_parallel_shard_degree=2)

# ---- FSDP 2 against one process, every family (the MoE's attention adapted only, from PEFT's
# init: its experts' LoRA needs their fp32 weights) ----
for fam in qwen3 llama qwen2 qwen3_moe; do
  targets=()
  [ "$fam" = qwen3_moe ] && targets=(--lora.initial_adapter= --lora.target_modules=q_proj,v_proj)
  run "$fam-one" 1 "$fam" --lora.base_dtype=bfloat16 "${targets[@]}"
  run "$fam-fsdp" 2 "$fam" "${shard[@]}" --lora.base_dtype=bfloat16 "${targets[@]}"
  run "$fam-fsdp-masters" 2 "$fam" "${shard[@]}" --lora.base_dtype=float32 "${targets[@]}"
  grep -q "dp_shard 2 .*the frozen model's parameters sharded" "$work/$fam-fsdp.log" \
    || { echo "not FSDP over 2"; cat "$work/$fam-fsdp.log"; exit 1; }
  grep -q "^frozen model weights from $work/$fam, its matmul weights held only in bf16" \
    "$work/$fam-fsdp.log" || { echo "not a bf16 base"; cat "$work/$fam-fsdp.log"; exit 1; }
  same_losses "$fam-one" "$fam-fsdp"
  same_adapter "$fam-one" "$fam-fsdp"
  same_losses "$fam-fsdp-masters" "$fam-fsdp"
  same_adapter "$fam-fsdp-masters" "$fam-fsdp"
  echo "$fam: FSDP 2 with the bf16 base: losses and adapter bit-identical to one process's bf16 base and to FSDP 2 with fp32 masters"
done

# ---- merged on export: the shards widened, the adapter merged in fp32 ----
run merged-one 1 qwen3 --lora.base_dtype=bfloat16 --lora.merge_on_export=true
run merged-fsdp 2 qwen3 "${shard[@]}" --lora.base_dtype=bfloat16 --lora.merge_on_export=true
cmp "$work/merged-one/hf/model.safetensors" "$work/merged-fsdp/hf/model.safetensors" \
  || { echo "the merged export on FSDP 2 differs from one process's"; exit 1; }
echo "merged export on FSDP 2: byte for byte one process's"

# ---- resume across FSDP 2 -> 1 ----
resume=(--lora.base_dtype=bfloat16 --training.steps=4 --checkpoint.enable=true
        --checkpoint.interval=2 --checkpoint.last_save_model_only=false)
run whole 1 qwen3 "${resume[@]}"
run split 2 qwen3 "${resume[@]}" "${shard[@]}" --training.steps=2
mv "$work/split.jsonl" "$work/split-fsdp.jsonl"  # steps 1-2; the resumed run writes 3-4
run split 1 qwen3 "${resume[@]}"
grep -q "resumed step 2 from" "$work/split.log" || { echo "did not resume"; cat "$work/split.log"; exit 1; }
same_losses whole split 3,4
same_adapter whole split
echo "resumed on one process from FSDP 2's checkpoint: steps 3-4 and the adapter bit-identical to the uninterrupted run"

# ---- HSDP 2 x 2 ----
hsdp=(--parallelism.data_parallel_shard_degree=2 --parallelism.data_parallel_replicate_degree=2
      --training.global_batch_size=4)
run hsdp 4 qwen3 "${hsdp[@]}" --lora.base_dtype=bfloat16
run hsdp-masters 4 qwen3 "${hsdp[@]}" --lora.base_dtype=float32
grep -q "dp_replicate 2 x dp_shard 2" "$work/hsdp.log" || { echo "not HSDP"; cat "$work/hsdp.log"; exit 1; }
same_losses hsdp-masters hsdp
same_adapter hsdp-masters hsdp
echo "HSDP 2 x 2 with the bf16 base: losses and adapter bit-identical to fp32 masters'"

# ---- titan plan ----
lora_arguments "$work/qwen3" "$work/sft.jsonl" "$work/qwen3-init" 8
"$titan" plan "${lora[@]}" --nproc 2 "${shard[@]}" --training.mixed_precision_param=bfloat16 \
  --lora.base_dtype=bfloat16 > "$work/fsdp.plan"
grep -q "the frozen base's matmul weights in bf16 only .* (lora.base_dtype; this rank's shards)" \
  "$work/fsdp.plan" || { echo "the plan does not count the bf16 shards"; cat "$work/fsdp.plan"; exit 1; }
echo "train_lora_base_fsdp: ok"
