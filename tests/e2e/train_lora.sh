#!/usr/bin/env bash
# LoRA fine-tuning ([lora], models/lora.h) through the titan binary, against PEFT:
# - 3 fp32 AdamW steps of a rank-8, alpha-16 adapter on all seven projections, on chat data,
#   started from the same A and B as PEFT (a PEFT adapter folder the reference writes:
#   lora.initial_adapter), equal PEFT's steps (loss within 1e-5 each step) and its trained A and
#   B (1e-6), read back from titan's exported adapter folder by PeftModel.from_pretrained;
#   `titan eval --adapter` on that folder equals PEFT's loss of the model with it (1e-5);
#   tests/reference/lora_reference.py;
# - the same on 2 ranks (replicated data parallel, and FSDP: the frozen model sharded), and for a Qwen2 (q/k/v biases) and a Llama
#   (untied lm_head) folder;
# - under bf16 mixed precision, one step's adapter gradients equal PEFT's under torch.autocast to
#   bf16's rounding (lora_reference.py check-bf16), with dropout too;
# - lora.merge_on_export writes the model with the adapter merged: PEFT's merge_and_unload (1e-6);
# - lora.base_dtype = "bfloat16" (the frozen base held only in bf16, under bf16 compute): 3 steps'
#   losses and the exported adapter bit-identical to the same run with fp32 masters, from an fp32
#   folder, a bf16 one and the Llama one; the merged export (fp32) equals PEFT's
#   merge_and_unload into the base rounded to bf16, its peak titan plan's export_peak to the byte;
#   titan plan counts it; refused without LoRA,
#   under fp32 compute, without a folder to load (under FSDP: train_lora_base_fsdp.sh);
# - the base model folder is unchanged on disk; the frozen weights get no gradients or AdamW
#   state (the memory line's optimizer bytes are the adapter's);
# - lora.dropout 0.1: PEFT's lora_dropout with titan's masks (tests/reference/
#   lora_dropout_reference.py, from ops/lora_dropout.h's formula) equals titan's 3 steps on one
#   process, 2 replicas and FSDP 2; eval --adapter on its export equals PEFT's eval-mode loss; a
#   resumed dropout run equals the uninterrupted one bit for bit;
# - bad inputs stop with one line: an unknown target module, a negative rank, dropout 1, a missing
#   or mismatched adapter folder; an adapter asking for DoRA, or whose tensors do not
#   fit the model (titan eval --adapter).
# The model: train_chat.sh's tiny random Qwen3 (tests/reference/chat_sft_reference.py make).
# usage: train_lora.sh TITAN PYTHON
set -euo pipefail
titan=$(realpath "$1")
python="$2"
source_dir="$(cd "$(dirname "$0")/../.." && pwd)"
. "$(dirname "$0")/tree_sum.sh"
. "$(dirname "$0")/lora_setup.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
reference="$source_dir/tests/reference/lora_reference.py"

"$titan" tokenizer train --vocab-size 512 --out "$work/model" \
  /usr/share/doc/jargon-text/jargon.txt.gz > /dev/null 2>&1
rm "$work/model/titan.json"
"$python" "$source_dir/tests/reference/chat_sft_reference.py" make "$work/model" \
  "$source_dir/tests/fixtures/chat_templates.json" > /dev/null 2>&1
all=q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj
"$python" "$reference" init "$work/model" "$work/init" 8 16 "$all" > /dev/null 2>&1
"$python" "$reference" init "$work/model" "$work/init-r4" 4 16 "$all" > /dev/null 2>&1
cp "$source_dir/tests/fixtures/chat_data/lora-sft.jsonl" "$work/sft.jsonl"
before=$(tree_sum "$work/model")

lora_arguments "$work/model" "$work/sft.jsonl" "$work/init" 8

# ---- one LoRA run against PEFT ----
"$titan" train "${common[@]}" --checkpoint.last_save_in_hf=true \
  --metrics.save_jsonl="$work/lora-metrics.jsonl" --job.dump_folder="$work/lora" > "$work/lora.log"
grep -q "^LoRA: rank 8, alpha 16 (scaling 2) on $all of every layer: [0-9]* trainable parameters" \
  "$work/lora.log" || { echo "the log does not say what LoRA trains"; cat "$work/lora.log"; exit 1; }
grep -q "^exported the LoRA adapter as a PEFT adapter folder: $work/lora/adapter" "$work/lora.log" \
  || { echo "no adapter exported"; cat "$work/lora.log"; exit 1; }
"$titan" eval --model "$work/model" --adapter "$work/lora/adapter" --data "$work/sft.jsonl" \
  --chat --seq-len 96 --batch-size 2 --threads 2 > "$work/eval.log" 2> /dev/null
evaluated=$(awk '{print $2}' "$work/eval.log")
"$python" "$reference" check "$work/model" "$work/sft.jsonl" "$work/init" \
  "$work/lora-metrics.jsonl" "$work/lora/adapter" 3 2 1e-3 1e-4 "$evaluated" \
  > "$work/reference.log" 2>&1 || { cat "$work/reference.log"; exit 1; }
grep -v "Loading weights" "$work/reference.log"

# ---- the other families: Qwen2 (q/k/v biases) and Llama (untied lm_head), one process ----
for fam in qwen2 llama; do
  mkdir -p "$work/$fam"
  cp "$work/model"/tokenizer*.json "$work/$fam/"
  "$python" "$reference" family "$work/model" "$work/$fam" "$fam" > /dev/null 2>&1
  "$python" "$reference" init "$work/$fam" "$work/$fam-init" 8 16 "$all" > /dev/null 2>&1
  "$titan" train "${common[@]}" --model.hf_assets_path="$work/$fam" \
    --checkpoint.initial_load_path="$work/$fam" --lora.initial_adapter="$work/$fam-init" \
    --checkpoint.last_save_in_hf=true --metrics.save_jsonl="$work/$fam-metrics.jsonl" \
    --job.dump_folder="$work/$fam-lora" > "$work/$fam.log" 2>&1 || { cat "$work/$fam.log"; exit 1; }
  "$python" "$reference" check "$work/$fam" "$work/sft.jsonl" "$work/$fam-init" \
    "$work/$fam-metrics.jsonl" "$work/$fam-lora/adapter" 3 2 1e-3 1e-4 > "$work/reference-$fam.log" 2>&1 \
    || { cat "$work/reference-$fam.log"; exit 1; }
  grep -E "^(adapter|LoRA)" "$work/reference-$fam.log" | sed "s/^/$fam: /"
done

# ---- 2 ranks, replicated: the same steps ----
. "$(dirname "$0")/mpi_env.sh"
"$titan" launch --nproc 2 train "${lora[@]}" --threads 1 --training.local_batch_size=1 \
  --training.global_batch_size=4 --parallelism.data_parallel_shard_degree=1 \
  --parallelism.data_parallel_replicate_degree=2 --checkpoint.last_save_in_hf=true \
  --metrics.save_jsonl="$work/ddp-metrics.jsonl" --job.dump_folder="$work/ddp" > "$work/ddp.log" 2>&1 \
  || { cat "$work/ddp.log"; exit 1; }
grep -q "dp_replicate 2" "$work/ddp.log" || { echo "not 2 replicas"; cat "$work/ddp.log"; exit 1; }
"$python" "$reference" check "$work/model" "$work/sft.jsonl" "$work/init" \
  "$work/ddp-metrics.jsonl" "$work/ddp/adapter" 3 2 1e-3 1e-4 > "$work/reference-ddp.log" 2>&1 \
  || { cat "$work/reference-ddp.log"; exit 1; }
grep -E "^(adapter|LoRA)" "$work/reference-ddp.log" | sed 's/^/2 ranks: /'

# ---- lora.dropout: PEFT's lora_dropout with the masks titan draws (lora_dropout_reference.py
# computes them from the formula ops/lora_dropout.h documents): one process, 2 replicas and FSDP 2
# each equal PEFT's 3 steps and trained adapter; `titan eval --adapter` on the export equals
# PEFT's eval-mode loss (no dropout); the check fails with another seed's masks. The masks are
# keyed by a row's place in the global batch, and the loader shuffles the conversations (by
# training.seed), an order the reference does not reproduce: the batch holds one conversation
# four times, so every order gives the same rows ----
for i in 1 2 3 4; do sed -n 4p "$work/sft.jsonl"; done > "$work/drop.jsonl"
drop=(--lora.dropout=0.1 --training.seed=5 --training.dataset_path="$work/drop.jsonl")
"$titan" train "${common[@]}" "${drop[@]}" --checkpoint.last_save_in_hf=true \
  --metrics.save_jsonl="$work/drop-metrics.jsonl" --job.dump_folder="$work/drop" > "$work/drop.log" 2>&1 \
  || { cat "$work/drop.log"; exit 1; }
grep -q '"lora_dropout": 0.1' "$work/drop/adapter/adapter_config.json" \
  || { echo "the adapter's config does not say lora_dropout 0.1"; exit 1; }
"$titan" eval --model "$work/model" --adapter "$work/drop/adapter" --data "$work/drop.jsonl" \
  --chat --seq-len 96 --batch-size 2 --threads 2 > "$work/drop-eval.log" 2> /dev/null
evaluated=$(awk '{print $2}' "$work/drop-eval.log")
"$python" "$reference" check "$work/model" "$work/drop.jsonl" "$work/init" "$work/drop-metrics.jsonl" \
  "$work/drop/adapter" 3 2 1e-3 1e-4 "$evaluated" 0.1 5 > "$work/reference-drop.log" 2>&1 \
  || { cat "$work/reference-drop.log"; exit 1; }
grep -E "^(adapter|LoRA|titan eval)" "$work/reference-drop.log" | sed 's/^/dropout 0.1: /'
if "$python" "$reference" check "$work/model" "$work/drop.jsonl" "$work/init" \
  "$work/drop-metrics.jsonl" "$work/drop/adapter" 3 2 1e-3 1e-4 - 0.1 6 > "$work/reference-seed.log" 2>&1; then
  echo "PEFT with another seed's masks equals titan's dropout run: the check sees no mask"; exit 1
fi
grep -q "^FAILED: step 1 loss" "$work/reference-seed.log" \
  || { echo "the other seed's check failed otherwise:"; cat "$work/reference-seed.log"; exit 1; }
for layout in replicate shard; do
  "$titan" launch --nproc 2 train "${lora[@]}" "${drop[@]}" --threads 1 --training.local_batch_size=1 \
    --training.global_batch_size=4 --parallelism.data_parallel_shard_degree=$([ $layout = shard ] && echo 2 || echo 1) \
    --parallelism.data_parallel_replicate_degree=$([ $layout = shard ] && echo 1 || echo 2) \
    --checkpoint.last_save_in_hf=true --metrics.save_jsonl="$work/drop-$layout.jsonl" \
    --job.dump_folder="$work/drop-$layout" > "$work/drop-$layout.log" 2>&1 \
    || { cat "$work/drop-$layout.log"; exit 1; }
  "$python" "$reference" check "$work/model" "$work/drop.jsonl" "$work/init" "$work/drop-$layout.jsonl" \
    "$work/drop-$layout/adapter" 3 2 1e-3 1e-4 - 0.1 5 > "$work/reference-drop-$layout.log" 2>&1 \
    || { cat "$work/reference-drop-$layout.log"; exit 1; }
  grep -E "^(adapter|LoRA)" "$work/reference-drop-$layout.log" | sed "s/^/dropout 0.1, 2 ranks ($layout): /"
done

# ---- bf16 mixed precision: one step's gradients, read back from the adapter it moved (large
# eps, no weight decay: the move is g / (|g| + eps)), against PEFT's under autocast ----
"$titan" train "${common[@]}" --training.mixed_precision_param=bfloat16 --training.steps=1 \
  --optimizer.lr=0.1 --optimizer.eps=1 --optimizer.weight_decay=0 --checkpoint.last_save_in_hf=true \
  --job.dump_folder="$work/bf16" > "$work/bf16.log" 2>&1 || { cat "$work/bf16.log"; exit 1; }
grep -q "^mixed precision: " "$work/bf16.log" || { echo "not a bf16 run"; cat "$work/bf16.log"; exit 1; }
"$python" "$reference" check-bf16 "$work/model" "$work/sft.jsonl" "$work/init" "$work/bf16/adapter" \
  0.1 1 > "$work/reference-bf16.log" 2>&1 || { cat "$work/reference-bf16.log"; exit 1; }
grep "^bf16 LoRA" "$work/reference-bf16.log"
# The same with dropout: PEFT's two runs drop out with titan's masks of step 1.
"$titan" train "${common[@]}" "${drop[@]}" --training.mixed_precision_param=bfloat16 --training.steps=1 \
  --optimizer.lr=0.1 --optimizer.eps=1 --optimizer.weight_decay=0 --checkpoint.last_save_in_hf=true \
  --job.dump_folder="$work/bf16-drop" > "$work/bf16-drop.log" 2>&1 || { cat "$work/bf16-drop.log"; exit 1; }
"$python" "$reference" check-bf16 "$work/model" "$work/drop.jsonl" "$work/init" "$work/bf16-drop/adapter" \
  0.1 1 1.0 0.1 5 > "$work/reference-bf16-drop.log" 2>&1 || { cat "$work/reference-bf16-drop.log"; exit 1; }
grep "^bf16 LoRA" "$work/reference-bf16-drop.log" | sed 's/^/dropout 0.1: /'

# ---- lora.base_dtype = "bfloat16": the frozen base held only in bf16. Its forward reads the
# same bf16 values the fp32 masters' copies hold, so 3 steps give today's bf16 LoRA run's losses
# and exported adapter bit for bit: from an fp32 folder (rounded once at load), a bf16 folder
# (its bits as stored), and the Llama folder (an untied lm_head, held in bf16 too) ----
"$python" - "$work/model" "$work/model-bf16" "$work/model-rounded" <<'PY'
import shutil, sys, torch
from transformers import AutoModelForCausalLM
src, as_bf16, rounded = sys.argv[1:]
model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
model.to(torch.bfloat16).save_pretrained(as_bf16)
# The base a bf16-only LoRA run holds: the matmul weights rounded to bf16, stored in fp32.
model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
with torch.no_grad():
    for name, p in model.named_parameters():
        if name.endswith("_proj.weight") or name == "lm_head.weight":
            p.copy_(p.to(torch.bfloat16).float())
model.save_pretrained(rounded)
for out in (as_bf16, rounded):
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(f"{src}/{f}", out)
PY
for base in model model-bf16 llama; do
  for dtype in float32 bfloat16; do
    "$titan" train "${common[@]}" --model.hf_assets_path="$work/$base" \
      --checkpoint.initial_load_path="$work/$base" \
      --lora.initial_adapter="$work/$([ "$base" = llama ] && echo llama-init || echo init)" \
      --training.mixed_precision_param=bfloat16 --lora.base_dtype="$dtype" \
      --checkpoint.last_save_in_hf=true --metrics.save_jsonl="$work/base-$base-$dtype.jsonl" \
      --job.dump_folder="$work/base-$base-$dtype" > "$work/base-$base-$dtype.log" 2>&1 \
      || { cat "$work/base-$base-$dtype.log"; exit 1; }
  done
  grep -q "^frozen model weights from $work/$base, its matmul weights held only in bf16" \
    "$work/base-$base-bfloat16.log" || { echo "not a bf16 base"; cat "$work/base-$base-bfloat16.log"; exit 1; }
  "$python" - "$work/base-$base-float32.jsonl" "$work/base-$base-bfloat16.jsonl" "$base" <<'PY'
import json, sys
masters, held = ({r["step"]: r["loss"] for r in map(json.loads, open(p)) if "loss" in r} for p in sys.argv[1:3])
assert sorted(held) == [1, 2, 3] and held == masters, (masters, held)
PY
  cmp "$work/base-$base-float32/adapter/adapter_model.safetensors" \
    "$work/base-$base-bfloat16/adapter/adapter_model.safetensors" \
    || { echo "$base: the bf16 base's adapter differs from the fp32 masters' one"; exit 1; }
  echo "lora.base_dtype = bfloat16 on $base: losses and adapter bit-identical to the fp32 masters' bf16 run"
done
# Merged on export: the bf16 base widened, the adapter's update added in fp32, an fp32 folder;
# PEFT's merge_and_unload of that adapter into the rounded base gives it.
"$titan" train "${common[@]}" --training.mixed_precision_param=bfloat16 --lora.base_dtype=bfloat16 \
  --checkpoint.last_save_in_hf=true --lora.merge_on_export=true --job.dump_folder="$work/base-merged" \
  > "$work/base-merged.log" 2>&1 || { cat "$work/base-merged.log"; exit 1; }
"$python" -c 'import json, sys
from safetensors import safe_open
f = safe_open(sys.argv[1] + "/model.safetensors", "pt")
dtypes = {str(f.get_slice(k).get_dtype()) for k in f.keys()}
assert dtypes == {"F32"}, dtypes' "$work/base-merged/hf"
"$python" "$reference" merged "$work/model-rounded" "$work/base-model-bfloat16/adapter" \
  "$work/base-merged/hf" 2> /dev/null | grep -v "Loading weights" | sed 's/^/bf16 base: /'
"$titan" plan "${lora[@]}" --training.mixed_precision_param=bfloat16 --lora.base_dtype=bfloat16 \
  > "$work/base.plan"
grep -q "the frozen base's matmul weights in bf16 only" "$work/base.plan" \
  || { echo "the plan does not count a bf16 base"; cat "$work/base.plan"; exit 1; }
# The merged export's peak (the base widened to fp32 masters, then written) is titan plan's.
"$titan" plan "${common[@]}" --training.mixed_precision_param=bfloat16 --lora.base_dtype=bfloat16 \
  --checkpoint.last_save_in_hf=true --lora.merge_on_export=true --json > "$work/base-merged.plan"
"$python" - "$work/base-merged.plan" "$work/base-merged.log" <<'PY'
import json, re, sys
memory = json.load(open(sys.argv[1]))["memory_bytes"]
measured = int(re.search(r"the export's peak memory on rank 0: (\d+) bytes", open(sys.argv[2]).read()).group(1))
assert memory["export_gather"] > 0 and memory["export_peak"] == measured, (memory, measured)
print(f"bf16 base: the merged export's peak {measured} bytes, as titan plan predicts (widened masters "
      f"{memory['export_gather']} bytes)")
PY
# Where it cannot hold: one line each.
base_bad=("${common[@]}" --training.steps=1 --checkpoint.last_save_in_hf=false --lora.base_dtype=bfloat16)
expect_refusal base-no-lora "^titan train: error: lora.base_dtype = \"bfloat16\" holds a LoRA run's frozen base in bf16: set lora.rank > 0" \
  "$titan" train "${base_bad[@]}" --training.mixed_precision_param=bfloat16 --lora.rank=0 \
  --lora.initial_adapter= --job.dump_folder="$work/bad-base1"
expect_refusal base-fp32 "^titan train: error: lora.base_dtype = \"bfloat16\" holds the frozen base as the bf16 copies bf16 matmuls read: set training.mixed_precision_param = \"bfloat16\"" \
  "$titan" train "${base_bad[@]}" --job.dump_folder="$work/bad-base2"
expect_refusal base-random "^titan train: error: lora.base_dtype = \"bfloat16\" loads the frozen base from a Hugging Face folder into bf16: set checkpoint.initial_load_path" \
  "$titan" train "${base_bad[@]}" --training.mixed_precision_param=bfloat16 \
  --checkpoint.initial_load_path= --job.dump_folder="$work/bad-base3"
expect_refusal base-dtype "^titan train: error: lora.base_dtype 'float16' is not one of float32, bfloat16$" \
  "$titan" train "${common[@]}" --lora.base_dtype=float16 --job.dump_folder="$work/bad-base4"

# ---- 2 ranks, FSDP: the frozen model sharded, the adapter replicated; the same steps, and the
# merged export (gathered from the shards) equals PEFT's merge of that run's adapter ----
"$titan" launch --nproc 2 train "${lora[@]}" --threads 1 --training.local_batch_size=1 \
  --training.global_batch_size=4 --parallelism.data_parallel_shard_degree=2 \
  --checkpoint.last_save_in_hf=true --metrics.save_jsonl="$work/fsdp-metrics.jsonl" \
  --job.dump_folder="$work/fsdp" > "$work/fsdp.log" 2>&1 || { cat "$work/fsdp.log"; exit 1; }
grep -q "dp_shard 2 .*the frozen model's parameters sharded" "$work/fsdp.log" \
  || { echo "not FSDP over 2"; cat "$work/fsdp.log"; exit 1; }
"$python" "$reference" check "$work/model" "$work/sft.jsonl" "$work/init" \
  "$work/fsdp-metrics.jsonl" "$work/fsdp/adapter" 3 2 1e-3 1e-4 > "$work/reference-fsdp.log" 2>&1 \
  || { cat "$work/reference-fsdp.log"; exit 1; }
grep -E "^(adapter|LoRA)" "$work/reference-fsdp.log" | sed 's/^/FSDP 2: /'
"$titan" launch --nproc 2 train "${lora[@]}" --threads 1 --training.local_batch_size=1 \
  --training.global_batch_size=4 --parallelism.data_parallel_shard_degree=2 \
  --checkpoint.last_save_in_hf=true --lora.merge_on_export=true --job.dump_folder="$work/fsdp-merged" \
  > "$work/fsdp-merged.log" 2>&1 || { cat "$work/fsdp-merged.log"; exit 1; }
"$python" "$reference" merged "$work/model" "$work/fsdp/adapter" "$work/fsdp-merged/hf" 2> /dev/null \
  | grep -v "Loading weights" | sed 's/^/FSDP 2: /'
"$titan" plan "${lora[@]}" --nproc 2 --parallelism.data_parallel_shard_degree=2 > "$work/fsdp.plan"
grep -q "saved by LoRA" "$work/fsdp.plan" || { echo "no LoRA plan under FSDP"; cat "$work/fsdp.plan"; exit 1; }

# ---- merged on export: PEFT's merge_and_unload ----
"$titan" train "${common[@]}" --checkpoint.last_save_in_hf=true --lora.merge_on_export=true \
  --job.dump_folder="$work/merged" > "$work/merged.log"
grep -q "^exported the model as a Hugging Face folder, the LoRA adapter merged into its weights: $work/merged/hf (" \
  "$work/merged.log" || { echo "no merged export"; cat "$work/merged.log"; exit 1; }
"$python" "$reference" merged "$work/model" "$work/lora/adapter" "$work/merged/hf" 2> /dev/null \
  | grep -v "Loading weights"

# generate --adapter merges at load what merge_on_export merged: the same greedy tokens.
"$titan" generate --model "$work/model" --adapter "$work/lora/adapter" --prompt "What is a kludge?" \
  --greedy --max-new-tokens 12 --threads 2 > "$work/adapter.txt" 2> /dev/null
"$titan" generate --model "$work/merged/hf" --prompt "What is a kludge?" --greedy \
  --max-new-tokens 12 --threads 2 > "$work/merged.txt" 2> /dev/null
[ -s "$work/adapter.txt" ] && cmp -s "$work/adapter.txt" "$work/merged.txt" \
  || { echo "generate --adapter differs from the merged export:"; cat "$work/adapter.txt" "$work/merged.txt"; exit 1; }
echo "generate --adapter equals generate on the merged export"
[ "$(tree_sum "$work/model")" = "$before" ] || { echo "the base model folder changed"; exit 1; }
echo "the base model folder is unchanged"

# ---- bad inputs: one line each ----
bad=("${common[@]}" --training.steps=1 --checkpoint.last_save_in_hf=false)
expect_refusal target "^titan train: error: lora.target_modules: 'qkv_proj' is not a LoRA target module \(one of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, comma-separated\)$" \
  "$titan" train "${bad[@]}" --lora.target_modules=q_proj,qkv_proj --job.dump_folder="$work/bad1"
expect_refusal rank "^titan train: error: lora.rank -1 must not be negative \(0 turns LoRA off\)$" \
  "$titan" train "${bad[@]}" --lora.rank=-1 --job.dump_folder="$work/bad2"
expect_refusal dropout "^titan train: error: lora.dropout 1 must be at least 0 and below 1 \(the probability of dropping an input\)$" \
  "$titan" train "${bad[@]}" --lora.dropout=1 --job.dump_folder="$work/bad3"
expect_refusal missing "^titan train: error: $work/none: no such adapter folder$" \
  "$titan" train "${bad[@]}" --lora.initial_adapter="$work/none" --job.dump_folder="$work/bad4"
expect_refusal mismatched "^titan train: error: lora.initial_adapter $work/init-r4 is r = 4, lora_alpha = 16 on 7 modules; the config asks for lora.rank = 8, lora.alpha = 16 on 7$" \
  "$titan" train "${bad[@]}" --lora.initial_adapter="$work/init-r4" --job.dump_folder="$work/bad5"
expect_refusal eval-missing "^titan eval: error: $work/none: no such adapter folder$" \
  "$titan" eval --model "$work/model" --adapter "$work/none" --data "$work/sft.jsonl" --chat \
  --seq-len 96 --threads 2

# ---- resuming mid-run: the checkpoint holds the adapter (and its AdamW state) only, the frozen
# model is loaded again; the losses equal the uninterrupted run's bit for bit, with dropout too
# (its masks are keyed by the step: the resumed steps draw the uninterrupted run's) ----
for p in 0 0.1; do
  resume=("${common[@]}" --lora.initial_adapter= --training.steps=4 --checkpoint.enable=true
          --checkpoint.interval=2 --checkpoint.last_save_model_only=false
          --checkpoint.last_save_in_hf=false --lora.dropout=$p)
  "$titan" train "${resume[@]}" --job.dump_folder="$work/whole$p" --metrics.save_jsonl="$work/whole$p.jsonl" > /dev/null
  "$titan" train "${resume[@]}" --training.steps=2 --job.dump_folder="$work/split$p" > /dev/null
  "$titan" train "${resume[@]}" --job.dump_folder="$work/split$p" --metrics.save_jsonl="$work/split$p.jsonl" \
    > "$work/split$p.log"
  grep -q "resumed step 2 from" "$work/split$p.log" || { echo "did not resume"; cat "$work/split$p.log"; exit 1; }
  "$python" - "$work/whole$p.jsonl" "$work/split$p.jsonl" "$p" <<'PY'
import json, sys
whole, split = ({r["step"]: r["loss"] for r in map(json.loads, open(p)) if "loss" in r} for p in sys.argv[1:3])
assert sorted(split) == [3, 4] and all(split[s] == whole[s] for s in split), (whole, split)
print(f"resumed LoRA run (lora.dropout {sys.argv[3]}): steps 3-4 equal the uninterrupted run's bit for bit")
PY
done
# Adapter folders titan does not compute, or that do not fit the model: one line naming the key
# or the tensor.
for bad in dora misfit; do cp -r "$work/init" "$work/$bad"; done
"$python" - "$work" <<'PY'
import json, sys
work = sys.argv[1]
for name, change in (("dora", {"use_dora": True}), ("misfit", {"r": 4})):
    path = f"{work}/{name}/adapter_config.json"
    config = json.load(open(path))
    config.update(change)
    json.dump(config, open(path, "w"))
PY
expect_refusal dora "^titan eval: error: $work/dora/adapter_config.json: \"use_dora\" is true \(DoRA is not supported\)$" \
  "$titan" eval --model "$work/model" --adapter "$work/dora" --data "$work/sft.jsonl" --chat \
  --seq-len 96 --threads 2
expect_refusal misfit "^titan eval: error: $work/misfit/adapter_model.safetensors: base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight has shape \[8, 64\], the model's adapter \[4, 64\]$" \
  "$titan" eval --model "$work/model" --adapter "$work/misfit" --data "$work/sft.jsonl" --chat \
  --seq-len 96 --threads 2
echo "train_lora: ok"
