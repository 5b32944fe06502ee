#!/usr/bin/env bash
# titan train on the tiny_moe flavor (4 sparse layers, 8 experts, 2 per token): the loss
# falls; the metrics count the active parameters' FLOPs (qwen3-spec.md §6: router and k of E
# experts, 1.342e+07 per token at seq_len 64, where all 8 experts would give 2.757e+07); with
# --model.output_router_logits=true the step-1 loss gains router_aux_loss_coef (0.001) x the
# load-balancing loss (about k = 2 near balance); the reference experts kernel under activation
# checkpointing gives the default run's step-1 loss.
set -euo pipefail
titan=$(realpath "$1")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
common=(--model.flavor=tiny_moe --lr_scheduler.warmup_steps=2 --training.seq_len=64
        --training.local_batch_size=4 --metrics.log_freq=1 --checkpoint.last_save_in_hf=false
        --job.dump_folder="$work/run" --threads 2)

"$titan" train "${common[@]}" --training.steps=10 --metrics.save_jsonl="$work/plain.jsonl" > "$work/plain.log"
grep -q "1.342e+07 training FLOPs per token" "$work/plain.log" || { echo "unexpected FLOPs per token:"; grep "^model" "$work/plain.log"; exit 1; }
"$titan" train "${common[@]}" --training.steps=1 --lr_scheduler.warmup_steps=0 --model.output_router_logits=true \
  --metrics.save_jsonl="$work/aux.jsonl" > "$work/aux.log"
"$titan" train "${common[@]}" --training.steps=1 --lr_scheduler.warmup_steps=0 --activation_checkpoint.mode=full \
  --overrides.model.layers.*.mlp.experts=experts_reference \
  --metrics.save_jsonl="$work/reference.jsonl" > "$work/reference.log"
grep -q "model.layers.3.mlp.experts: experts_staged -> experts_reference" "$work/reference.log" \
  || { echo "the override was not applied:"; cat "$work/reference.log"; exit 1; }

python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
def losses(name):
    return [json.loads(line)["loss"] for line in open(f"{work}/{name}.jsonl")]
plain, aux, ref = losses("plain"), losses("aux")[0], losses("reference")[0]
first, last = plain[0], min(plain[-3:])
assert last < first - 0.3, f"the loss did not fall: {plain}"
assert 0.0005 < aux - first < 0.01, f"aux loss term {aux - first} (step-1 losses {aux}, {first})"
assert abs(ref - first) < 1e-5 * first, f"reference experts kernel: {ref} vs {first}"
print(f"moe: loss {first:.4f} -> {plain[-1]:.4f}; +aux {aux - first:.5f}; reference kernel {ref:.6f}")
PY
