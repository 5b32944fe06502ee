#!/usr/bin/env bash
# The global load-balancing loss (model.router_aux_loss_scope = "global", the default): on tiny_moe's
# dims (8 experts, 2 per token, 4 sparse layers; its config.json with router_aux_loss_coef 0.1
# instead of 0.001, so that the term's part in the losses and gradients stands well above the
# float noise of 1e-5) in fp32 with model.output_router_logits, each rank's router statistics
# (tokens per expert, router probability sums, rows) are summed over the data-parallel ranks
# before the loss, so DDP 2, EP 2 and FSDP 2 x EP 2 (4 ranks, dp_shard 4), each rank one
# micro-batch of the global batch of 4 rows, equal one process whose micro-batch is the union of
# the ranks' (local batch 4), and FSDP 2 x TP 2 x EP 2 (4 ranks: the TP ranks' sequence shards
# summed first, then the data-parallel ranks') equals TP 2 x EP 2 on the union: the first 10 losses and grad norms within 1e-5 relative
# (tests/e2e/equal_to_single.py). Also:
#  - the statistics not summed (router_aux_loss_scope = "local") DDP 2 is caught: against the same
#    one process its losses and grad norms differ by more than 1e-5 relative (the largest
#    difference printed), and it equals instead one process accumulating the ranks' two
#    micro-batches of 2 rows, each balanced on its own (HF's formula per micro-batch);
#  - one process computes the same bits under either scope (metrics and export);
#  - a scope other than global or local is refused with one line.
# usage: train_router_aux_global.sh TITAN PYTHON
set -euo pipefail
titan=$(realpath "$1")
python="$2"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
. "$(dirname "$0")/layout_runs.sh"

# tiny_moe's config.json and tokenizer (from a one-step run's export), its coefficient raised.
"$titan" train --model.flavor=tiny_moe --training.steps=1 --checkpoint.last_save_in_hf=true \
  --threads 1 --job.dump_folder="$work/dims" > "$work/dims.log" 2>&1 || { cat "$work/dims.log"; exit 1; }
mkdir "$work/moe"
cp "$work/dims/hf/"{config.json,generation_config.json,tokenizer.json,tokenizer_config.json} "$work/moe"
"$python" - "$work/moe/config.json" <<'PY'
import json, sys
config = json.load(open(sys.argv[1]))
assert config["num_experts"] == 8 and config["router_aux_loss_coef"] == 0.001, config
config["router_aux_loss_coef"] = 0.1
json.dump(config, open(sys.argv[1], "w"), indent=2)
PY

# The learning rate 1e-5, not the default 8e-4: at 8e-4 the tiny MoE's trajectory is chaotic --
# AdamW moves a weight whose moments nearly cancel by up to 2 lr whichever side the rounding
# falls, and a token's routing can then flip -- so layouts that round differently part after a
# few steps (measured in the sanitizer build: FSDP 2 x TP 2 x EP 2 against TP 2 x EP 2 within 1e-9
# for 3 steps, then 7.3e-5 at step 4; at 1e-5 within 3e-8 over 10 steps).
common=(--model.flavor=hf --model.hf_assets_path="$work/moe" --model.output_router_logits=true
        --optimizer.lr=1e-5 --training.steps=10
        --training.seq_len=64 --training.global_batch_size=4 --lr_scheduler.warmup_steps=2
        --metrics.log_freq=1 --checkpoint.last_save_in_hf=true --threads 1)
ddp2=(--parallelism.data_parallel_replicate_degree=2 --parallelism.data_parallel_shard_degree=1)
ep2=(--parallelism.expert_parallel_degree=2)


run single 1 --training.local_batch_size=4
run ddp2 2 --training.local_batch_size=2 "${ddp2[@]}"
one_line "$work/ddp2.log" "dp_replicate 2 x dp_shard 1"
run ep2 2 --training.local_batch_size=2 "${ep2[@]}"
one_line "$work/ep2.log" "expert parallel over 2 ranks .* ep 0 of 2"
run fsdp2ep2 4 --training.local_batch_size=1 "${ep2[@]}"
one_line "$work/fsdp2ep2.log" "dp_replicate 1 x dp_shard 4 .* the experts sharded over the ranks holding the same experts"
equal_to_single single 1 ddp2 ep2 fsdp2ep2
# Under EP x TP the reference is the same TP degree on the union: TP 2 x EP 2 on 2 ranks, one
# micro-batch of 4 rows (TP's row-parallel sums round unlike one process's; over 10 steps of this
# coefficient its grad norm drifts to 1.2e-5 of one process's at step 8, as FSDP 2 x TP 2 x EP 2's
# does, while one process's threads 2 against 1 drift to 3.3e-6; TP 2 x EP 2 against one process:
# train_expert_tensor_parallel.sh).
tp2ep2=(--parallelism.tensor_parallel_degree=2 "${ep2[@]}")
run tp2ep2 2 --training.local_batch_size=4 "${tp2ep2[@]}"
run fsdp2tp2ep2 4 --training.local_batch_size=2 "${tp2ep2[@]}"
one_line "$work/fsdp2tp2ep2.log" "dp_replicate 1 x dp_shard 2 .* the experts sharded over the ranks holding the same experts"
equal_to_single tp2ep2 1 fsdp2tp2ep2

# Not summed: each rank balances its own micro-batch. The comparison with the union's one process
# must fail on a loss or grad norm; the run is one process accumulating the ranks' micro-batches.
run ddp2-local 2 --training.local_batch_size=2 "${ddp2[@]}" --model.router_aux_loss_scope=local
if equal_to_single single 1 ddp2-local > "$work/local.out" 2>&1; then
  echo "ddp2-local: equal to the union's one process without summing the statistics"
  cat "$work/local.out"; exit 1
fi
grep -E "ddp2-local step [0-9]+ (loss|grad_norm)" "$work/local.out" ||
  { echo "ddp2-local: the comparison failed for another reason"; cat "$work/local.out"; exit 1; }
"$python" - "$work/single.jsonl" "$work/ddp2-local.jsonl" <<'PY'
import json, sys
a, b = ({r["step"]: r for r in map(json.loads, open(p)) if "loss" in r} for p in sys.argv[1:])
for key in ("loss", "grad_norm"):
    worst = max(abs(b[s][key] - a[s][key]) / abs(a[s][key]) for s in a)
    print(f"ddp2-local against the union's one process: {key} up to {worst:.1e} relative")
PY
run single-accumulating 1 --training.local_batch_size=2
equal_to_single single-accumulating 1 ddp2-local

# One process: the same bits under either scope.
run single-local 1 --training.local_batch_size=4 --model.router_aux_loss_scope=local
cmp "$work/single/hf/model.safetensors" "$work/single-local/hf/model.safetensors" ||
  { echo "one process: the export differs between the scopes"; exit 1; }
"$python" - "$work/single.jsonl" "$work/single-local.jsonl" <<'PY'
import json, sys
a, b = ([(r["step"], r["loss"], r["grad_norm"]) for r in map(json.loads, open(p)) if "loss" in r]
        for p in sys.argv[1:])
assert len(a) == 10 and a == b, f"one process: the metrics differ between the scopes: {a} vs {b}"
PY
echo "one process: the same losses, grad norms and export under either scope"

if "$titan" train "${common[@]}" --model.router_aux_loss_scope=batch --job.dump_folder="$work/bad" > "$work/bad.log" 2>&1; then
  echo "router_aux_loss_scope = batch: ran"; cat "$work/bad.log"; exit 1
fi
one_line "$work/bad.log" "model.router_aux_loss_scope"
echo "train_router_aux_global: all checks passed"
