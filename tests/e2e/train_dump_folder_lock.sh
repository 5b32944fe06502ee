#!/usr/bin/env bash
# One job per dump folder (io/folder_lock.h): a second `titan train` started on the folder of a
# running one is refused at start-up in one line naming the holder (host, pid), exit 1, and
# changes nothing; under mpirun only rank 0 takes the lock (a 2-rank run is not refused by its
# own rank 1, and a 2-rank second job is refused); a holder killed with SIGKILL leaves no lock
# that blocks: the next run takes it over with a warning; a run that ends removes its note.
# usage: train_dump_folder_lock.sh TITAN
set -euo pipefail
titan=$(realpath "$1")
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2> /dev/null || true; done
  wait 2> /dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
. "$(dirname "$0")/tree_sum.sh"
. "$(dirname "$0")/mpi_env.sh"
common=(--training.seq_len=32 --training.local_batch_size=2 --lr_scheduler.warmup_steps=0
        --checkpoint.enable=true --checkpoint.interval=5 --checkpoint.keep_latest_k=2
        --metrics.log_freq=1000 --threads 1)
note="$work/run/.titan.lock"

# wait_for_note PID: until the running job PID has written its note (it holds the lock then).
wait_for_note() {
  for _ in $(seq 1 600); do
    [ -s "$note" ] && return 0
    kill -0 "$1" 2> /dev/null || { echo "the first job ended early:"; cat "$work/first.log"; exit 1; }
    sleep 0.1
  done
  echo "the first job wrote no $note in 60 s"; exit 1
}

# 1. One process holds the folder; a second one-process job and a 2-rank job are refused.
"$titan" train "${common[@]}" --training.steps=1000000 --job.dump_folder="$work/run" \
  > "$work/first.log" 2>&1 &
first=$!
pids+=("$first")
wait_for_note "$first"
grep -qE "^host [^ ]+, pid $first, since [0-9T:Z-]+$" "$note" || { echo "unexpected note:"; cat "$note"; exit 1; }
holder="host $(hostname), pid $first, since "
start=$SECONDS
expect_refusal second "^titan train: error: job\.dump_folder $work/run is in use by another titan job \($holder[0-9T:Z-]+\): wait for it to end or give this run another job\.dump_folder$" \
  "$titan" train "${common[@]}" --training.steps=3 --job.dump_folder="$work/run"
[ $((SECONDS - start)) -lt 30 ] || { echo "the refusal took $((SECONDS - start)) s"; exit 1; }
status=0
"$titan" train "${common[@]}" --training.steps=3 --job.dump_folder="$work/run" > /dev/null 2>&1 || status=$?
[ "$status" = 1 ] || { echo "the second job exited $status, not 1"; exit 1; }
# The refused jobs changed nothing: the first one's note is still its own, the lock still held.
grep -q "pid $first," "$note" || { echo "the note changed:"; cat "$note"; exit 1; }
if mpirun -np 2 --bind-to none "$titan" train "${common[@]}" --training.steps=3 \
    --job.dump_folder="$work/run" > "$work/mpi_second.log" 2>&1; then
  echo "a 2-rank second job ran"; cat "$work/mpi_second.log"; exit 1
fi
grep -qE "^\[rank 0 of 2\] titan train: error: job\.dump_folder $work/run is in use by another titan job \($holder" \
  "$work/mpi_second.log" || { echo "the 2-rank job's refusal:"; cat "$work/mpi_second.log"; exit 1; }

# 2. The holder killed: its note is left, its lock is not; the next run takes it over, warns
# once, trains, and removes the note when it ends.
kill -9 "$first"
wait "$first" 2> /dev/null || true
[ -s "$note" ] || { echo "the killed job left no note"; exit 1; }
"$titan" train --training.seq_len=32 --training.local_batch_size=2 --threads 1 --lr_scheduler.warmup_steps=0 \
  --training.steps=2 --job.dump_folder="$work/run" > "$work/third.log" 2> "$work/third.err"
[ "$(grep -c '^warning: ' "$work/third.err")" = 1 ] &&
  grep -qE "^warning: job\.dump_folder $work/run: taking over the lock left by host [^ ]+, pid $first, since [0-9T:Z-]+, which ended without releasing it$" "$work/third.err" ||
  { echo "expected the take-over warning:"; cat "$work/third.err"; exit 1; }
[ ! -e "$note" ] || { echo "a run that ended left its note"; exit 1; }

# 3. Under mpirun only rank 0 locks: a 2-rank job runs (its rank 1 does not refuse it) and holds
# the folder against a one-process job.
mpirun -np 2 --bind-to none "$titan" train "${common[@]}" --training.steps=1000000 \
  --job.dump_folder="$work/run2" > "$work/first.log" 2>&1 &
mpi_first=$!
pids+=("$mpi_first")
note="$work/run2/.titan.lock"
wait_for_note "$mpi_first"
expect_refusal mpi_held "^titan train: error: job\.dump_folder $work/run2 is in use by another titan job \(host [^ ]+, pid [0-9]+, since " \
  "$titan" train "${common[@]}" --training.steps=3 --job.dump_folder="$work/run2"
kill -0 "$mpi_first" || { echo "the 2-rank job ended:"; cat "$work/first.log"; exit 1; }
kill -TERM "$mpi_first"
wait "$mpi_first" 2> /dev/null || true
echo "train_dump_folder_lock: ok"
