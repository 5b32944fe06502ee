#!/usr/bin/env bash
# A rank that stops (SIGSTOP: alive, never answering) inside expert parallel's all-to-all-v is
# named by the other (distributed/heartbeat.h): test_expert_parallel_mpi on 2 ranks under mpirun,
# rank 1 stopping itself inside the model's second exchange of its first forward while rank 0
# waits in it, with titan train's default comm.heartbeat_timeout_seconds (30). The job must end
# within 60 s of the stop with a status in 1-127 and exactly one titan error line: rank 0 naming
# rank 1 and the key.
# usage: ep_stopped_rank.sh TEST_EXPERT_PARALLEL_MPI MPIEXEC
set -euo pipefail
test_binary="$1"
mpiexec="$2"
work=$(mktemp -d)
stopped=""
# On any exit no rank of the job outlives the test (a stopped rank ignores mpirun's SIGTERM).
trap '[ -z "$stopped" ] || kill -KILL "$stopped" 2> /dev/null || true
      pkill -KILL -f -- "--ep-stopped-rank=$work" 2> /dev/null || true; rm -rf "$work"' EXIT
. "$(dirname "$0")/mpi_env.sh"

# The extra argument marks this job's ranks (gtest leaves it alone).
TITAN_TEST_EP_STOP_RANK=1 "$mpiexec" -np 2 -x TITAN_TEST_EP_STOP_RANK \
  "$test_binary" "--ep-stopped-rank=$work" > "$work/job.log" 2>&1 &
launcher=$!
# Rank 1 stops itself: its state turns T (stopped).
for _ in $(seq 1 600); do
  for pid in $(pgrep -f -- "--ep-stopped-rank=$work" || true); do
    [ "$pid" = "$launcher" ] && continue
    if [ "$(awk '{print $3}' "/proc/$pid/stat" 2> /dev/null)" = T ]; then
      stopped=$pid
      break
    fi
  done
  [ -n "$stopped" ] && break
  kill -0 "$launcher" 2> /dev/null || { echo "the job ended before rank 1 stopped"; cat "$work/job.log"; exit 1; }
  sleep 0.1
done
[ -n "$stopped" ] || { echo "rank 1 never stopped"; cat "$work/job.log"; exit 1; }
start=$SECONDS
status=0
wait "$launcher" || status=$?
took=$((SECONDS - start))
kill -KILL "$stopped" 2> /dev/null || true
stopped=""
[ "$took" -le 60 ] || { echo "the job outlived rank 1 by $took s"; cat "$work/job.log"; exit 1; }
[ "$status" -ge 1 ] && [ "$status" -le 127 ] ||
  { echo "the job ended with status $status"; cat "$work/job.log"; exit 1; }
line="[rank 0 of 2] titan train: error: rank 1 sent no heartbeat for 30 s (comm.heartbeat_timeout_seconds): stopped, frozen or unreachable; ending the job"
[ "$(grep -c 'titan train: error' "$work/job.log")" = 1 ] && [ "$(grep -cxF -- "$line" "$work/job.log")" = 1 ] ||
  { echo "expected the one line '$line':"; cat "$work/job.log"; exit 1; }
echo "ep stopped rank: ended $took s after rank 1 stopped, status $status, one line naming it"
