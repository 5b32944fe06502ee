#!/usr/bin/env bash
# Ranks that disagree stop at start-up (train/rank_agreement.h): 2-3 ranks under mpirun, each
# started with its own flags (mpirun's A : B form) or its own binary; the job ends with a
# non-zero status (1-127) within 60 s, in one titan line naming the lowest rank that differs, its
# first differing key and both values, and writes nothing. Ranks that agree train as before.
# usage: train_ranks_agree.sh TITAN
set -euo pipefail
titan=$(realpath "$1")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
. "$(dirname "$0")/mpi_env.sh"
common=(--training.seq_len=32 --training.local_batch_size=2 --lr_scheduler.warmup_steps=0
        --training.steps=2 --metrics.log_freq=1 --threads 1)
n=0

# disagree PATTERN RANK0_ARGS -- RANK1_ARGS [-- RANK2_ARGS]: each rank runs "$titan" train with
# common flags and its own; the job must fail in one titan line matching PATTERN.
disagree() {
  local pattern="$1" cmd=() group=() a
  shift
  n=$((n + 1))
  local log="$work/case$n.log" dump="$work/run$n" start=$SECONDS status=0
  for a in "$@" --; do  # each group: a binary, then that rank's own flags
    if [ "$a" = -- ]; then
      [ ${#cmd[@]} -eq 0 ] || cmd+=(:)
      cmd+=(-np 1 "${group[0]}" train "${common[@]}" --job.dump_folder="$dump" "${group[@]:1}")
      group=()
    else
      group+=("$a")
    fi
  done
  mpirun --bind-to none "${cmd[@]}" > "$log" 2>&1 || status=$?
  local took=$((SECONDS - start))
  [ "$status" -ge 1 ] && [ "$status" -le 127 ] || { echo "case $n: exit status $status"; cat "$log"; exit 1; }
  [ "$took" -lt 60 ] || { echo "case $n: took $took s"; exit 1; }
  [ "$(grep -c 'titan train: error: ' "$log")" = 1 ] || { echo "case $n: expected one titan line:"; cat "$log"; exit 1; }
  grep -qE "^\[rank 0 of [23]\] titan train: error: ranks disagree: $pattern" "$log" ||
    { echo "case $n: expected '$pattern':"; cat "$log"; exit 1; }
  [ ! -e "$dump" ] || { echo "case $n: the job wrote $dump"; exit 1; }
}

disagree "rank 1 has training\.seq_len = 64, rank 0 has 32 \(1 of 2 ranks differ from rank 0; every rank must run the same binary and config\)$" \
  "$titan" -- "$titan" --training.seq_len=64
disagree "rank 1 has training\.seed = 7, rank 0 has 0 \(1 of 2 ranks" \
  "$titan" -- "$titan" --training.seed=7
disagree "rank 1 has model\.flavor = 'debugmodel', rank 0 has 'tiny' \(1 of 2 ranks" \
  "$titan" -- "$titan" --model.flavor=debugmodel
disagree "rank 1 has training\.mixed_precision_param = 'bfloat16', rank 0 has 'float32' \(1 of 2 ranks" \
  "$titan" -- "$titan" --training.mixed_precision_param=bfloat16
disagree "rank 1 has checkpoint\.enable = true, rank 0 has false \(1 of 2 ranks" \
  "$titan" -- "$titan" --checkpoint.enable=true
disagree "rank 2 has training\.steps = 3, rank 0 has 2 \(1 of 3 ranks" \
  "$titan" -- "$titan" -- "$titan" --training.steps=3
disagree "rank 1 has training\.steps = 3, rank 0 has 2 \(2 of 3 ranks" \
  "$titan" -- "$titan" --training.steps=3 -- "$titan" --training.seed=1
# Another build: the same binary with a byte appended (still runnable, another fingerprint).
cp "$titan" "$work/titan-other" && printf 'x' >> "$work/titan-other"
disagree "rank 1 runs another titan binary \(fingerprint [0-9a-f]{16} \([0-9]+ bytes\), rank 0's [0-9a-f]{16} \([0-9]+ bytes\)\): run the same build on every rank \(1 of 2 ranks" \
  "$titan" -- "$work/titan-other"

# Ranks that agree train.
mpirun --bind-to none -np 2 "$titan" train "${common[@]}" --job.dump_folder="$work/agree" > "$work/agree.log" 2>&1 ||
  { echo "agreeing ranks failed:"; cat "$work/agree.log"; exit 1; }
grep -q "^summary: loss" "$work/agree.log" || { cat "$work/agree.log"; exit 1; }
echo "train_ranks_agree: ok"
