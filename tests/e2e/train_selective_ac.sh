#!/usr/bin/env bash
# Selective activation checkpointing end to end: `titan train` on the tiny (4 dense layers) and
# tiny_moe presets, fp32 and bf16, 2 steps of 2 micro-batches each, under activation_checkpoint.mode
# none, full, selective "op" and selective "2" (layers 1 and 3 recomputed):
#  1. every step's loss and gradient norm (the metrics JSONL, full precision) and the exported
#     weights after the two AdamW updates (which any gradient's last bit would change) equal none's
#     byte for byte;
#  2. the activations' peak the run reports (memory_peak_by_category_gib, exact in bytes) is what
#     `titan plan --json` predicts for the same flags, and it and the run's step peak lie strictly
#     between full's and none's.
# usage: train_selective_ac.sh TITAN
set -euo pipefail
titan=$(realpath "$1")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "$1"; [ -n "${2:-}" ] && cat "$2"; exit 1; }

modes=("none" "full" "selective op" "selective 2")
for preset in tiny tiny_moe; do
  for dtype in float32 bfloat16; do
    for mode in "${modes[@]}"; do
      read -r ac option <<< "$mode"
      name="$preset-$dtype-$ac${option:+-$option}"
      flags=(--preset "$preset" --training.steps=2 --training.seq_len=64 --training.local_batch_size=2
             --training.global_batch_size=4 --lr_scheduler.warmup_steps=1 --metrics.log_freq=1
             --training.mixed_precision_param="$dtype" --activation_checkpoint.mode="$ac")
      [ -n "$option" ] && flags+=(--activation_checkpoint.selective_ac_option="$option")
      "$titan" plan "${flags[@]}" --json > "$work/$name.plan" 2> "$work/$name.plan.err" \
        || fail "$name: plan failed" "$work/$name.plan.err"
      "$titan" train "${flags[@]}" --threads 2 --job.dump_folder="$work/$name" \
        > "$work/$name.log" 2>&1 || fail "$name: train failed" "$work/$name.log"
    done
    python3 - "$work" "$preset-$dtype" <<'PY'
import json, sys
work, case = sys.argv[1], sys.argv[2]
names = [f"{case}-{m}" for m in ("none", "full", "selective-op", "selective-2")]
def steps(name):
    return [json.loads(l) for l in open(f"{work}/{name}/metrics.jsonl") if '"loss"' in l]
want = [(r["loss"], r["grad_norm"]) for r in steps(names[0])]
assert len(want) == 2, want
activations = {}
for name in names:
    got = [(r["loss"], r["grad_norm"]) for r in steps(name)]
    assert got == want, f"{name}: losses and gradient norms {got} != none's {want}"
    measured = steps(name)[-1]["memory_peak_by_category_gib"]["activations"] * 2**30
    plan = json.load(open(f"{work}/{name}.plan"))
    predicted = plan["memory_bytes"]["step_by_category"]["activations"]
    assert measured == predicted, f"{name}: activations {measured} B, plan {predicted} B"
    activations[name] = predicted
none, full = activations[names[0]], activations[names[1]]
peak = {name: steps(name)[-1]["memory_peak_gib"] for name in names}
for name in names[2:]:
    assert full < activations[name] < none, f"{name}: {activations[name]} B not in ({full}, {none})"
    assert peak[names[1]] < peak[name] < peak[names[0]], f"{name}: step peak {peak}"
print(case, {n.removeprefix(case + "-"): a for n, a in activations.items()})
PY
    for mode in full selective-op selective-2; do
      cmp "$work/$preset-$dtype-none/hf/model.safetensors" "$work/$preset-$dtype-$mode/hf/model.safetensors" \
        || fail "$preset-$dtype-$mode: exported weights differ from none's"
    done
  done
done
# A run without selective names no activation_checkpoint key; one with it trains quietly too.
! grep -q "activation_checkpoint" "$work/tiny-float32-selective-op.log" \
  || fail "selective op: a line about it" "$work/tiny-float32-selective-op.log"
echo ok
