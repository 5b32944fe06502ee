#!/usr/bin/env bash
# The seeds' load check: a model trained for a while and exported as a Hugging Face folder, loaded
# back through checkpoint.initial_load_path, starts far below a random initialisation's step-1 loss
# (about ln(vocab) = 7.6 for the debug model) on the same first batch.
set -euo pipefail
titan=$(realpath "$1")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
common=(--training.seq_len=128 --lr_scheduler.warmup_steps=0 --metrics.log_freq=1 --threads 2)
first_loss() { python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["loss"])' "$1"; }

corpus=/usr/share/doc/jargon-text/jargon.txt.gz
"$titan" train "${common[@]}" --training.steps=50 --optimizer.lr=3e-3 --job.dump_folder="$work/a" \
  --lr_scheduler.warmup_steps=5 --validation.enable=true --validation.dataset_path="$corpus" \
  --validation.freq=50 --validation.steps=3 --metrics.save_jsonl="$work/a.jsonl" > "$work/a.log"
[ -f "$work/a/hf/config.json" ] && [ -f "$work/a/hf/model.safetensors" ] && [ -f "$work/a/hf/tokenizer.json" ] \
  || { echo "export is incomplete"; ls -la "$work/a/hf"; exit 1; }

"$titan" train "${common[@]}" --training.steps=1 --checkpoint.last_save_in_hf=false \
  --checkpoint.initial_load_path="$work/a/hf" --checkpoint.initial_load_in_hf=true \
  --job.dump_folder="$work/b" --metrics.save_jsonl="$work/loaded.jsonl" > "$work/b.log"
grep -q "^model weights: from $work/a/hf (Hugging Face folder)$" "$work/b.log" || { echo "the log does not name the initial weights"; exit 1; }
"$titan" train "${common[@]}" --training.steps=1 --checkpoint.last_save_in_hf=false \
  --job.dump_folder="$work/c" --metrics.save_jsonl="$work/random.jsonl" > "$work/c.log"
grep -q "^model weights: random init (HF init, seed 0)$" "$work/c.log" || { echo "the log does not say random init"; exit 1; }

# titan eval on the exported folder computes what the validation pass computed on the same data.
validation=$(python3 -c 'import json,sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "validation_loss" in r: print("%.5f" % r["validation_loss"])' "$work/a.jsonl")
evaluated=$("$titan" eval --model "$work/a/hf" --data "$corpus" --seq-len 128 --batch-size 8 \
  --max-batches 3 --threads 2 | awk '{printf "%.5f", $2}')
echo "validation loss $validation, titan eval $evaluated"
[ -n "$validation" ] && [ "$validation" = "$evaluated" ] || { echo "eval and validation disagree"; exit 1; }

loaded=$(first_loss "$work/loaded.jsonl")
random=$(first_loss "$work/random.jsonl")
echo "step-1 loss: loaded from the export $loaded, random init $random"
python3 -c "import sys; l, r = map(float, sys.argv[1:]); sys.exit(0 if l < r - 1.0 and abs(r - 7.62) < 0.3 else 1)" "$loaded" "$random" \
  || { echo "loaded weights are not far below random init"; exit 1; }
