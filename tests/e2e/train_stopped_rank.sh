#!/usr/bin/env bash
# A rank that stops (SIGSTOP: alive, never answering) is named by the others (distributed/
# heartbeat.h): 3 ranks under titan launch (mpirun, oversubscribed) with the default timeouts;
# once step 2 is logged rank 1 is stopped, and the job ends within 60 s with a status in 1-127,
# ranks 0 and 2 each printing one line naming rank 1 and comm.heartbeat_timeout_seconds, and no
# other titan error line. Under a short comm.train_timeout_seconds (5 s, below the heartbeats'
# 30), the timed-out collective names rank 1 instead (among the ranks behind).
# usage: train_stopped_rank.sh TITAN
set -euo pipefail
titan=$(realpath "$1")
work=$(mktemp -d)
stopped=""
# On any exit no rank of a job in $work outlives the test (a failed check left a 100000-step job).
trap '[ -z "$stopped" ] || kill -KILL "$stopped" 2> /dev/null || true
      pkill -KILL -f -- "--job.dump_folder=$work/" 2> /dev/null || true; rm -rf "$work"' EXIT
. "$(dirname "$0")/mpi_env.sh"
common=(--training.steps=100000 --training.seq_len=32 --training.local_batch_size=1
        --training.global_batch_size=6 --lr_scheduler.warmup_steps=2 --metrics.log_freq=1
        --parallelism.data_parallel_replicate_degree=3 --parallelism.data_parallel_shard_degree=1
        --threads 1)

# rank_pid DUMP RANK: the pid of that rank of the job writing to DUMP (its MPI rank in its
# environment).
rank_pid() {
  local pid
  for pid in $(pgrep -f -- "--job.dump_folder=$1( |$)"); do
    # grep reads it all: with -q it could exit at the match while tr still writes, and the
    # SIGPIPE fails the pipeline under pipefail (a rank's environment is several pipe writes).
    if tr '\0' '\n' < "/proc/$pid/environ" 2> /dev/null | grep -x "OMPI_COMM_WORLD_RANK=$2" > /dev/null; then
      echo "$pid"
      return
    fi
  done
}

# stop_rank1 NAME ARGS...: a long 3-rank run; once it logs step 2, rank 1 gets SIGSTOP; the job
# must then end within 60 s with a status in 1-127 (its output in $work/NAME.log).
stop_rank1() {
  local name="$1" launcher start status=0 took
  shift
  "$titan" launch --nproc 3 train "${common[@]}" "$@" --job.dump_folder="$work/$name" \
    > "$work/$name.log" 2>&1 &
  launcher=$!
  for _ in $(seq 1 600); do
    grep -q '^step     2' "$work/$name.log" 2> /dev/null && break
    kill -0 "$launcher" 2> /dev/null || { echo "$name: the job ended early"; cat "$work/$name.log"; exit 1; }
    sleep 0.1
  done
  # Should rank 1 not have started yet, look again for up to 10 s; say what was there if it never
  # shows.
  for _ in $(seq 1 50); do
    stopped=$(rank_pid "$work/$name" 1)
    [ -n "$stopped" ] && break
    sleep 0.2
  done
  [ -n "$stopped" ] || {
    echo "$name: no rank 1 to stop"
    ps -eo pid,stat,args | grep -F -- "$work/$name" | grep -v grep
    cat "$work/$name.log"
    exit 1
  }
  kill -STOP "$stopped"
  start=$SECONDS
  wait "$launcher" || status=$?
  took=$((SECONDS - start))
  kill -KILL "$stopped" 2> /dev/null || true  # a stopped rank outlives the job otherwise
  stopped=""
  [ "$took" -le 60 ] || { echo "$name: the job outlived rank 1 by $took s"; cat "$work/$name.log"; exit 1; }
  [ "$status" -ge 1 ] && [ "$status" -le 127 ] ||
    { echo "$name: the job ended with status $status"; cat "$work/$name.log"; exit 1; }
  echo "$name: ended $took s after rank 1 stopped, status $status"
}
# only_lines LOG PATTERN...: the log's titan error lines are exactly one per PATTERN (full lines).
only_lines() {
  local log="$1" pattern
  shift
  [ "$(grep -c 'titan train: error' "$log")" = $# ] ||
    { echo "expected $# titan error lines:"; cat "$log"; exit 1; }
  for pattern in "$@"; do
    [ "$(grep -cxE -- "$pattern" "$log")" = 1 ] || { echo "expected one line '$pattern':"; cat "$log"; exit 1; }
  done
}

stop_rank1 default
only_lines "$work/default.log" \
  "\[rank 0 of 3\] titan train: error: rank 1 sent no heartbeat for 30 s \(comm\.heartbeat_timeout_seconds\): stopped, frozen or unreachable; ending the job" \
  "\[rank 2 of 3\] titan train: error: rank 1 sent no heartbeat for 30 s \(comm\.heartbeat_timeout_seconds\): stopped, frozen or unreachable; ending the job"

stop_rank1 collective --comm.train_timeout_seconds=5
# The ranks behind at the verdict are named: always rank 1, and on a loaded machine sometimes a
# live rank that had not entered the collective yet either (seen once in CI: rank 2 named "ranks 0
# and 1", rank 0 having entered late and named rank 1 itself).
behind="(rank 1 has not reached it|ranks (0 and 1|1 and 2|0, 1 and 2) have not reached it|rank 1 sent no heartbeat for [0-9]+ s)"
named="titan train: error: [a-z_]+ waited 5 s for the other ranks \(comm\.train_timeout_seconds\): $behind; ending the job"
only_lines "$work/collective.log" "\[rank 0 of 3\] $named" "\[rank 2 of 3\] $named"
echo "stopped rank: every check passed"
