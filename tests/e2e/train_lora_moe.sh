#!/usr/bin/env bash
# LoRA on a Qwen3-MoE model ([lora], models/lora.h ExpertLora), through the titan binary, against
# PEFT 0.21 on Transformers 5, which turns target_modules' gate_proj/up_proj/down_proj into the
# fused experts' target_parameters (gate_up_proj at rank 2r and alpha 2 alpha, down_proj) and
# leaves the dense (mlp_only_layers) layer's MLP unadapted:
# - 3 fp32 AdamW steps of a rank-4, alpha-16 adapter on all seven names, on chat data, started
#   from the same A and B as PEFT (a PEFT adapter folder the reference writes:
#   lora.initial_adapter), equal PEFT's steps (loss within 1e-5 each step) and its trained A and B
#   (1e-6), read back from titan's exported adapter folder by PeftModel.from_pretrained;
#   `titan eval --adapter` on that folder equals PEFT's loss of the model with it (1e-5);
# - the same on 2 ranks under FSDP (the frozen model, experts included, sharded);
# - lora.merge_on_export writes the model with the adapter merged: PEFT's merge_and_unload (1e-6);
#   `titan generate --adapter` gives the merged export's greedy tokens;
# - the base model folder is unchanged on disk;
# - under bf16 mixed precision, one step's adapter gradients equal PEFT's under torch.autocast to
#   bf16's rounding (lora_reference.py check-bf16);
# - lora.base_dtype = "bfloat16" with the attention adapted only: the experts (and every matmul
#   weight) held only in bf16, 3 steps' losses and the adapter bit-identical to the run with fp32
#   masters;
# - the bf16 step on 2 ranks under FSDP (the adapted experts gathered in fp32): the same check;
# - refusals: gate_proj without up_proj (PEFT refuses it too); lora.base_dtype = "bfloat16" with the experts adapted (titan train and titan plan);
#   lora.dropout with the experts adapted (PEFT refuses it too; the attention alone trains).
# The model: lora_reference.py family qwen3_moe (3 layers, layer 0 dense).
# usage: train_lora_moe.sh TITAN PYTHON
set -euo pipefail
titan=$(realpath "$1")
python="$2"
source_dir="$(cd "$(dirname "$0")/../.." && pwd)"
. "$(dirname "$0")/tree_sum.sh"
. "$(dirname "$0")/lora_setup.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
reference="$source_dir/tests/reference/lora_reference.py"

"$titan" tokenizer train --vocab-size 512 --out "$work/source" \
  /usr/share/doc/jargon-text/jargon.txt.gz > /dev/null 2>&1
rm "$work/source/titan.json"
"$python" "$source_dir/tests/reference/chat_sft_reference.py" make "$work/source" \
  "$source_dir/tests/fixtures/chat_templates.json" > /dev/null 2>&1
mkdir -p "$work/model"
cp "$work/source"/tokenizer*.json "$work/model/"
"$python" "$reference" family "$work/source" "$work/model" qwen3_moe > /dev/null 2>&1
all=q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj
"$python" "$reference" init "$work/model" "$work/init" 4 16 "$all" > /dev/null 2>&1
"$python" - "$work" <<'PY'
import json, sys
work = sys.argv[1]
config = json.load(open(f"{work}/init/adapter_config.json"))
# What PEFT wrote, which titan reads back: the experts named as parameters.
assert sorted(config["target_modules"]) == ["k_proj", "o_proj", "q_proj", "v_proj"], config
assert sorted(config["target_parameters"]) == ["down_proj", "gate_up_proj"], config
PY
cp "$source_dir/tests/fixtures/chat_data/lora-sft.jsonl" "$work/sft.jsonl"
before=$(tree_sum "$work/model")

lora_arguments "$work/model" "$work/sft.jsonl" "$work/init" 4

# ---- one LoRA run against PEFT ----
"$titan" train "${common[@]}" --checkpoint.last_save_in_hf=true \
  --metrics.save_jsonl="$work/lora-metrics.jsonl" --job.dump_folder="$work/lora" > "$work/lora.log" 2>&1 \
  || { cat "$work/lora.log"; exit 1; }
grep -q "^LoRA on the experts of 2 sparse layers, as PEFT's target_parameters: gate_up_proj rank 8, down_proj rank 4" \
  "$work/lora.log" || { echo "the log does not say what LoRA trains on the experts"; cat "$work/lora.log"; exit 1; }
grep -q "^exported the LoRA adapter as a PEFT adapter folder: $work/lora/adapter" "$work/lora.log" \
  || { echo "no adapter exported"; cat "$work/lora.log"; exit 1; }
"$titan" eval --model "$work/model" --adapter "$work/lora/adapter" --data "$work/sft.jsonl" \
  --chat --seq-len 96 --batch-size 2 --threads 2 > "$work/eval.log" 2> /dev/null
evaluated=$(awk '{print $2}' "$work/eval.log")
"$python" "$reference" check "$work/model" "$work/sft.jsonl" "$work/init" \
  "$work/lora-metrics.jsonl" "$work/lora/adapter" 3 2 1e-3 1e-4 "$evaluated" \
  > "$work/reference.log" 2>&1 || { cat "$work/reference.log"; exit 1; }
grep -v "Loading weights" "$work/reference.log"

# ---- merged on export: PEFT's merge_and_unload; generate --adapter equals it ----
"$titan" train "${common[@]}" --checkpoint.last_save_in_hf=true --lora.merge_on_export=true \
  --job.dump_folder="$work/merged" > "$work/merged.log" 2>&1 || { cat "$work/merged.log"; exit 1; }
"$python" "$reference" merged "$work/model" "$work/lora/adapter" "$work/merged/hf" 2> /dev/null \
  | grep -v "Loading weights"
"$titan" generate --model "$work/model" --adapter "$work/lora/adapter" --prompt "What is a kludge?" \
  --greedy --max-new-tokens 12 --threads 2 > "$work/adapter.txt" 2> /dev/null
"$titan" generate --model "$work/merged/hf" --prompt "What is a kludge?" --greedy \
  --max-new-tokens 12 --threads 2 > "$work/merged.txt" 2> /dev/null
[ -s "$work/adapter.txt" ] && cmp -s "$work/adapter.txt" "$work/merged.txt" \
  || { echo "generate --adapter differs from the merged export:"; cat "$work/adapter.txt" "$work/merged.txt"; exit 1; }
echo "generate --adapter equals generate on the merged export"

# ---- bf16 mixed precision: one step's gradients, read back from the adapter it moved (large
# eps, no weight decay, no clipping: the move is g / (|g| + eps)), against PEFT's under autocast (which rounds
# PEFT's merged fp32 expert weights for its GEMMs, as titan rounds its merged weights) ----
"$titan" train "${common[@]}" --training.mixed_precision_param=bfloat16 --training.steps=1 \
  --optimizer.lr=0.1 --optimizer.eps=1 --optimizer.weight_decay=0 --training.max_norm=100 \
  --checkpoint.last_save_in_hf=true --job.dump_folder="$work/bf16" > "$work/bf16.log" 2>&1 || { cat "$work/bf16.log"; exit 1; }
grep -q "^mixed precision: " "$work/bf16.log" || { echo "not a bf16 run"; cat "$work/bf16.log"; exit 1; }
"$python" "$reference" check-bf16 "$work/model" "$work/sft.jsonl" "$work/init" "$work/bf16/adapter" \
  0.1 1 100 > "$work/reference-bf16.log" 2>&1 || { cat "$work/reference-bf16.log"; exit 1; }
grep "^bf16 LoRA" "$work/reference-bf16.log"

# ---- lora.base_dtype = "bfloat16" on the MoE, the attention adapted only: the frozen experts read
# the same bf16 values as the fp32 masters' copies, so the same losses and adapter bit for bit ----
for dtype in float32 bfloat16; do
  "$titan" train "${common[@]}" --lora.initial_adapter= --lora.target_modules=q_proj,v_proj \
    --training.mixed_precision_param=bfloat16 --lora.base_dtype="$dtype" \
    --checkpoint.last_save_in_hf=true --metrics.save_jsonl="$work/base-$dtype.jsonl" \
    --job.dump_folder="$work/base-$dtype" > "$work/base-$dtype.log" 2>&1 \
    || { cat "$work/base-$dtype.log"; exit 1; }
done
grep -q "^frozen model weights from $work/model, its matmul weights held only in bf16" \
  "$work/base-bfloat16.log" || { echo "not a bf16 base"; cat "$work/base-bfloat16.log"; exit 1; }
"$python" - "$work/base-float32.jsonl" "$work/base-bfloat16.jsonl" <<'PY'
import json, sys
masters, held = ({r["step"]: r["loss"] for r in map(json.loads, open(p)) if "loss" in r} for p in sys.argv[1:3])
assert sorted(held) == [1, 2, 3] and held == masters, (masters, held)
PY
cmp "$work/base-float32/adapter/adapter_model.safetensors" \
  "$work/base-bfloat16/adapter/adapter_model.safetensors" \
  || { echo "the bf16 base's adapter differs from the fp32 masters' one"; exit 1; }
echo "lora.base_dtype = bfloat16, attention only: losses and adapter bit-identical to the fp32 masters' bf16 run"

# ---- 2 ranks, FSDP: the frozen model (experts included) sharded; the same steps ----
. "$(dirname "$0")/mpi_env.sh"
"$titan" launch --nproc 2 train "${lora[@]}" --threads 1 --training.local_batch_size=1 \
  --training.global_batch_size=4 --parallelism.data_parallel_shard_degree=2 \
  --checkpoint.last_save_in_hf=true --metrics.save_jsonl="$work/fsdp-metrics.jsonl" \
  --job.dump_folder="$work/fsdp" > "$work/fsdp.log" 2>&1 || { cat "$work/fsdp.log"; exit 1; }
"$python" "$reference" check "$work/model" "$work/sft.jsonl" "$work/init" \
  "$work/fsdp-metrics.jsonl" "$work/fsdp/adapter" 3 2 1e-3 1e-4 > "$work/reference-fsdp.log" 2>&1 \
  || { cat "$work/reference-fsdp.log"; exit 1; }
grep -E "^(adapter|LoRA)" "$work/reference-fsdp.log" | sed 's/^/FSDP 2: /'
"$titan" plan "${lora[@]}" --nproc 2 --parallelism.data_parallel_shard_degree=2 > "$work/fsdp.plan"
grep -q "saved by LoRA" "$work/fsdp.plan" || { echo "no LoRA plan under FSDP"; cat "$work/fsdp.plan"; exit 1; }
# bf16 under FSDP: the adapted experts gathered in fp32 (their merge reads the masters), the other
# matmul weights in bf16; the one-process bf16 step's check against PEFT under autocast, and the
# adapter it trained against that step's.
"$titan" launch --nproc 2 train "${lora[@]}" --threads 1 --training.local_batch_size=1 \
  --training.global_batch_size=4 --parallelism.data_parallel_shard_degree=2 \
  --training.mixed_precision_param=bfloat16 --training.steps=1 --optimizer.lr=0.1 \
  --optimizer.eps=1 --optimizer.weight_decay=0 --training.max_norm=100 \
  --checkpoint.last_save_in_hf=true --job.dump_folder="$work/bf16-fsdp" > "$work/bf16-fsdp.log" 2>&1 \
  || { cat "$work/bf16-fsdp.log"; exit 1; }
"$python" "$reference" check-bf16 "$work/model" "$work/sft.jsonl" "$work/init" "$work/bf16-fsdp/adapter" \
  0.1 1 100 > "$work/reference-bf16-fsdp.log" 2>&1 || { cat "$work/reference-bf16-fsdp.log"; exit 1; }
grep "^bf16 LoRA" "$work/reference-bf16-fsdp.log" | sed 's/^/FSDP 2: /'
"$python" - "$work/bf16/adapter" "$work/bf16-fsdp/adapter" <<'PY'
import sys
from safetensors.torch import load_file
one, two = (load_file(f"{d}/adapter_model.safetensors") for d in sys.argv[1:])
assert sorted(one) == sorted(two)
worst = max(float((one[k] - two[k]).abs().max()) for k in one)
print(f"FSDP 2 bf16: the adapter after one step differs from one process's by {worst:.3g} at most")
PY

[ "$(tree_sum "$work/model")" = "$before" ] || { echo "the base model folder changed"; exit 1; }
echo "the base model folder is unchanged"

# ---- refusals: one line each ----
bad=("${common[@]}" --training.steps=1 --checkpoint.last_save_in_hf=false --lora.initial_adapter=)
expect_refusal gate-alone "^titan train: error: lora.target_modules: gate_proj without up_proj on a MoE model \(PEFT adapts the experts' fused gate_up_proj: name both or neither\)$" \
  "$titan" train "${bad[@]}" --lora.target_modules=q_proj,gate_proj --job.dump_folder="$work/bad1"
# A bf16-only base with the experts adapted: their LoRA merges fp32 expert weights it does not hold.
base_refusal="lora.base_dtype = \"bfloat16\" holds no fp32 expert weights, which the experts' LoRA \(gate_proj, up_proj, down_proj on a MoE model\) merges at each step: use lora.base_dtype = \"float32\", or adapt the attention only$"
expect_refusal base-experts "^titan train: error: $base_refusal" \
  "$titan" train "${bad[@]}" --training.mixed_precision_param=bfloat16 --lora.base_dtype=bfloat16 \
  --job.dump_folder="$work/bad3"
expect_refusal base-experts-plan "^titan plan: error: $base_refusal" \
  "$titan" plan "${lora[@]}" --training.mixed_precision_param=bfloat16 --lora.base_dtype=bfloat16
# lora.dropout with the experts adapted: PEFT's ParamWrapper refuses it (it merges the update into
# the weight: no input to drop out), and so does titan; the attention alone may drop out.
"$python" - "$work/model" <<'PY'
import sys, torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32)
targets = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj".split(",")
try:
    get_peft_model(model, LoraConfig(r=4, lora_alpha=16, lora_dropout=0.05, target_modules=targets))
except ValueError as e:
    assert "lora_dropout" in str(e), e
    print(f"PEFT refuses lora_dropout on the experts: {e}")
else:
    sys.exit("PEFT accepted lora_dropout on the experts")
PY
drop_refusal="lora.dropout 0.05 with a MoE model's experts adapted \(gate_proj, up_proj, down_proj\): PEFT's ParamWrapper refuses lora_dropout != 0 \(the update is merged into the experts' weight, leaving no input to drop out\): set lora.dropout = 0, or adapt the attention only$"
expect_refusal dropout-experts "^titan train: error: $drop_refusal" \
  "$titan" train "${bad[@]}" --lora.dropout=0.05 --job.dump_folder="$work/bad4"
"$titan" train "${bad[@]}" --lora.dropout=0.05 --lora.target_modules=q_proj,v_proj \
  --job.dump_folder="$work/drop-attention" > "$work/drop-attention.log" 2>&1 \
  || { echo "dropout on the attention of a MoE model:"; cat "$work/drop-attention.log"; exit 1; }
echo "train_lora_moe: ok"
