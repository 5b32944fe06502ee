#!/usr/bin/env bash
# Data parallelism over packed rows of a token file, where each rank reads only its own rows'
# tokens (the others' rows are measured by the document table: data/loader.h): `titan tokenize
# --bin` of the default corpus, then
#  - 10 steps on one process and on DDP 2 and FSDP 2 (titan launch -> mpirun, oversubscribed):
#    losses and grad norms within 1e-5 relative (tests/e2e/equal_to_single.py);
#  - the DDP 2 run's step-4 checkpoint (its loader state saved after the other rank's batches)
#    resumes on one process within 1e-5 of the uninterrupted run, and on DDP 2 bit for bit;
#  - the same on a packed JSON Lines file of the corpus, whose documents' lengths the ranks share
#    (each tokenizes its part of each window and the others' documents its own rows reach):
#    DDP 2 and FSDP 2 within 1e-5 of one process, DDP 2's step-4 checkpoint resumed on one
#    process within 1e-5 of the uninterrupted run;
#  - no run says that every rank tokenizes every row (the note this replaced); a warning on the
#    job's config is said once, not once per rank.
# usage: train_data_share.sh TITAN PYTHON
set -euo pipefail
titan=$(realpath "$1")
python="$2"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
. "$(dirname "$0")/layout_runs.sh"
corpus=/usr/share/doc/jargon-text/jargon.txt.gz
# The default tokenizer (docs/DATA.md), trained into a folder the runs name and into the run's own
# cache (for the text run).
export TITAN_CACHE_DIR="$work/cache"
"$titan" tokenizer train --vocab-size 2048 --out "$work/tok" "$corpus" > /dev/null 2>&1
"$titan" tokenize --tokenizer "$work/tok" --bin "$work/jargon.bin" "$corpus" 2> /dev/null

base=(--training.steps=10 --training.seq_len=64 --training.local_batch_size=1
      --training.global_batch_size=4 --lr_scheduler.warmup_steps=2 --metrics.log_freq=1
      --threads 1 --model.hf_assets_path="$work/tok" --model.flavor=tiny)
common=("${base[@]}" --training.dataset=jargon_bin --training.dataset_path="$work/jargon.bin")
ckpt=(--checkpoint.enable=true --checkpoint.interval=4 --checkpoint.keep_latest_k=0)
ddp2=(--parallelism.data_parallel_replicate_degree=2 --parallelism.data_parallel_shard_degree=1)
note="every rank tokenizes every row"

run single 1
run ddp2 2 "${ddp2[@]}" "${ckpt[@]}"
run fsdp2 2
for name in ddp2 fsdp2; do
  grep -q "data parallel over 2 ranks" "$work/$name.log" || { echo "$name: no mesh line"; cat "$work/$name.log"; exit 1; }
  if grep -q "$note" "$work/$name.log"; then echo "$name: the note on a token file"; cat "$work/$name.log"; exit 1; fi
done
"$python" "$e2e_dir/equal_to_single.py" "$work" single 1 ddp2 fsdp2

# The step-4 checkpoint of DDP 2: on one process, and on DDP 2 again.
for spec in "to1 1" "to2 2 ${ddp2[*]}"; do
  read -r name n mesh <<< "$spec"
  cp -r "$work/ddp2" "$work/$name"
  rm -rf "$work/$name/checkpoint/step-8" "$work/$name/checkpoint/step-10" "$work/$name/hf"
  # shellcheck disable=SC2086
  run "$name" "$n" $mesh "${ckpt[@]}"
  grep -q "resumed step 4 from" "$work/$name.log" || { echo "$name did not resume"; cat "$work/$name.log"; exit 1; }
done
"$python" "$e2e_dir/equal_to_single.py" "$work" single 5 to1
"$python" - "$work" <<'PY'
import json, sys
work = sys.argv[1]
def steps(name):
    return {r["step"]: (r["loss"], r["grad_norm"]) for r in map(json.loads, open(f"{work}/{name}.jsonl"))
            if "loss" in r and r["step"] > 4}
full, resumed = steps("ddp2"), steps("to2")
assert len(full) == 6 and full == resumed, (full, resumed)
print("DDP 2 resumed on DDP 2: steps 5-10 bit for bit")
PY
cmp "$work/ddp2/hf/model.safetensors" "$work/to2/hf/model.safetensors" || { echo "DDP 2 resumed: export differs"; exit 1; }

# The corpus as a JSON Lines file, one paragraph a record: packed text, its lengths shared.
"$python" - "$corpus" "$work/jargon.jsonl" <<'PY'
import gzip, json, re, sys
text = gzip.open(sys.argv[1], "rt", encoding="utf-8").read()
with open(sys.argv[2], "w", encoding="utf-8") as out:
    for p in re.split(r"\n\s*\n", text):
        if p.strip():
            out.write(json.dumps({"text": p}) + "\n")
PY
# Rows of 256 and 8 a step: the 10 steps walk past the first window of documents (256 on 2
# ranks), so a later window's lengths are summed between the steps' collectives.
common=("${base[@]}" --training.dataset=jargon_jsonl --training.dataset_path="$work/jargon.jsonl"
        --training.seq_len=256 --training.local_batch_size=2 --training.global_batch_size=8)
run text_single 1
run text_ddp2 2 "${ddp2[@]}" "${ckpt[@]}"
run text_fsdp2 2
equal_to_single text_single 1 text_ddp2 text_fsdp2
cp -r "$work/text_ddp2" "$work/text_to1"
rm -rf "$work/text_to1/checkpoint/step-8" "$work/text_to1/checkpoint/step-10" "$work/text_to1/hf"
run text_to1 1 "${ckpt[@]}"
grep -q "resumed step 4 from" "$work/text_to1.log" || { echo "text_to1 did not resume"; cat "$work/text_to1.log"; exit 1; }
equal_to_single text_single 5 text_to1
"$python" - "$work/text_ddp2/checkpoint/step-10/trainer_state.json" <<'PY'
import json, sys
# The loader's position after the last step: past the first window's 256 documents.
state = json.loads(json.load(open(sys.argv[1]))["loader_state"])
assert state["epoch"] == 0 and state["file"] == 0 and state["doc"] > 256, state
print(f"text_ddp2: the 10 steps walked {state['doc']} documents, past the first window's 256")
PY
for name in text_ddp2 text_fsdp2; do
  if grep -q "$note" "$work/$name.log"; then echo "$name: the old note"; cat "$work/$name.log"; exit 1; fi
done

# The text corpus on 2 ranks: a key without effect warned of once, and no note.
"$titan" launch --nproc 2 train --training.steps=1 --training.seq_len=64 --training.local_batch_size=1 \
  --training.global_batch_size=2 --threads 1 "${ddp2[@]}" --job.dump_folder="$work/text" \
  --parallelism.enable_sequence_parallel=false \
  > "$work/text.log" 2>&1 || { cat "$work/text.log"; exit 1; }
if grep -q "$note" "$work/text.log"; then echo "text: the old note"; cat "$work/text.log"; exit 1; fi
[ "$(grep -c "^warning: parallelism.enable_sequence_parallel has no effect" "$work/text.log")" = 1 ] ||
  { echo "expected the config warning once:"; cat "$work/text.log"; exit 1; }
echo "data share on a token file and on packed JSON Lines: every check passed"
