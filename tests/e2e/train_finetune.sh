#!/usr/bin/env bash
# Fine-tuning a Hugging Face folder in one command (train/job_finetune.h):
#   titan train --model.hf_assets_path=DIR --training.dataset_path=FILE --training.steps=N
# - starts from DIR's weights: step 1's loss equals `titan eval` of DIR on the same conversations
#   (the step's global batch is the whole file: 8 conversations, 8 rows; within 1e-5, the rows
#   being shuffled), and a random initialisation's (--model.flavor=hf on the same folder, which
#   says "random init") lies far outside that (0.46 away: the folder learned the Jargon File, not
#   these conversations; the check asks for 0.1);
# - the start-up lines say where the weights come from and list the fine-tune defaults applied
#   (lr 2e-5, no weight decay, a 3 % warm-up, the data's kind from its first record), which the
#   saved job_config.toml holds; a key the user sets (--optimizer.lr) is left as set;
# - ends with outputs/hf, which Transformers loads (config.json with eos_token_id) and `titan
#   generate --chat` answers from; a 0-step run exports the folder's own weights and says nothing
#   was trained; documents (no "messages") are read as documents;
# - `titan plan` resolves the same command the same way;
# - bad folders (missing, no config.json, config.json without weights) stop with one line.
# The folder: the tiny model after 30 steps of the default run (at 3e-3), its export given the official
# Qwen3 chat template (tests/fixtures/chat_templates.json) and no titan.json, as a folder from the
# Hub has none.
# usage: train_finetune.sh TITAN PYTHON
set -euo pipefail
titan=$(realpath "$1")
python="$2"
source_dir="$(cd "$(dirname "$0")/../.." && pwd)"
. "$(dirname "$0")/tree_sum.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"

"$titan" train --training.steps=30 --training.seq_len=64 --training.local_batch_size=4 --optimizer.lr=3e-3 \
  --threads 2 --job.dump_folder="$work/made" > "$work/made.log" 2>&1 || { cat "$work/made.log"; exit 1; }
cp -r "$work/made/hf" "$work/base"
rm "$work/base/titan.json"
"$python" - "$work" "$source_dir" <<'PY'
import json, sys
work, source = sys.argv[1:]
qwen3 = next(t for t in json.load(open(f"{source}/tests/fixtures/chat_templates.json")) if t["kind"] == "qwen3")
path = f"{work}/base/tokenizer_config.json"
config = json.load(open(path))
config["chat_template"] = qwen3["chat_template"]
json.dump(config, open(path, "w"), indent=2)
# One global batch of the default 8 rows holds the whole file: step 1 scores every conversation.
lines = open(f"{source}/examples/chat/conversations.jsonl").readlines()[:8]
open(f"{work}/sft.jsonl", "w").writelines(lines)
with open(f"{work}/docs.jsonl", "w") as f:
    for line in lines:
        for m in json.loads(line)["messages"]:
            f.write(json.dumps({"text": m["content"]}) + "\n")
PY

# ---- the one command ----
"$titan" train --model.hf_assets_path="$work/base" --training.dataset_path="$work/sft.jsonl" \
  --training.steps=3 --threads 2 > "$work/ft.log" 2> "$work/ft.err" || { cat "$work/ft.log" "$work/ft.err"; exit 1; }
head -1 "$work/ft.log" | grep -qxF 'fine-tune defaults for the keys not set: optimizer.lr = 2e-05, optimizer.weight_decay = 0, lr_scheduler.warmup_steps = 1 (3 % of 3 steps, rounded up), training.dataset = "chat" (the data'"'"'s first record has "messages"), checkpoint.last_save_in_hf = true' \
  || { echo "the first line does not list the fine-tune defaults"; cat "$work/ft.log"; exit 1; }
grep -qxF "model weights: from $work/base (Hugging Face folder)" "$work/ft.log" \
  || { echo "the log does not say where the weights come from"; cat "$work/ft.log"; exit 1; }
[ "$(grep -n '^model weights: ' "$work/ft.log" | cut -d: -f1)" -le 5 ] \
  || { echo "the weights' source is not among the first lines"; cat "$work/ft.log"; exit 1; }
# Only progress lines (a loaded or sanitized machine may take over a second to load or export).
[ -z "$(grep -v -E '^(loading|exporting) ' "$work/ft.err")" ] || { echo "warnings in a fine-tune:"; cat "$work/ft.err"; exit 1; }
grep -q "^model dims: $work/base/config.json" "$work/ft.log" || { echo "dims not from the folder"; exit 1; }
grep -q "^exported the model as a Hugging Face folder: ./outputs/hf " "$work/ft.log" \
  || { echo "no export to outputs/hf"; cat "$work/ft.log"; exit 1; }
for line in "flavor = 'hf'" 'lr = 2e-05' 'weight_decay = 0.0' 'warmup_steps = 1' "dataset = 'chat'" \
  "initial_load_path = '$work/base'" 'initial_load_in_hf = true' 'last_save_in_hf = true'; do
  grep -qxF "$line" outputs/job_config.toml || { echo "job_config.toml lacks $line"; exit 1; }
done

# Step 1 computed on the folder's weights: titan eval of the folder on the same 8 conversations.
# The rows are in another order (the loader shuffles), so the sums differ by fp32 rounding only.
first_loss() { "$python" -c 'import json,sys; print(next(r["loss"] for r in map(json.loads, open(sys.argv[1])) if r.get("step") == 1))' "$1"; }
step1=$(first_loss outputs/metrics.jsonl)
"$titan" eval --model "$work/base" --data "$work/sft.jsonl" --chat --seq-len 256 --batch-size 8 \
  --threads 2 > "$work/eval.log" 2> /dev/null
grep -q "in 1 batches of 8 rows" "$work/eval.log" || { echo "eval did not score one batch of 8"; cat "$work/eval.log"; exit 1; }
evaluated=$(awk '{print $2}' "$work/eval.log")

# The same folder with model.flavor named: its config.json only, random weights, said so.
"$titan" train --model.flavor=hf --model.hf_assets_path="$work/base" --training.dataset=chat \
  --training.dataset_path="$work/sft.jsonl" --training.steps=1 --threads 2 \
  --job.dump_folder="$work/random" > "$work/random.log" 2>&1 || { cat "$work/random.log"; exit 1; }
grep -qxF "model weights: random init (HF init, seed 0; model.flavor \"hf\" takes only the dims of $work/base/config.json: checkpoint.initial_load_path loads weights)" \
  "$work/random.log" || { echo "random init not stated"; cat "$work/random.log"; exit 1; }
if grep -q "^fine-tune defaults" "$work/random.log"; then echo "fine-tune defaults with a flavor named"; exit 1; fi
random=$(first_loss "$work/random/metrics.jsonl")
echo "step-1 loss: fine-tune $step1, titan eval of the folder $evaluated, random init $random"
"$python" -c 'import sys; s, e, r = map(float, sys.argv[1:]); sys.exit(not (abs(s - e) < 1e-5 and abs(r - e) > 0.1))' \
  "$step1" "$evaluated" "$random" || { echo "step 1 did not start from the folder's weights"; exit 1; }

# The export: Transformers loads it, config.json names the EOS, and titan generate --chat answers.
"$python" - outputs/hf <<'PY' 2>&1 | grep -v "Loading weights"
import json, sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
folder = sys.argv[1]
model = AutoModelForCausalLM.from_pretrained(folder)
tok = AutoTokenizer.from_pretrained(folder)
config = json.load(open(f"{folder}/config.json"))
assert config.get("eos_token_id") == tok.eos_token_id is not None, config.get("eos_token_id")
ids = tok.apply_chat_template([{"role": "user", "content": "What is titan.cpp?"}], return_tensors="pt",
                              add_generation_prompt=True, return_dict=True)["input_ids"]
with torch.no_grad():
    logits = model(ids).logits
assert torch.isfinite(logits).all()
print(f"Transformers loads outputs/hf: {type(model).__name__}, eos_token_id {config['eos_token_id']}")
PY
"$titan" generate --model outputs/hf --chat --prompt "What is titan.cpp?" --greedy --max-new-tokens 8 \
  --threads 2 > "$work/answer.txt" 2> "$work/answer.err" || { echo "generate --chat failed"; cat "$work/answer.err"; exit 1; }
echo "titan generate --chat on outputs/hf: $(head -c 80 "$work/answer.txt" | tr '\n' ' ')"

# ---- a key the user set stays as set ----
"$titan" train --model.hf_assets_path="$work/base" --training.dataset_path="$work/sft.jsonl" \
  --training.steps=1 --optimizer.lr=1e-4 --threads 2 --job.dump_folder="$work/lr" > "$work/lr.log" 2>&1 \
  || { cat "$work/lr.log"; exit 1; }
head -1 "$work/lr.log" | grep -q "^fine-tune defaults for the keys not set: optimizer.weight_decay = 0, " \
  || { echo "the defaults line lists a key the user set"; cat "$work/lr.log"; exit 1; }
grep -qxF 'lr = 1e-04' "$work/lr/job_config.toml" || { echo "optimizer.lr not as set"; exit 1; }

# ---- documents, 0 steps: the folder's own weights exported, nothing trained ----
"$titan" train --model.hf_assets_path="$work/base" --training.dataset_path="$work/docs.jsonl" \
  --training.steps=0 --threads 2 --job.dump_folder="$work/zero" > "$work/zero.log" 2>&1 \
  || { cat "$work/zero.log"; exit 1; }
grep -qF 'lr_scheduler.warmup_steps = 0 (3 % of 0 steps, rounded up), training.dataset = "documents" (the data'"'"'s first record has no "messages")' \
  "$work/zero.log" || { echo "documents not recognised"; cat "$work/zero.log"; exit 1; }
grep -q "^summary: nothing trained (no step ran)" "$work/zero.log" || { echo "no 'nothing trained'"; cat "$work/zero.log"; exit 1; }
if grep -q "loss 0.0000 -> 0.0000" "$work/zero.log"; then echo "a 0-step summary shows losses"; exit 1; fi
"$python" - "$work/base" "$work/zero/hf" <<'PY'
import sys
from safetensors.torch import load_file
base, exported = (load_file(f"{d}/model.safetensors") for d in sys.argv[1:])
assert base.keys() == exported.keys() and all((base[k] == exported[k]).all() for k in base), "weights differ"
print(f"0-step fine-tune: the export holds the folder's {len(base)} tensors bit for bit")
PY

# ---- titan plan resolves the command as titan train does ----
"$titan" plan --model.hf_assets_path="$work/base" --training.dataset_path="$work/sft.jsonl" \
  --training.steps=3 > "$work/plan.out" 2> "$work/plan.err"
grep -q "^fine-tune defaults for the keys not set: optimizer.lr = 2e-05" "$work/plan.err" \
  || { echo "plan: no defaults line"; cat "$work/plan.err"; exit 1; }
grep -q "$work/base/config.json" "$work/plan.out" || { echo "plan: not the folder's model"; cat "$work/plan.out"; exit 1; }

# ---- bad folders: one line each ----
mkdir "$work/tok" && cp "$work/base"/tokenizer*.json "$work/tok/"
cp -r "$work/base" "$work/noweights" && rm "$work/noweights/model.safetensors"
three=(--training.dataset_path="$work/sft.jsonl" --training.steps=1 --threads 2)
expect_refusal missing "^titan train: error: model.hf_assets_path $work/nowhere: no such folder " \
  "$titan" train --model.hf_assets_path="$work/nowhere" "${three[@]}"
expect_refusal no-config "^titan train: error: model.hf_assets_path $work/tok has no config.json, so it is not a Hugging Face model folder to fine-tune \(to train a built-in model with only its tokenizer, name the model: --model.flavor=tiny\)$" \
  "$titan" train --model.hf_assets_path="$work/tok" "${three[@]}"
expect_refusal no-weights "^titan train: error: model.hf_assets_path $work/noweights has a config.json but no weights to fine-tune \(no model.safetensors nor model.safetensors.index.json\); to train its architecture from random weights, set model.flavor = \"hf\"$" \
  "$titan" train --model.hf_assets_path="$work/noweights" "${three[@]}"
# A flavor named keeps the folder to its tokenizer, with a warning saying so.
"$titan" train --model.flavor=tiny --model.hf_assets_path="$work/tok" --training.dataset=chat \
  --training.steps=0 --threads 2 "${three[0]}" --job.dump_folder="$work/tokonly" > "$work/tokonly.log" 2> "$work/tokonly.err"
grep -q "^warning: model.hf_assets_path gives only the tokenizer: the model's dims come from flavor 'tiny' and its weights are random" \
  "$work/tokonly.err" || { echo "no tokenizer-only warning"; cat "$work/tokonly.err"; exit 1; }
grep -qxF "model weights: random init (HF init, seed 0)" "$work/tokonly.log" || { echo "random init not stated"; exit 1; }
echo "train_finetune: ok"
