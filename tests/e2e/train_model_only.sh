#!/usr/bin/env bash
# torchtitan's checkpoint content switches: checkpoint.last_save_model_only (the last step saves
# parameters only), and checkpoint.initial_load_path pointing at a titan checkpoint with
# initial_load_model_only true (weights only) or false (the whole training state).
set -euo pipefail
titan=$(realpath "$1")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# A constant LR after warm-up, so a 4-step and a 6-step run take the same steps 1-4.
common=(--training.steps=4 --lr_scheduler.warmup_steps=1 --lr_scheduler.decay_type=none --training.seq_len=64 --training.local_batch_size=2
        --metrics.log_freq=1 --checkpoint.enable=true --checkpoint.interval=2 --checkpoint.keep_latest_k=0
        --checkpoint.last_save_in_hf=false --threads 2)
losses() { python3 -c 'import json,sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if int(sys.argv[2]) <= r["step"] <= 4: print(r["step"], repr(r["loss"]), repr(r["grad_norm"]))' "$1" "$2"; }
fail() { echo "$1"; [ -n "${2:-}" ] && cat "$2"; exit 1; }

# The last step is saved model-only (the default, as in torchtitan); step-2 in full.
"$titan" train "${common[@]}" --job.dump_folder="$work/a" --metrics.save_jsonl="$work/a.jsonl" > "$work/a.log"
ckpt="$work/a/checkpoint"
[ -f "$ckpt/step-2/optimizer.safetensors" ] || fail "step-2 lacks its optimizer state"
[ ! -e "$ckpt/step-4/optimizer.safetensors" ] || fail "step-4 (the last) was saved with its optimizer state"
grep -q '"model_only": true' "$ckpt/step-4/trainer_state.json" || fail "step-4 is not marked model-only"

# Going on to step 6 cannot start from the model-only step-4: it says so and resumes step 2,
# repeating steps 3-4 exactly.
"$titan" train "${common[@]}" --training.steps=6 --job.dump_folder="$work/a" \
  --metrics.save_jsonl="$work/a6.jsonl" > "$work/a6.log"
grep -q "step-4 holds model weights only" "$work/a6.log" || fail "no model-only notice" "$work/a6.log"
grep -q "resumed step 2 from" "$work/a6.log" || fail "did not resume step 2" "$work/a6.log"
diff <(losses "$work/a.jsonl" 3) <(losses "$work/a6.jsonl" 3) || fail "steps 3-4 differ after resuming"

# That run saved step-4 in full and step-6 model-only. Asking for step-6 by number to go on to
# step 8 is an error naming it.
[ -f "$ckpt/step-4/optimizer.safetensors" ] || fail "the resumed run's step-4 lacks its optimizer state"
if "$titan" train "${common[@]}" --training.steps=8 --job.dump_folder="$work/a" \
     --checkpoint.load_step=6 > /dev/null 2> "$work/load_step.err"; then fail "load_step=6 was accepted"; fi
grep -q "step-6 holds model weights only" "$work/load_step.err" || fail "unclear load_step error" "$work/load_step.err"

# initial_load_model_only = false: the whole training state of another run's step-2.
"$titan" train "${common[@]}" --job.dump_folder="$work/b" --checkpoint.initial_load_path="$ckpt/step-2" \
  --checkpoint.initial_load_model_only=false --metrics.save_jsonl="$work/b.jsonl" > "$work/b.log"
grep -q "resumed step 2 from $ckpt/step-2" "$work/b.log" || fail "full initial load not reported" "$work/b.log"
diff <(losses "$work/a.jsonl" 3) <(losses "$work/b.jsonl" 3) || fail "steps 3-4 differ after the full initial load"

# initial_load_model_only = true (the default): the weights of the model-only step-6, step 1 anew.
"$titan" train "${common[@]}" --training.steps=1 --checkpoint.enable=false --job.dump_folder="$work/c" \
  --checkpoint.initial_load_path="$ckpt/step-6" --metrics.save_jsonl="$work/c.jsonl" > "$work/c.log"
grep -q "initial weights from $ckpt/step-6 (titan checkpoint of step 6, model weights only)" "$work/c.log" \
  || fail "model-only initial load not reported" "$work/c.log"
python3 - "$work/a.jsonl" "$work/c.jsonl" <<'PY' || fail "the loaded weights did not lower the step-1 loss"
import json, sys
first = lambda p: json.loads(open(p).readline())["loss"]
random_init, loaded = first(sys.argv[1]), first(sys.argv[2])
print(f"step-1 loss: random init {random_init:.4f}, from step-6 weights {loaded:.4f}")
sys.exit(0 if loaded < random_init - 0.05 else 1)
PY

# A Hugging Face folder needs initial_load_in_hf, and an HF load is model-only by definition.
mkdir -p "$work/hf" && echo '{}' > "$work/hf/config.json"
if "$titan" train "${common[@]}" --job.dump_folder="$work/d" --checkpoint.initial_load_path="$work/hf" \
     > /dev/null 2> "$work/d.err"; then fail "an HF folder loaded without initial_load_in_hf"; fi
grep -q "is a Hugging Face folder; set checkpoint.initial_load_in_hf = true" "$work/d.err" || fail "unclear error" "$work/d.err"
if "$titan" train "${common[@]}" --job.dump_folder="$work/d" --checkpoint.initial_load_path="$work/hf" \
     --checkpoint.initial_load_in_hf=true --checkpoint.initial_load_model_only=false > /dev/null 2> "$work/e.err"; then
  fail "initial_load_in_hf with initial_load_model_only=false was accepted"; fi
grep -q "set checkpoint.initial_load_model_only = true" "$work/e.err" || fail "unclear error" "$work/e.err"
echo "model-only checkpoints: last save without optimizer state, resume past it, full and model-only initial loads"
