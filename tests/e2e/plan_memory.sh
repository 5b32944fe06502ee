#!/usr/bin/env bash
# `titan plan` against `titan train`:
#  1. the predicted peak memory per rank equal to the byte to the peak the trainer reports (its
#     JSONL: the maximum over ranks), and the step's parameters, gradients, optimizer and
#     activations per rank likewise (but for the saving runs, whose gathered tensor counts as
#     parameters or optimizer), for one process (also saving checkpoints: the writer's staging),
#     DDP over 2 ranks and FSDP over 2 ranks, in fp32 and in bf16 (its tied embedding gathered in
#     fp32 for the lookup and in bf16 for the loss, each use bringing what it reads) with each
#     reshard policy that keeps units whole, on the tiny model with a small batch; TP 2 saving
#     checkpoints (rank 0 gathers one tensor whole at a time as the writer reaches it); EP 2 on
#     tiny_moe in fp32 and bf16 (each rank's 4 of the 8 experts; the arena holds rooms for the
#     most rows that can arrive at the rank's experts, whatever the routing: nn/expert_parallel.h
#     most_arrived_rows); FSDP 2 x EP 2 on 4 ranks (the experts sharded over the 2 ranks holding
#     them, the rest over all 4) in fp32 and bf16 and HSDP 2 x FSDP 2 x EP 2 on 8; EP x TP (TP 2 x
#     EP 2 with sequence parallel and without, FSDP 2 x TP 2 x EP 2, TP 2 x EP 4, DDP 2 x TP 2 x
#     EP 2: the sparse blocks on the sequence shards, their rooms for tokens / tp); TP on tiny_moe
#     without EP (TP 2 with sequence parallel and without, FSDP 2 x TP 2: each rank 1/2 of every
#     expert's width, the sparse blocks on every token); FSDP 2 x TP 2, FSDP 2 x EP 2 and FSDP 2 x
#     TP 2 x EP 2 saving checkpoints (a tensor's shard rows gathered onto rank 0's TP or EP group,
#     then its cuts onto rank 0); an EP degree that is not a multiple of the TP degree refused by
#     plan and train in the same line;
#  2. the plan's mesh and micro-batches are the trainer's, its errors the trainer's lines, and a
#     bad --nproc is one line;
#  3. the final export's peak on rank 0 equal to the byte to the plan's (one process, FSDP 2 in
#     fp32 and bf16: one run of a unit gathered onto rank 0 at a time; TP 2: one run of whole
#     parameters beside rank 0's cuts, and a row-wise parameter's cuts before they are placed;
#     EP 2 on tiny_moe, the arena's expert-parallel rooms still held; FSDP 2 x EP 2: a run of the
#     rank's part gathered from the shards beside the whole run gathered from the EP ranks; FSDP 2
#     x TP 2 the same with the TP ranks' parts);
#  4. LoRA over a base held in bf16 under FSDP 2 (lora.base_dtype = "bfloat16": the shards of the
#     matmul weights bf16 rows), loaded from the one-process export of 3: the step's peak and the
#     merged export's peak (the shards widened to fp32, then one run gathered) to the byte.
# usage: plan_memory.sh TITAN
set -euo pipefail
titan=$(realpath "$1")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
. "$(dirname "$0")/mpi_env.sh"

common=(--training.steps=3 --training.seq_len=64 --training.local_batch_size=2
        --training.global_batch_size=4 --lr_scheduler.warmup_steps=1 --metrics.log_freq=1
        --checkpoint.last_save_in_hf=false)
ddp=(--parallelism.data_parallel_replicate_degree=2 --parallelism.data_parallel_shard_degree=1)
ckpt=(--checkpoint.enable=true --checkpoint.interval=1)
tp=(--parallelism.tensor_parallel_degree=2)  # with sequence parallel, torchtitan's default
ep=(--model.flavor=tiny_moe --parallelism.expert_parallel_degree=2)

# 1. Plan, then train, each mesh.
"$titan" plan "${common[@]}" --json > "$work/single.plan"
"$titan" plan "${common[@]}" --nproc 2 "${ddp[@]}" --json > "$work/ddp2.plan"
"$titan" plan "${common[@]}" --nproc 2 --json > "$work/fsdp2.plan"
"$titan" train "${common[@]}" --threads 1 --job.dump_folder="$work/single" \
  --metrics.save_jsonl="$work/single.jsonl" > "$work/single.log"
"$titan" plan "${common[@]}" "${ckpt[@]}" --json > "$work/ckpt.plan"
"$titan" train "${common[@]}" "${ckpt[@]}" --threads 1 --job.dump_folder="$work/ckpt" \
  --metrics.save_jsonl="$work/ckpt.jsonl" > "$work/ckpt.log"
"$titan" launch --nproc 2 train "${common[@]}" "${ddp[@]}" --threads 1 --job.dump_folder="$work/ddp2" \
  --metrics.save_jsonl="$work/ddp2.jsonl" > "$work/ddp2.log" 2>&1 || { cat "$work/ddp2.log"; exit 1; }
"$titan" launch --nproc 2 train "${common[@]}" --threads 1 --job.dump_folder="$work/fsdp2" \
  --metrics.save_jsonl="$work/fsdp2.jsonl" > "$work/fsdp2.log" 2>&1 || { cat "$work/fsdp2.log"; exit 1; }
"$titan" plan "${common[@]}" "${ckpt[@]}" "${tp[@]}" --nproc 2 --json > "$work/tp2ckpt.plan"
"$titan" launch --nproc 2 train "${common[@]}" "${ckpt[@]}" "${tp[@]}" --threads 1 --job.dump_folder="$work/tp2ckpt" \
  --metrics.save_jsonl="$work/tp2ckpt.jsonl" > "$work/tp2ckpt.log" 2>&1 || { cat "$work/tp2ckpt.log"; exit 1; }
"$titan" plan "${common[@]}" "${ep[@]}" --nproc 2 --json > "$work/ep2.plan"
"$titan" launch --nproc 2 train "${common[@]}" "${ep[@]}" --threads 1 --job.dump_folder="$work/ep2" \
  --metrics.save_jsonl="$work/ep2.jsonl" > "$work/ep2.log" 2>&1 || { cat "$work/ep2.log"; exit 1; }
ep_bf16=("${ep[@]}" --training.mixed_precision_param=bfloat16)
"$titan" plan "${common[@]}" "${ep_bf16[@]}" --nproc 2 --json > "$work/ep2bf16.plan"
"$titan" launch --nproc 2 train "${common[@]}" "${ep_bf16[@]}" --threads 1 --job.dump_folder="$work/ep2bf16" \
  --metrics.save_jsonl="$work/ep2bf16.jsonl" > "$work/ep2bf16.log" 2>&1 || { cat "$work/ep2bf16.log"; exit 1; }
# FSDP 2 x EP 2: 4 ranks, dp_shard 4 with EP 2 borrowed from it (a global batch of 8).
fsdp_ep=("${ep[@]}" --training.global_batch_size=8)
for name in fsdp2ep2 fsdp2ep2bf16; do
  flags=("${common[@]}" "${fsdp_ep[@]}")
  [ "$name" = fsdp2ep2bf16 ] && flags+=(--training.mixed_precision_param=bfloat16)
  "$titan" plan "${flags[@]}" --nproc 4 --json > "$work/$name.plan"
  "$titan" launch --nproc 4 train "${flags[@]}" --threads 1 --job.dump_folder="$work/$name" \
    --metrics.save_jsonl="$work/$name.jsonl" > "$work/$name.log" 2>&1 || { cat "$work/$name.log"; exit 1; }
done
# EP x TP: TP 2 x EP 2 with sequence parallel and without, FSDP 2 x TP 2 x EP 2, TP 2 x EP 4 (DDP 2),
# DDP 2 x TP 2 x EP 2 -- the sparse blocks on the sequence shards, their rooms for tokens / tp;
# HSDP 2 x FSDP 2 x EP 2 (8 ranks); TP without EP on the MoE (TP 2 with and without sequence
# parallel, FSDP 2 x TP 2: every expert's width cut, the sparse blocks on every token); and the
# saves of FSDP 2 x TP 2, FSDP 2 x EP 2 and FSDP 2 x TP 2 x EP 2 (a tensor's shard rows gathered
# onto rank 0's TP or EP group beside the whole tensor on rank 0).
tp_ep=(--model.flavor=tiny_moe "${tp[@]}")
for name in tp2ep2 tp2ep2nosp fsdp2tp2ep2 tp2ep4 ddp2tp2ep2 hsdp2fsdp2ep2 tp2moe tp2moenosp \
            fsdp2tp2moe fsdp2tp2ckpt fsdp2ep2ckpt fsdp2tp2ep2ckpt; do
  flags=("${common[@]}") nproc=4
  case $name in
    tp2ep2) flags+=("${tp_ep[@]}" --parallelism.expert_parallel_degree=2) nproc=2 ;;
    tp2ep2nosp) flags+=("${tp_ep[@]}" --parallelism.expert_parallel_degree=2
                        --parallelism.enable_sequence_parallel=false) nproc=2 ;;
    fsdp2tp2ep2) flags+=("${tp_ep[@]}" --parallelism.expert_parallel_degree=2) ;;
    tp2ep4) flags+=("${tp_ep[@]}" --parallelism.expert_parallel_degree=4) ;;
    tp2moe) flags+=("${tp_ep[@]}") nproc=2 ;;
    tp2moenosp) flags+=("${tp_ep[@]}" --parallelism.enable_sequence_parallel=false) nproc=2 ;;
    fsdp2tp2moe) flags+=("${tp_ep[@]}") ;;
    ddp2tp2ep2) flags+=("${tp_ep[@]}" --parallelism.expert_parallel_degree=2 "${ddp[@]}") ;;
    hsdp2fsdp2ep2) flags+=("${ep[@]}" --parallelism.data_parallel_replicate_degree=2
                           --training.global_batch_size=16) nproc=8 ;;
    fsdp2tp2ckpt) flags+=("${tp[@]}" "${ckpt[@]}") ;;
    fsdp2ep2ckpt) flags+=("${fsdp_ep[@]}" "${ckpt[@]}") ;;
    fsdp2tp2ep2ckpt) flags+=("${tp_ep[@]}" --parallelism.expert_parallel_degree=2 "${ckpt[@]}") ;;
  esac
  "$titan" plan "${flags[@]}" --nproc $nproc --json > "$work/$name.plan"
  "$titan" launch --nproc $nproc train "${flags[@]}" --threads 1 --job.dump_folder="$work/$name" \
    --metrics.save_jsonl="$work/$name.jsonl" > "$work/$name.log" 2>&1 || { cat "$work/$name.log"; exit 1; }
done
# What titan train refuses from the config under TP, plan refuses with the same line: an EP degree
# that is not a multiple of the TP degree.
for name in tp4ep2; do
  flags=("${common[@]}" --model.flavor=tiny_moe --parallelism.tensor_parallel_degree=4
         --parallelism.expert_parallel_degree=2) nproc=4
  expected="the EP degree must be a multiple of the TP degree"
  if "$titan" plan "${flags[@]}" --nproc $nproc > "$work/$name.plan" 2>&1; then
    echo "$name planned"; cat "$work/$name.plan"; exit 1
  fi
  if "$titan" launch --nproc $nproc train "${flags[@]}" --job.dump_folder="$work/$name" \
    > "$work/$name.log" 2>&1; then echo "$name trained"; exit 1; fi
  [ "$(wc -l < "$work/$name.plan")" = 1 ] && grep -q "$expected" "$work/$name.plan" &&
    grep -qF "$(sed 's/.*error: //' "$work/$name.plan")" "$work/$name.log" ||
    { echo "$name: not titan train's one line"; cat "$work/$name.plan" "$work/$name.log"; exit 1; }
done
for policy in default never; do
  bf16=(--training.mixed_precision_param=bfloat16 --parallelism.fsdp_reshard_after_forward=$policy)
  "$titan" plan "${common[@]}" "${bf16[@]}" --nproc 2 --json > "$work/fsdp2bf16$policy.plan"
  "$titan" launch --nproc 2 train "${common[@]}" "${bf16[@]}" --threads 1 \
    --job.dump_folder="$work/fsdp2bf16$policy" --metrics.save_jsonl="$work/fsdp2bf16$policy.jsonl" \
    > "$work/fsdp2bf16$policy.log" 2>&1 || { cat "$work/fsdp2bf16$policy.log"; exit 1; }
done
grep -q "(2 micro-batches per rank)" "$work/single.log" || { cat "$work/single.log"; exit 1; }
python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
MiB = 2**20
failed = []
for name, ranks, shard, micro in (("single", 1, 1, 2), ("ckpt", 1, 1, 2), ("ddp2", 2, 1, 1),
                                  ("fsdp2", 2, 2, 1), ("fsdp2bf16default", 2, 2, 1),
                                  ("fsdp2bf16never", 2, 2, 1), ("tp2ckpt", 2, 1, 2),
                                  ("ep2", 2, 2, 1), ("ep2bf16", 2, 2, 1), ("fsdp2ep2", 4, 4, 1),
                                  ("fsdp2ep2bf16", 4, 4, 1), ("tp2ep2", 2, 1, 2),
                                  ("tp2ep2nosp", 2, 1, 2), ("fsdp2tp2ep2", 4, 2, 1),
                                  ("tp2ep4", 4, 2, 1), ("ddp2tp2ep2", 4, 1, 1),
                                  ("hsdp2fsdp2ep2", 8, 4, 1), ("tp2moe", 2, 1, 2),
                                  ("tp2moenosp", 2, 1, 2), ("fsdp2tp2moe", 4, 2, 1),
                                  ("fsdp2tp2ckpt", 4, 2, 1), ("fsdp2ep2ckpt", 4, 4, 1),
                                  ("fsdp2tp2ep2ckpt", 4, 2, 1)):
    plan = json.load(open(f"{work}/{name}.plan"))
    assert (plan["ranks"], plan["dp_shard"], plan["micro_batches"]) == (ranks, shard, micro), plan
    records = [json.loads(l) for l in open(f"{work}/{name}.jsonl") if '"loss"' in l]
    assert len(records) == 3, f"{name}: {len(records)} step records"
    last = records[-1]  # peaks are running maxima
    measured = round(last["memory_peak_gib"] * 2**30)
    predicted = plan["memory_bytes"]["peak"]
    saves = ("ckpt", "tp2ckpt", "fsdp2tp2ckpt", "fsdp2ep2ckpt", "fsdp2tp2ep2ckpt")
    assert (predicted > plan["memory_bytes"]["step_peak"]) == (name in saves), plan["memory_bytes"]
    # The step's categories (a save adds the writer's staging to "other").
    by_category = plan["memory_bytes"]["step_by_category"]
    cats = ", ".join(f"{c} {by_category[c] / MiB:.2f} / {last['memory_peak_by_category_gib'][c] * 2**30 / MiB:.2f}"
                     for c in ("parameters", "gradients", "optimizer", "activations", "other"))
    print(f"{name}: predicted peak {predicted} bytes, measured {measured}; by category, "
          f"predicted / measured peak MiB: {cats}")
    if predicted != measured:  # a save's too: its staging and the one tensor gathered on rank 0
        failed.append(f"{name} peak: planned {predicted}, measured {measured}")
    if "ckpt" not in name:  # (a save's whole tensor and moments count as parameters and optimizer)
        # Under EP the rank's experts (under FSDP their shards), not the whole model's; the
        # arena's rooms for the most rows that can arrive at them (every rank's tokens -- under
        # EP x TP its sequence shard's -- choosing this rank's experts); FSDP x EP's units in
        # flight of both kinds of shards.
        for c in ("parameters", "gradients", "optimizer", "activations"):
            got = round(last["memory_peak_by_category_gib"][c] * 2**30)
            if by_category[c] != got:
                failed.append(f"{name} {c}: planned {by_category[c]}, measured {got}")
assert not failed, f"the plan is not the measured run's: {failed}"
PY

# 3. The final export's peak on rank 0 (the trainer's line) equals titan plan's export_peak: one
#    process, and FSDP 2 in fp32 and bf16, where rank 0 gathers one run of a unit at a time (the
#    largest, the embedding unit: export_gather) and writes it, the others holding nothing more.
for name in export1 export2 export2bf16 export2tp export2ep export4fsdpep export4fsdptp; do
  flags=("${common[@]}" --checkpoint.last_save_in_hf=true)
  [ "$name" = export2bf16 ] && flags+=(--training.mixed_precision_param=bfloat16)
  [ "$name" = export2tp ] && flags+=("${tp[@]}")
  [ "$name" = export2ep ] && flags+=("${ep[@]}")
  [ "$name" = export4fsdpep ] && flags+=("${fsdp_ep[@]}")
  [ "$name" = export4fsdptp ] && flags+=("${tp[@]}")
  nproc=2 train=("$titan" launch --nproc 2 train)
  [ "$name" = export1 ] && nproc=1 train=("$titan" train)
  [[ "$name" = export4* ]] && nproc=4 train=("$titan" launch --nproc 4 train)
  "$titan" plan "${flags[@]}" --nproc $nproc --json > "$work/$name.plan"
  "${train[@]}" "${flags[@]}" --threads 1 --job.dump_folder="$work/$name" > "$work/$name.log" 2>&1 \
    || { cat "$work/$name.log"; exit 1; }
done
python3 - "$work" <<'PY'
import json, re, sys
work = sys.argv[1]
for name, gathers in (("export1", False), ("export2", True), ("export2bf16", True),
                      ("export2tp", True), ("export2ep", True), ("export4fsdpep", True),
                      ("export4fsdptp", True)):
    memory = json.load(open(f"{work}/{name}.plan"))["memory_bytes"]
    measured = int(re.search(r"the export's peak memory on rank 0: (\d+) bytes",
                             open(f"{work}/{name}.log").read()).group(1))
    assert (memory["export_gather"] > 0) == gathers, memory
    print(f"{name}: export peak predicted {memory['export_peak']} bytes, measured {measured} "
          f"(one run gathered: {memory['export_gather']} bytes)")
    assert memory["export_peak"] == measured, (name, memory["export_peak"], measured)
PY

# 4. LoRA, the base held in bf16, FSDP 2.
lora=(--preset hf --model.hf_assets_path="$work/export1/hf" --checkpoint.initial_load_path="$work/export1/hf"
      --checkpoint.initial_load_in_hf=true "${common[@]}" --checkpoint.last_save_in_hf=true
      --lora.rank=8 --lora.alpha=16 --lora.merge_on_export=true --training.mixed_precision_param=bfloat16
      --lora.base_dtype=bfloat16 --parallelism.data_parallel_shard_degree=2)
"$titan" plan "${lora[@]}" --nproc 2 --json > "$work/lorabase.plan"
"$titan" launch --nproc 2 train "${lora[@]}" --threads 1 --job.dump_folder="$work/lorabase" \
  --metrics.save_jsonl="$work/lorabase.jsonl" > "$work/lorabase.log" 2>&1 || { cat "$work/lorabase.log"; exit 1; }
python3 - "$work" <<'PY'
import json, re, sys
work = sys.argv[1]
memory = json.load(open(f"{work}/lorabase.plan"))["memory_bytes"]
records = [json.loads(l) for l in open(f"{work}/lorabase.jsonl") if '"loss"' in l]
measured = round(records[-1]["memory_peak_gib"] * 2**30)
print(f"LoRA, bf16 base, FSDP 2: step peak predicted {memory['step_peak']} bytes, measured {measured} "
      f"(its bf16 shards {memory['compute_copies']} bytes)")
assert memory["compute_copies"] > 0 and memory["step_peak"] == measured, (memory, measured)
exported = int(re.search(r"the export's peak memory on rank 0: (\d+) bytes",
                         open(f"{work}/lorabase.log").read()).group(1))
print(f"LoRA, bf16 base, FSDP 2: merged export peak predicted {memory['export_peak']} bytes, measured "
      f"{exported} (the shards widened and one run gathered: {memory['export_gather']} bytes)")
assert memory["export_peak"] == exported, (memory["export_peak"], exported)
PY

# 2. Errors: one line each, the trainer's own for the same config.
error_of() {  # error_of LOG: the message after "error: " of the log's one line
  [ "$(wc -l < "$1")" = 1 ] || { echo "expected one line:"; cat "$1"; exit 1; }
  sed 's/.*error: //' "$1"
}
# (sizes beyond 1 EiB are refused by both in the same line, never wrapped: train/job_resolve.h)
for flags in "--training.seq_len=100000" "--model.flavor=nope" "--training.no_such_key=1" \
             "--activation_checkpoint.mode=some" "--training.local_batch_size=100000000000000" \
             "--training.global_batch_size=9000000000000000000"; do
  if "$titan" plan "$flags" > "$work/plan.err" 2>&1; then echo "plan $flags ran"; exit 1; fi
  if "$titan" train "$flags" --job.dump_folder="$work/bad" > "$work/train.err" 2>&1; then echo "train $flags ran"; exit 1; fi
  [ "$(error_of "$work/plan.err")" = "$(error_of "$work/train.err")" ] || {
    echo "plan and train differ on $flags:"; cat "$work/plan.err" "$work/train.err"; exit 1; }
done
if "$titan" plan --nproc 2 --parallelism.data_parallel_replicate_degree=3 > "$work/mesh.err" 2>&1; then
  echo "a mesh of 3 over 2 ranks was planned"; exit 1
fi
expect_line() {  # expect_line LOG PATTERN: the log is one line, matching
  error_of "$1" > /dev/null
  grep -q -- "$2" "$1" || { echo "expected '$2':"; cat "$1"; exit 1; }
}
expect_line "$work/mesh.err" "data_parallel_replicate_degree = 3 does not divide the world of 2 ranks"
for nproc in 0 -1 x; do
  if "$titan" plan --nproc "$nproc" > "$work/nproc.err" 2>&1; then echo "--nproc $nproc was planned"; exit 1; fi
  expect_line "$work/nproc.err" "--nproc"
done
# HSDP: the shards' gradients all-reduced over the replicas once a step.
"$titan" plan --nproc 4 --parallelism.data_parallel_replicate_degree=2 > "$work/hsdp.txt"
for line in "4 ranks: HSDP (dp_replicate 2 x dp_shard 2)" "all-reduce"; do
  grep -q "$line" "$work/hsdp.txt" || { echo "expected '$line':"; cat "$work/hsdp.txt"; exit 1; }
done
# The bf16 loss holds an fp32 row and a bf16 row of logits per thread, and per thread but the first a share of
# a chunk's d x (256 tokens x hidden 1024 here): the plan counts a rank's threads as train sets them (--threads,
# else the cores shared by --nproc ranks), here Qwen3's vocabulary of 151936.
# A short sequence, so that the loss's workspace is larger than the layers' scratch it reuses.
for threads in 1 3; do
  "$titan" plan --preset qwen3_0.6b --training.mixed_precision_param=bfloat16 --threads $threads \
    --training.local_batch_size=1 --training.seq_len=256 --json > "$work/threads$threads.plan"
done
python3 - "$work" <<'PY'
import json, sys
activations = [json.load(open(f"{sys.argv[1]}/threads{t}.plan"))["memory_bytes"]["step_by_category"]["activations"]
               for t in (1, 3)]
assert activations[1] - activations[0] == 2 * (151936 * 4 + 151936 * 2 + 256 * 1024 * 4), activations
PY
echo "plan_memory: ok"
