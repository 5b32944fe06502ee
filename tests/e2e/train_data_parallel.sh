#!/usr/bin/env bash
# `titan train` on several ranks (titan launch -> mpirun, oversubscribed on this 2-core machine):
#  1. data parallelism over 2 and 4 ranks -- replicated parameters (DDP), FSDP 2 and 4 (the
#     default mesh: data_parallel_shard_degree = -1; 3 pads every dim 0 of the tiny model), HSDP 2 x 2 -- computes the single process's
#     run with the same global batch: the first 10 losses and grad norms within 1e-5 relative,
#     the exported weights within 1e-6; an untied MoE model under FSDP 3 and 2 likewise; bf16
#     mixed precision under FSDP 3 (dense) and 2 (MoE), from scratch and resumed from the single
#     process's checkpoint, likewise (bf16 bounds);
#  2. a resumed 2-rank run equals the uninterrupted one bit for bit, and a 2-rank checkpoint
#     resumes on one process; under FSDP, each shard rank writes its rows (sharding.json indexes
#     them): FSDP 2 resumes on FSDP 2 bit for bit and reshards onto 4 ranks and onto one process,
#     a single-process checkpoint loads into FSDP 3's shards, and HSDP 2 x 2's checkpoint (replica
#     0 writes) resumes on FSDP 2, each continuing within 1e-5; a missing shard file is one line;
#     Hugging Face weights load into FSDP 3's shards, in fp32 and in bf16;
#  3. bad meshes get one line; an error on one rank, a rank out of memory (its allocator refuses
#     the parameters: one line naming the bytes and what they were for), a rank killed with SIGKILL
#     and a rank that hangs (SIGSTOP: comm.train_timeout_seconds) end the whole job within 60 s,
#     the failing rank's message printed once.
# usage: train_data_parallel.sh TITAN PYTHON [equal|resume|failures]: one part (1, 2, 3 above), or
# all; ctest runs each part as its own test, so that each stays well inside its time limit under
# the sanitizers.
set -euo pipefail
titan=$(realpath "$1")
python="$2"
part="${3:-all}"
case "$part" in equal|resume|failures|all) ;; *) echo "unknown part '$part'"; exit 2 ;; esac
in_part() { [ "$part" = all ] || [ "$part" = "$1" ]; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
. "$(dirname "$0")/mpi_env.sh"

common=(--training.steps=10 --training.seq_len=64 --training.local_batch_size=1
        --training.global_batch_size=12 --lr_scheduler.warmup_steps=2 --metrics.log_freq=1
        --threads 1)
one_line() {  # one_line LOG PATTERN: exactly one line of the log matches
  [ "$(grep -c -- "$2" "$1")" = 1 ] || { echo "expected one line matching '$2':"; cat "$1"; exit 1; }
}
dp() { echo --parallelism.data_parallel_replicate_degree="$1" --parallelism.data_parallel_shard_degree=1; }
ckpt=(--checkpoint.enable=true --checkpoint.interval=4 --checkpoint.keep_latest_k=0 --checkpoint.last_save_in_hf=false)

# 1. One process (12 micro-batches a step) against 2, 3 and 4 ranks (6, 4 and 3 each); part 2
# loads its exported weights too.
if in_part equal || in_part resume; then
"$titan" train "${common[@]}" --job.dump_folder="$work/single" \
  --metrics.save_jsonl="$work/single.jsonl" > "$work/single.log"
fi
if in_part equal; then
# FSDP 2 also validates every 3 steps (a forward without backward must not leave the last block,
# kept after its forward by default, stale for the next step); FSDP 3 keeps every unit from its
# forward to its backward, FSDP 4 gathers each again (fsdp_reshard_after_forward never, always).
validate="--validation.enable=true --validation.dataset_path=/usr/share/doc/jargon-text/jargon.txt.gz --validation.freq=3 --validation.steps=1"
runs=("dp2 2 $(dp 2)" "dp4 4 $(dp 4)" "fsdp2 2 $validate"
      "fsdp3 3 --parallelism.fsdp_reshard_after_forward=never"
      "fsdp4 4 --parallelism.fsdp_reshard_after_forward=always"
      "hsdp2x2 4 --parallelism.data_parallel_replicate_degree=2")
for run in "${runs[@]}"; do
  read -r name n mesh <<< "$run"
  # shellcheck disable=SC2086
  "$titan" launch --nproc "$n" train "${common[@]}" $mesh --job.dump_folder="$work/$name" \
    --metrics.save_jsonl="$work/$name.jsonl" > "$work/$name.log" 2>&1 || { cat "$work/$name.log"; exit 1; }
  grep -q "data parallel over $n ranks" "$work/$name.log" || { echo "$name: no mesh line"; cat "$work/$name.log"; exit 1; }
  [ "$(grep -c '^step ' "$work/$name.log")" = 10 ] || { echo "$name: expected 10 step lines from rank 0 only"; cat "$work/$name.log"; exit 1; }
done
grep -q "dp_replicate 2 x dp_shard 2 .*FSDP" "$work/hsdp2x2.log" || { echo "hsdp2x2: not a 2 x 2 FSDP mesh"; cat "$work/hsdp2x2.log"; exit 1; }
# equal_to_single [--untied] REF RUN...: each run's 10 losses and grad norms within 1e-5 relative
# of REF's, its exported weights within 1e-6. --untied: but the embedding table's, whose sparse
# rows AdamW makes sensitive to the order of float sums -- an element whose gradient sum nearly
# cancels gets m / sqrt(v) of either sign -- so that it moves by up to 3e-5 in one process when only
# the micro-batch split changes (local_batch_size 2 against 1, measured on tiny_moe) and 8e-6
# under DDP 2, where FSDP plays no part; its rows' mistakes would show in the losses.
equal_to_single() {
"$python" - "$work" "$@" <<'PY'
import json, sys, torch
from safetensors.torch import load_file
args = sys.argv[1:]
untied = args[1] == "--untied"
if untied:
    del args[1]
work, reference, names = args[0], args[1], args[2:]
def records(name):
    return [json.loads(l) for l in open(f"{work}/{name}.jsonl") if '"loss"' in l]
single = records(reference)
assert len(single) == 10, len(single)
ref = load_file(f"{work}/{reference}/hf/model.safetensors")
for name in names:
    run = records(name)
    assert [r["step"] for r in run] == [r["step"] for r in single], f"{name}: steps differ"
    for a, b in zip(single, run):
        for key in ("loss", "grad_norm"):
            rel = abs(a[key] - b[key]) / abs(a[key])
            assert rel <= 1e-5, f"{name} step {a['step']} {key}: {b[key]} vs {a[key]} ({rel:.2e})"
    got = load_file(f"{work}/{name}/hf/model.safetensors")
    assert got.keys() == ref.keys(), f"{name}: exported tensors differ"
    checked = [k for k in ref if not (untied and k == "model.embed_tokens.weight")]
    worst = max((got[k].float() - ref[k].float()).abs().max().item() for k in checked)
    assert worst <= 1e-6, f"{name}: exported weights differ by {worst}"
    print(f"{name}: 10 losses and grad norms within 1e-5 of one process; export within {worst:.1e}")
PY
}
equal_to_single single dp2 dp4 fsdp2 fsdp3 fsdp4 hsdp2x2

# An untied model (tiny_moe: its embedding and [norm, lm_head] are separate FSDP units; the stacked
# experts sharded on their expert dim), every unit kept from its forward to its backward and
# validated (a forward without backward keeps none), then gathered again each time.
moe=(--model.flavor=tiny_moe)
"$titan" train "${common[@]}" "${moe[@]}" --job.dump_folder="$work/moe1" \
  --metrics.save_jsonl="$work/moe1.jsonl" > "$work/moe1.log" 2>&1 || { cat "$work/moe1.log"; exit 1; }
for run in "moe3never 3 --parallelism.fsdp_reshard_after_forward=never" \
           "moe2always 2 --parallelism.fsdp_reshard_after_forward=always"; do
  read -r name n policy <<< "$run"
  # shellcheck disable=SC2086
  "$titan" launch --nproc "$n" train "${common[@]}" "${moe[@]}" $policy $validate \
    --job.dump_folder="$work/$name" --metrics.save_jsonl="$work/$name.jsonl" > "$work/$name.log" 2>&1 \
    || { cat "$work/$name.log"; exit 1; }
done
equal_to_single --untied moe1 moe3never moe2always

# bf16 mixed precision under FSDP: the matmul weights are gathered in bf16 (each rank's rows
# rounded, which is the whole master rounded) into each unit's copies at every acquire, the tied
# embedding in fp32 for the lookup and in bf16 into the lm_head's copy for the loss. Step 1 starts from the same masters, so its bf16
# products are the single process's and only fp32 sums differ in order: fp32's bounds. Later steps' masters differ at
# float rounding; a master that lies at a bf16 rounding boundary then rounds to the neighbouring
# bf16 value (a 2^-8 step) on one side, so later steps get bounds of a fraction of bf16's
# precision (loss 1e-4, grad norm 2e-3 = half a bf16 ulp); a stale or misplaced unit moves a loss
# by far more (whole-model bf16 rounding errors are 1e-3 to 1e-2 of the loss).
bf16=(--training.mixed_precision_param=bfloat16 "${ckpt[@]}")
# The tied dense model on FSDP 3, and the untied MoE model (the lm_head gathered in bf16 in its own
# unit, the embedding in fp32 for the lookup) on FSDP 2, each from scratch and resumed from the
# one-process run's step-4 checkpoint. A step that starts from the same masters (step 1; step 5
# resumed) has the one process's bf16 products: fp32's bounds. With experts, a token near a top-k
# tie changes experts when a bf16 copy upstream rounds the other way, which moves that step's grad
# norm by percents -- measured on tiny_moe (steps 2-10): changing only the micro-batch split in
# one process (local_batch_size 2 and 3 against 1) moved step 8's by 6e-3 and 2.5e-3, FSDP 2 by
# 2.9e-2, the losses by at most 4e-5 -- so the MoE grad norm is compared only from the same masters.
for run in "bf 3 2e-3" "bfmoe 2 - --model.flavor=tiny_moe"; do
  read -r name n grad_bound model <<< "$run"
  # shellcheck disable=SC2086
  "$titan" train "${common[@]}" "${bf16[@]}" $model --job.dump_folder="$work/${name}1" \
    --metrics.save_jsonl="$work/${name}1.jsonl" > "$work/${name}1.log" 2>&1 || { cat "$work/${name}1.log"; exit 1; }
  cp -r "$work/${name}1" "$work/${name}${n}r"
  rm -rf "$work/${name}${n}r/checkpoint/step-8" "$work/${name}${n}r/checkpoint/step-10"
  # The run from scratch also exports its weights (an FSDP unit in bf16 holds the weights read
  # only in bf16 last; the export is in Hugging Face order all the same).
  for run_spec in "$name$n true" "${name}${n}r false"; do
    read -r run_name export <<< "$run_spec"
    # shellcheck disable=SC2086
    "$titan" launch --nproc "$n" train "${common[@]}" "${bf16[@]}" $model --checkpoint.last_save_in_hf="$export" \
      --job.dump_folder="$work/$run_name" --metrics.save_jsonl="$work/$run_name.jsonl" > "$work/$run_name.log" 2>&1 \
      || { cat "$work/$run_name.log"; exit 1; }
    grep -q "mixed precision: matmuls in bf16" "$work/$run_name.log" || { echo "$run_name: not bf16"; cat "$work/$run_name.log"; exit 1; }
  done
  "$python" - "$work/$name$n" <<'PY'
import json, sys, torch
from safetensors.torch import load_file
run = sys.argv[1]
hf = load_file(f"{run}/hf/model.safetensors")
step = f"{run}/checkpoint/step-10"
index = json.load(open(f"{step}/sharding.json"))
shards = [load_file(f"{step}/model.shard-{i}-of-{index['shards']}.safetensors")
          for i in range(index["shards"])]
exported = set()
for name, p in index["parameters"].items():
    whole = torch.cat([shards[i][name][:rows] for i, (_, rows) in enumerate(p["rows"])])
    if name in hf:
        parts = {name: whole}
    else:  # stacked experts, one HF tensor per expert
        prefix, proj = name.rsplit(".", 1)
        parts = {f"{prefix}.{e}.{proj}.weight": whole[e] for e in range(whole.shape[0])}
    for key, t in parts.items():
        assert torch.equal(hf[key], t), f"{run}: exported {key} is not the final checkpoint's master"
    exported |= parts.keys()
assert exported == hf.keys(), sorted(exported ^ hf.keys())
print(f"{run}: the Hugging Face export holds the final checkpoint's masters exactly")
PY
  grep -q "resumed step 4 from" "$work/${name}${n}r.log" || { echo "${name}${n}r did not resume"; cat "$work/${name}${n}r.log"; exit 1; }
  "$python" - "$work/${name}1.jsonl" "$work/$name$n.jsonl" "$work/${name}${n}r.jsonl" "$grad_bound" <<'PY'
import json, sys
one, many, resumed = ({r["step"]: r for r in map(json.loads, open(p)) if "loss" in r}
                      for p in sys.argv[1:4])
assert list(one) == list(many) == list(range(1, 11)) and list(resumed) == list(range(5, 11)), \
    (list(one), list(many), list(resumed))
def rel(a, b, key):
    return abs(a[key] - b[key]) / abs(a[key])
for run, step in ((many, 1), (resumed, 5)):  # from the same masters
    a, b = one[step], run[step]
    assert rel(a, b, "loss") <= 1e-6 and rel(a, b, "grad_norm") <= 1e-5, (a, b)
for run in (many, resumed):
    for step, b in run.items():
        a = one[step]
        assert rel(a, b, "loss") <= 1e-4, (a, b)
        assert sys.argv[4] == "-" or rel(a, b, "grad_norm") <= float(sys.argv[4]), (a, b)
print(f"bf16 under FSDP ({sys.argv[2]}): steps 1 and 5 (resumed) equal to one process within "
      "fp32's bounds, 10 steps within bf16's")
PY
done

fi

# 2. Resume on 2 ranks, bit for bit; and the 2-rank checkpoint on one process.
if in_part resume; then
losses() { python3 -c 'import json,sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "loss" in r and r["step"] > 4: print(r["step"], repr(r["loss"]), repr(r["grad_norm"]))' "$1"; }
# shellcheck disable=SC2046
"$titan" launch --nproc 2 train "${common[@]}" $(dp 2) "${ckpt[@]}" --job.dump_folder="$work/r2" \
  --metrics.save_jsonl="$work/r2.full.jsonl" > "$work/r2.full.log" 2>&1 || { cat "$work/r2.full.log"; exit 1; }
cp -r "$work/r2" "$work/r1"
rm -rf "$work/r2/checkpoint/step-8" "$work/r2/checkpoint/step-10" "$work/r1/checkpoint/step-8" "$work/r1/checkpoint/step-10"
# shellcheck disable=SC2046
"$titan" launch --nproc 2 train "${common[@]}" $(dp 2) "${ckpt[@]}" --job.dump_folder="$work/r2" \
  --metrics.save_jsonl="$work/r2.resumed.jsonl" > "$work/r2.resumed.log" 2>&1 || { cat "$work/r2.resumed.log"; exit 1; }
grep -q "resumed step 4 from" "$work/r2.resumed.log" || { echo "2 ranks did not resume"; cat "$work/r2.resumed.log"; exit 1; }
diff <(losses "$work/r2.full.jsonl") <(losses "$work/r2.resumed.jsonl") || { echo "resumed 2-rank losses differ"; exit 1; }
[ "$(losses "$work/r2.full.jsonl" | wc -l)" = 6 ] || { echo "expected 6 compared steps"; exit 1; }
"$titan" train "${common[@]}" "${ckpt[@]}" --job.dump_folder="$work/r1" \
  --metrics.save_jsonl="$work/r1.resumed.jsonl" > "$work/r1.resumed.log"
grep -q "resumed step 4 from" "$work/r1.resumed.log" || { echo "one process did not resume"; cat "$work/r1.resumed.log"; exit 1; }
"$python" - "$work/r2.full.jsonl" "$work/r1.resumed.jsonl" <<'PY'
import json, sys
a, b = ([json.loads(l) for l in open(p) if '"loss"' in l] for p in sys.argv[1:])
a = {r["step"]: r["loss"] for r in a if r["step"] > 4}
b = {r["step"]: r["loss"] for r in b}
assert a.keys() == b.keys(), (a.keys(), b.keys())
for s in a:
    assert abs(a[s] - b[s]) <= 1e-5 * abs(a[s]), f"step {s}: {b[s]} on one process vs {a[s]} on 2 ranks"
print("a 2-rank checkpoint resumed on one process continues the run within 1e-5")
PY

# Sharded checkpoints. resume NAME NPROC FROM MESH...: a copy of run FROM's folder without steps 8
# and 10, resumed on NPROC ranks (1: one process) with MESH; its losses in $work/NAME.jsonl.
resume() {
  local name="$1" n="$2" from="$3"
  shift 3
  cp -r "$work/$from" "$work/$name"
  rm -rf "$work/$name/checkpoint/step-8" "$work/$name/checkpoint/step-10"
  if [ "$n" = 1 ]; then
    "$titan" train "${common[@]}" "${ckpt[@]}" "$@" --job.dump_folder="$work/$name"       --metrics.save_jsonl="$work/$name.jsonl" > "$work/$name.log" 2>&1 || { cat "$work/$name.log"; exit 1; }
  else
    "$titan" launch --nproc "$n" train "${common[@]}" "${ckpt[@]}" "$@" --job.dump_folder="$work/$name"       --metrics.save_jsonl="$work/$name.jsonl" > "$work/$name.log" 2>&1 || { cat "$work/$name.log"; exit 1; }
  fi
  grep -q "resumed step 4 from" "$work/$name.log" || { echo "$name did not resume"; cat "$work/$name.log"; exit 1; }
}
"$titan" launch --nproc 2 train "${common[@]}" "${ckpt[@]}" --job.dump_folder="$work/f2" \
  --metrics.save_jsonl="$work/f2.full.jsonl" > "$work/f2.full.log" 2>&1 || { cat "$work/f2.full.log"; exit 1; }
"$titan" launch --nproc 4 train "${common[@]}" "${ckpt[@]}" --parallelism.data_parallel_replicate_degree=2 \
  --job.dump_folder="$work/h22" --metrics.save_jsonl="$work/h22.full.jsonl" > "$work/h22.full.log" 2>&1 || { cat "$work/h22.full.log"; exit 1; }
resume f2to2 2 f2
diff <(losses "$work/f2.full.jsonl") <(losses "$work/f2to2.jsonl") || { echo "FSDP 2 resumed on FSDP 2: losses differ"; exit 1; }
resume f2to4 4 f2
resume f2to1 1 f2
resume r1to3 3 r1
resume h22to2 2 h22
"$python" - "$work" <<'PY'
import json, sys
from safetensors import safe_open
work = sys.argv[1]
# The layout: each shard file holds c = ceil(d0 / 2) rows of every tensor; sharding.json says
# which are real, and together they hold every row once.
step = f"{work}/f2/checkpoint/step-4"
index = json.load(open(f"{step}/sharding.json"))
assert index["shards"] == 2, index["shards"]
files = [safe_open(f"{step}/{kind}.shard-{i}-of-2.safetensors", "pt")
         for kind in ("model", "optimizer") for i in range(2)]
for name, p in index["parameters"].items():
    d0 = p["shape"][0]
    c = (d0 + 1) // 2
    assert [r[0] for r in p["rows"]] == [0, min(c, d0)], (name, p["rows"])
    assert sum(r[1] for r in p["rows"]) == d0, (name, p["rows"])
    for i in range(2):
        shape = list(files[i].get_slice(name).get_shape())
        assert shape == [c] + p["shape"][1:], (name, shape)
        for prefix in ("exp_avg.", "exp_avg_sq."):
            assert list(files[2 + i].get_slice(prefix + name).get_shape()) == shape, (prefix, name)
def losses(name, after=4):
    return {r["step"]: r["loss"] for r in map(json.loads, open(f"{work}/{name}.jsonl"))
            if "loss" in r and r["step"] > after}
for name, ref in (("f2to4", "f2.full"), ("f2to1", "f2.full"), ("r1to3", "r2.full"),
                  ("h22to2", "h22.full")):
    a, b = losses(ref), losses(name)
    assert a.keys() == b.keys() and len(a) == 6, (name, a.keys(), b.keys())
    for s in a:
        assert abs(a[s] - b[s]) <= 1e-5 * abs(a[s]), f"{name} step {s}: {b[s]} vs {a[s]}"
print("sharded checkpoints: FSDP 2 -> 2 bit for bit; 2 -> 4, 2 -> 1, 1 -> 3, HSDP 2x2 -> 2 within 1e-5")
PY
# Hugging Face weights load straight into each rank's rows: FSDP 3 from the single run's export
# starts where one process loading it starts.
hf=(--training.steps=2 --checkpoint.initial_load_path="$work/single/hf" --checkpoint.initial_load_in_hf=true
    --checkpoint.initial_load_model_only=true --checkpoint.last_save_in_hf=false)
"$titan" train "${common[@]}" "${hf[@]}" --job.dump_folder="$work/hf1" --metrics.save_jsonl="$work/hf1.jsonl" \
  > "$work/hf1.log" 2>&1 || { cat "$work/hf1.log"; exit 1; }
"$titan" launch --nproc 3 train "${common[@]}" "${hf[@]}" --job.dump_folder="$work/hf3" \
  --metrics.save_jsonl="$work/hf3.jsonl" > "$work/hf3.log" 2>&1 || { cat "$work/hf3.log"; exit 1; }
"$python" - "$work/hf1.jsonl" "$work/hf3.jsonl" "$work/single.jsonl" <<'PY'
import json, sys
one, three, fresh = ([json.loads(l) for l in open(p) if '"loss"' in l] for p in sys.argv[1:])
assert len(one) == len(three) == 2, (len(one), len(three))
assert one[0]["loss"] < 0.9 * fresh[0]["loss"], "the loaded weights were not used"
for a, b in zip(one, three):
    assert abs(a["loss"] - b["loss"]) <= 1e-5 * a["loss"], (a, b)
print("Hugging Face weights loaded into FSDP 3's shards train as on one process within 1e-5")
PY
# The same under bf16, whose FSDP units hold the weights read only in bf16 last (not in the Hugging
# Face order): step 1 from the same weights within fp32's bounds, step 2 within bf16's (part 1).
for n in 1 3; do
  "$titan" launch --nproc "$n" train "${common[@]}" "${hf[@]}" --training.mixed_precision_param=bfloat16 \
    --job.dump_folder="$work/hf${n}bf" --metrics.save_jsonl="$work/hf${n}bf.jsonl" > "$work/hf${n}bf.log" 2>&1 \
    || { cat "$work/hf${n}bf.log"; exit 1; }
done
"$python" - "$work/hf1bf.jsonl" "$work/hf3bf.jsonl" <<'PY'
import json, sys
one, three = ([json.loads(l) for l in open(p) if '"loss"' in l] for p in sys.argv[1:])
assert len(one) == len(three) == 2, (len(one), len(three))
rel = lambda key, step: abs(one[step][key] - three[step][key]) / abs(one[step][key])
assert rel("loss", 0) <= 1e-6 and rel("grad_norm", 0) <= 1e-5 and rel("loss", 1) <= 1e-4, (one, three)
print("Hugging Face weights loaded into bf16 FSDP 3's shards train as on one process (bf16 bounds)")
PY

rm "$work/f2to2/checkpoint/step-4/model.shard-1-of-2.safetensors"
rm -rf "$work/f2to2/checkpoint/step-8" "$work/f2to2/checkpoint/step-10"
if "$titan" launch --nproc 2 train "${common[@]}" "${ckpt[@]}" --job.dump_folder="$work/f2to2" > "$work/torn.log" 2>&1; then
  echo "a checkpoint missing a shard file was resumed"; exit 1
fi
one_line "$work/torn.log" "step-4/model.shard-1-of-2.safetensors"

fi

# 3. Failures. Each must end with a non-zero status, its message once.
if in_part failures; then
if "$titan" launch --nproc 2 train "${common[@]}" --parallelism.data_parallel_replicate_degree=3 > "$work/bad.log" 2>&1; then
  echo "a mesh of 3 ranks over 2 ran"; exit 1
fi
one_line "$work/bad.log" "data_parallel_replicate_degree = 3 does not divide the world of 2 ranks"
# shellcheck disable=SC2046
if "$titan" train "${common[@]}" $(dp 2) > "$work/bad1.log" 2>&1; then echo "a mesh of 2 on one process ran"; exit 1; fi
one_line "$work/bad1.log" "but the world has 1 (run under mpirun"
[ "$(wc -l < "$work/bad1.log")" = 1 ] || { cat "$work/bad1.log"; exit 1; }
if "$titan" launch --nproc 2 generate --model x > "$work/bad2.log" 2>&1; then echo "launch generate ran"; exit 1; fi
one_line "$work/bad2.log" "titan launch runs titan train"
[ "$(wc -l < "$work/bad2.log")" = 1 ] || { cat "$work/bad2.log"; exit 1; }

# Rank 0 fails while saving (its checkpoint destination is a file) as rank 1 waits for it.
mkdir -p "$work/fail/checkpoint" && echo occupied > "$work/fail/checkpoint/step-2"
start=$(date +%s)
# shellcheck disable=SC2046
if "$titan" launch --nproc 2 train "${common[@]}" $(dp 2) "${ckpt[@]}" --checkpoint.interval=2 \
     --job.dump_folder="$work/fail" > "$work/fail.log" 2>&1; then
  echo "a failed checkpoint save ended with status 0"; exit 1
fi
[ $(( $(date +%s) - start )) -le 60 ] || { echo "the failed job took over 60 s to end"; exit 1; }
one_line "$work/fail.log" "^\[rank 0 of 2\] titan train: error: .*step-2 exists and is not a titan checkpoint"
[ "$(cat "$work/fail/checkpoint/step-2")" = occupied ] || { echo "the file in the checkpoint's way was replaced"; exit 1; }

# Rank 1 out of memory as the model is built: only its allocator is limited, so that the
# debugmodel's whole parameters (122 MB; FSDP reserves each block's 15 MB) do not fit while
# start-up (about 40 MB) does: a heap limit (ulimit -d). AddressSanitizer maps terabytes of shadow
# memory at start-up, past any such limit, so under it rank 1's allocator refuses one allocation
# over 8 MB instead (the parameter blocks; nothing before them is as large), returning null as
# glibc's does under the limit. (ldd's output is read whole first: a grep -q in a pipe could exit
# early, and ldd's SIGPIPE would fail the pipeline under pipefail.)
# A CUDA build's libraries (cuDNN, NVRTC, cuBLASLt) take about 200 MiB of the data limit as they
# are loaded (the binary loads from 206 MB on, where the CPU build's whole start-up fits in 96):
# the limit grows by that much there.
libraries=$(ldd "$titan")
if grep libasan <<< "$libraries" > /dev/null; then
  limit="export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}allocator_may_return_null=1:max_allocation_size_mb=8"
elif grep libcudart <<< "$libraries" > /dev/null; then
  limit='ulimit -d 303104'
else
  limit='ulimit -d 98304'
fi
start=$(date +%s)
if mpirun -np 2 --bind-to none sh -c "if [ \"\$OMPI_COMM_WORLD_RANK\" = 1 ]; then $limit; fi; exec \"\$@\"" sh \
     "$titan" train "${common[@]}" --preset debugmodel --job.dump_folder="$work/oom" > "$work/oom.log" 2>&1; then
  echo "a rank out of memory ended with status 0"; cat "$work/oom.log"; exit 1
fi
[ $(( $(date +%s) - start )) -le 60 ] || { echo "the job with a rank out of memory took over 60 s to end"; exit 1; }
one_line "$work/oom.log" "titan train: error"
one_line "$work/oom.log" "^\[rank 1 of 2\] titan train: error: out of memory: could not allocate [0-9]* bytes for parameters$"

# signal_rank1 NAME SIGNAL ARGS...: a long 2-rank run; once it logs step 2, rank 1 gets SIGNAL; the
# job must then end within 60 s with a non-zero status (its output in $work/NAME.log).
signal_rank1() {
  local name="$1" signal="$2" launcher rank1 start status=0
  shift 2
  "$titan" launch --nproc 2 train "${common[@]}" --training.steps=100000 "$@" \
    --job.dump_folder="$work/$name" > "$work/$name.log" 2>&1 &
  launcher=$!
  for _ in $(seq 1 600); do
    grep -q '^step     2' "$work/$name.log" 2> /dev/null && break
    sleep 0.1
  done
  rank1=$(pgrep -f -n -- "--job.dump_folder=$work/$name" || true)
  [ -n "$rank1" ] || { echo "$name: no rank to signal"; cat "$work/$name.log"; exit 1; }
  kill -"$signal" "$rank1"
  start=$(date +%s)
  wait "$launcher" || status=$?
  kill -KILL "$rank1" 2> /dev/null || true  # a stopped rank outlives the job otherwise
  [ $(( $(date +%s) - start )) -le 60 ] || { echo "$name: the job outlived rank 1 by over 60 s"; exit 1; }
  [ "$status" != 0 ] || { echo "$name: the job ended with status 0"; cat "$work/$name.log"; exit 1; }
}
# Rank 1 killed with SIGKILL mid-run: mpirun names it.
# shellcheck disable=SC2046
signal_rank1 kill KILL $(dp 2)
grep -q "rank 1 .*signal 9" "$work/kill.log" || { echo "no word of the killed rank:"; cat "$work/kill.log"; exit 1; }
# Rank 1 stopped (SIGSTOP: alive, never answering): rank 0's next collective times out.
signal_rank1 hang STOP --comm.train_timeout_seconds=5
one_line "$work/hang.log" "^\[rank 0 of 2\] titan train: error: .* waited 5 s for the other ranks (comm.train_timeout_seconds): rank 1 \(has not reached it\|sent no heartbeat for [0-9]* s\); ending the job$"
fi
echo "data parallel ($part): every check passed"
