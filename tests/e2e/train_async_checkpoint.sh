#!/usr/bin/env bash
# checkpoint.async_mode (train/async_checkpoint.h): saves staged in host memory and written on a
# background thread.
#  equal:    a run with async_mode = "async" trains the synchronous run's losses bit for bit and
#            writes the same checkpoint files byte for byte (cmp; job_config.toml differs only in
#            its async_mode line, trainer_state.json only in that file's checksum); resuming from
#            its step-2 continues as resuming from the synchronous step-2 does, bit for bit;
#            async_with_pinned_mem says in one line that it is "async" here.
#  kill:     SIGKILL while step-4 is being written in the background (slowed by the test-only
#            TITAN_TEST_CHECKPOINT_WRITE_DELAY_MS) leaves step-2 complete (keep_latest_k = 1 did
#            not prune it), no step-4 under its final name, and the resumed run equals an
#            uninterrupted one bit for bit; a write that fails in the background (its folder
#            removed under it) stops the run at the next save in one line, non-zero exit.
#  fsdp:     2 ranks of FSDP with async checkpoints: each rank's shard written in the
#            background, the same files as a synchronous FSDP 2 run's, and a resume from step-2
#            equal to the uninterrupted run bit for bit.
#  refused:  a bad async_mode is one line naming key and value, non-zero exit.
# usage: train_async_checkpoint.sh TITAN [equal|kill|fsdp|refused]
set -euo pipefail
titan=$(realpath "$1")
part="${2:-all}"
case "$part" in equal|kill|fsdp|refused|all) ;; *) echo "unknown part '$part'"; exit 2 ;; esac
in_part() { [ "$part" = all ] || [ "$part" = "$1" ]; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
. "$(dirname "$0")/mpi_env.sh"
cd "$work"

fail() { echo "$1"; [ -z "${2:-}" ] || cat "$2"; exit 1; }
base=(--training.steps=6 --lr_scheduler.warmup_steps=2 --training.seq_len=64
      --training.local_batch_size=2 --metrics.log_freq=1 --checkpoint.enable=true
      --checkpoint.interval=2 --checkpoint.keep_latest_k=0 --checkpoint.last_save_in_hf=false
      --job.dump_folder="$work/run" --metrics.save_jsonl=metrics.jsonl)
common=("${base[@]}" --threads 2)
# Losses and grad norms of the steps from $2 on, every digit the JSON holds.
losses() { python3 -c 'import json,sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "loss" in r and r["step"] >= int(sys.argv[2]):
        print(r["step"], repr(r["loss"]), repr(r["grad_norm"]))' "$1" "$2"; }
# same_checkpoint A B: the step folders A and B hold the same files; each equal byte for byte but
# job_config.toml (equal without its async_mode line) and trainer_state.json (equal but for
# job_config.toml's checksum).
same_checkpoint() {
  diff <(ls -A "$1") <(ls -A "$2") > /dev/null || fail "$1 and $2 hold different files: $(ls -A "$1") / $(ls -A "$2")"
  for f in "$1"/*; do
    name=$(basename "$f")
    case "$name" in
      job_config.toml)
        diff <(grep -v '^async_mode = ' "$f") <(grep -v '^async_mode = ' "$2/$name") > /dev/null \
          || fail "$2/$name differs from $f beyond async_mode" ;;
      trainer_state.json)
        python3 -c 'import json,sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
for s in (a, b): s["checksums"].pop("job_config.toml")
sys.exit(a != b)' "$f" "$2/$name" || fail "$2/$name differs from $f beyond job_config.toml's checksum" ;;
      *) cmp -s "$f" "$2/$name" || fail "$2/$name differs from $f" ;;
    esac
  done
}

if in_part equal; then
  "$titan" train "${common[@]}" > sync.log 2>&1 || fail "the synchronous run failed" sync.log
  mv run sync
  losses sync/metrics.jsonl 1 > sync.losses
  "$titan" train "${common[@]}" --checkpoint.async_mode=async > async.log 2>&1 || fail "the async run failed" async.log
  mv run async
  diff <(losses sync/metrics.jsonl 1) <(losses async/metrics.jsonl 1) || fail "async run's losses differ"
  [ "$(losses async/metrics.jsonl 1 | wc -l)" = 6 ] || fail "expected 6 steps" async/metrics.jsonl
  for step in 2 4 6; do
    same_checkpoint sync/checkpoint/step-$step async/checkpoint/step-$step
    grep -q "^checkpoint $work/run/checkpoint/step-$step: state staged in [0-9.]* s, writing in the background" async.log \
      || fail "no staging line for step-$step" async.log
    grep -qE "^checkpoint saved: $work/run/checkpoint/step-$step \([0-9.]+ [KMG]?i?B, [0-9.]+ s in the background since step $step" async.log \
      || fail "no saved line for step-$step" async.log
  done
  [ "$(ls -A async/checkpoint | tr '\n' ' ')" = "step-2 step-4 step-6 " ] || fail "leftovers: $(ls -A async/checkpoint)"
  # Resume each from its step-2 (asynchronously); steps 3-6 and the step-4 files equal.
  for kind in sync async; do
    rm -rf "$kind/checkpoint/step-4" "$kind/checkpoint/step-6" "$kind/metrics.jsonl"
    mv "$kind" run
    "$titan" train "${common[@]}" --checkpoint.async_mode=async > "resume-$kind.log" 2>&1 \
      || fail "resuming the $kind checkpoint failed" "resume-$kind.log"
    grep -q "resumed step 2 from" "resume-$kind.log" || fail "$kind: did not resume from step 2" "resume-$kind.log"
    mv run "$kind"
  done
  diff <(losses sync/metrics.jsonl 3) <(losses async/metrics.jsonl 3) || fail "resumed losses differ"
  [ "$(losses async/metrics.jsonl 3 | wc -l)" = 4 ] || fail "expected 4 resumed steps"
  same_checkpoint sync/checkpoint/step-4 async/checkpoint/step-4
  # async_with_pinned_mem: one line saying it is "async" here; the same losses.
  "$titan" train "${common[@]}" --training.steps=2 --checkpoint.async_mode=async_with_pinned_mem > pinned.log 2>&1 \
    || fail "async_with_pinned_mem failed" pinned.log
  [ "$(grep -c 'the same as "async" here: pinned memory only speeds device-to-host copies' pinned.log)" = 1 ] \
    || fail "no one line for async_with_pinned_mem" pinned.log
  diff <(losses run/metrics.jsonl 1) <(head -2 sync.losses) || fail "pinned run's losses differ"
  rm -rf run
  echo "equal: async checkpoints byte-identical to sync ones (steps 2, 4, 6); resumed runs identical"
fi

if in_part kill; then
  kill_args=("${common[@]}" --training.steps=8 --checkpoint.keep_latest_k=1)
  "$titan" train "${kill_args[@]}" > full.log 2>&1 || fail "the uninterrupted run failed" full.log
  mv run full
  # Every background write waits 4 s after its tensor files: step-2's finishes while steps 3-4
  # run, step-4's is under way when the kill comes.
  TITAN_TEST_CHECKPOINT_WRITE_DELAY_MS=4000 "$titan" train "${kill_args[@]}" --checkpoint.async_mode=async > killed.log 2>&1 &
  pid=$!
  for _ in $(seq 600); do
    grep -q "step-4: state staged" killed.log && break
    kill -0 "$pid" 2> /dev/null || fail "the run ended before step-4 was staged" killed.log
    sleep 0.1
  done
  grep -q "step-4: state staged" killed.log || fail "step-4 was never staged" killed.log
  sleep 1
  kill -9 "$pid"
  wait "$pid" 2> /dev/null || true
  grep -q "^checkpoint saved: .*step-2 " killed.log || fail "step-2 was not committed before step-4's save" killed.log
  ! grep -q "^checkpoint saved: .*step-4 " killed.log || fail "step-4 finished before the kill: no test" killed.log
  [ "$(ls run/checkpoint | tr '\n' ' ')" = "step-2 " ] || fail "expected only step-2 under a final name: $(ls -A run/checkpoint)"
  [ -f run/checkpoint/.step-4.tmp/model.safetensors ] && [ ! -e run/checkpoint/.step-4.tmp/trainer_state.json ] \
    || fail "the kill did not land mid-write: $(ls -A run/checkpoint/.step-4.tmp 2>&1)"
  rm run/metrics.jsonl  # appended to: the resumed run's steps alone
  "$titan" train "${kill_args[@]}" --checkpoint.async_mode=async > resumed.log 2>&1 || fail "the resumed run failed" resumed.log
  grep -q "resumed step 2 from" resumed.log || fail "did not resume from step-2" resumed.log
  diff <(losses full/metrics.jsonl 3) <(losses run/metrics.jsonl 3) || fail "resumed losses differ from the uninterrupted run's"
  [ "$(losses run/metrics.jsonl 3 | wc -l)" = 6 ] || fail "expected steps 3-8"
  [ "$(ls -A run/checkpoint | tr '\n' ' ')" = "step-8 " ] || fail "keep_latest_k = 1 left: $(ls -A run/checkpoint)"
  rm -rf run
  # A background write that fails: its temporary folder removed while it waits.
  TITAN_TEST_CHECKPOINT_WRITE_DELAY_MS=3000 "$titan" train "${common[@]}" --checkpoint.async_mode=async > broken.log 2> broken.err &
  pid=$!
  # Once its tensor files are there the write waits 3 s; the folder goes, the record files fail.
  for _ in $(seq 600); do
    [ -f run/checkpoint/.step-2.tmp/optimizer.safetensors ] && break
    kill -0 "$pid" 2> /dev/null || break
    sleep 0.1
  done
  rm -rf run/checkpoint/.step-2.tmp
  if wait "$pid"; then fail "the run with a failed background write exited 0" broken.log; fi
  [ "$(wc -l < broken.err)" = 1 ] || fail "expected one error line" broken.err
  grep -q "error: checkpoint step-2: the background write failed: " broken.err || fail "unclear error" broken.err
  ! grep -qE "^step +5/" broken.log || fail "the run went past the next save" broken.log
  [ ! -e run/checkpoint/step-2 ] || fail "a failed write was committed"
  echo "kill: step-2 complete and resumed bit for bit after a kill mid-write of step-4; a failed write stops the run"
fi

if in_part fsdp; then
  # The equal and kill parts' folders: `mv run sync` would move into sync, and the broken run's
  # metrics.jsonl in run would be appended to.
  rm -rf sync full run
  fsdp=(--training.global_batch_size=4 --training.local_batch_size=1 --threads 1)  # each rank
  "$titan" launch --nproc 2 train "${base[@]}" "${fsdp[@]}" > fsdp-sync.log 2>&1 || fail "FSDP 2 (sync) failed" fsdp-sync.log
  mv run sync
  "$titan" launch --nproc 2 train "${base[@]}" "${fsdp[@]}" --checkpoint.async_mode=async > fsdp-async.log 2>&1 \
    || fail "FSDP 2 (async) failed" fsdp-async.log
  [ -f run/checkpoint/step-4/model.shard-1-of-2.safetensors ] || fail "no shard of rank 1" fsdp-async.log
  diff <(losses sync/metrics.jsonl 1) <(losses run/metrics.jsonl 1) || fail "FSDP 2 async losses differ"
  for step in 2 4 6; do same_checkpoint sync/checkpoint/step-$step run/checkpoint/step-$step; done
  mv run full
  cp -r full run
  rm -rf run/checkpoint/step-4 run/checkpoint/step-6 run/metrics.jsonl
  "$titan" launch --nproc 2 train "${base[@]}" "${fsdp[@]}" --checkpoint.async_mode=async > fsdp-resumed.log 2>&1 \
    || fail "FSDP 2 (async) resume failed" fsdp-resumed.log
  grep -q "resumed step 2 from" fsdp-resumed.log || fail "FSDP 2 did not resume from step 2" fsdp-resumed.log
  diff <(losses full/metrics.jsonl 3) <(losses run/metrics.jsonl 3) || fail "FSDP 2 resumed losses differ"
  [ "$(losses run/metrics.jsonl 3 | wc -l)" = 4 ] || fail "expected 4 resumed steps"
  for step in 4 6; do same_checkpoint full/checkpoint/step-$step run/checkpoint/step-$step; done
  rm -rf run
  echo "fsdp: FSDP 2 async checkpoints equal sync ones; resumed bit for bit"
fi

if in_part refused; then
  if "$titan" train "${common[@]}" --checkpoint.async_mode=asynch > bad.log 2> bad.err; then fail "async_mode = asynch accepted"; fi
  [ "$(wc -l < bad.err)" = 1 ] || fail "not one line" bad.err
  grep -q "checkpoint.async_mode 'asynch' is not one of" bad.err || fail "unclear refusal" bad.err
  [ ! -e run/checkpoint ] || fail "a refused run wrote checkpoints"
  echo "refused: a bad async_mode is one line"
fi
