#!/usr/bin/env bash
# [profiling]: every profile_freq-th step (and the profiler_active - 1 before it) written as a
# Chrome trace per rank, job.dump_folder/save_traces_folder/iteration_<step>/rank<r>_trace.json,
# loaded with Python's json: "X" events with name, cat, ts, dur, pid = rank, tid = thread; the
# GEMM, RMSNorm, attention, loss and AdamW kernels' spans; the step's phases; the kernels' spans
# on the step's thread disjoint, inside the step, and covering at least 90 % of its time. The
# losses with profiling on are the same bits as without (no folder then). On 2 ranks (FSDP) each
# rank writes its own trace, its collectives (all_gather, reduce_scatter) spans on its
# "communication" thread and the compute thread's waits for them; there the kernels, the waits and
# FSDP's acquire/prefetch/release spans together cover at least 90 % of the step.
set -euo pipefail
titan=$(realpath "$1")
python="$2"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "$1"; [ -n "${2:-}" ] && cat "$2"; exit 1; }
common=(--training.steps=4 --lr_scheduler.warmup_steps=1 --training.seq_len=128 --training.local_batch_size=4
        --metrics.log_freq=1)

"$titan" train "${common[@]}" --threads 2 --job.dump_folder="$work/a" --profiling.enable_profiling=true \
  --profiling.profile_freq=2 > "$work/a.log" 2>&1 || fail "the run failed" "$work/a.log"
for n in 2 4; do
  grep -qE "^profile trace of step $n: $work/a/profile_traces/iteration_$n/rank0_trace.json \([0-9]+ spans; kernels [0-9.]+% of the step time\)$" "$work/a.log" \
    || fail "no line for the trace of step $n" "$work/a.log"
done
[ "$(ls "$work/a/profile_traces")" = "$(printf 'iteration_2\niteration_4')" ] || fail "traces of other steps: $(ls "$work/a/profile_traces")"

check() {  # check TRACE RANK STEPS: a trace's structure; prints the kernels' share of the step time
  "$python" - "$@" <<'PY'
import json, sys
path, rank, steps = sys.argv[1], int(sys.argv[2]), [int(s) for s in sys.argv[3].split(",")]
trace = json.load(open(path))
events = trace["traceEvents"]
spans = [e for e in events if e["ph"] == "X"]
meta = [e for e in events if e["ph"] == "M"]
assert spans and len(spans) + len(meta) == len(events), "only X and M events"
for e in spans:
    assert set(e) >= {"name", "cat", "ph", "ts", "dur", "pid", "tid"}, e
    assert e["pid"] == rank and isinstance(e["tid"], int) and e["dur"] >= 0, e
    assert e["cat"] in ("kernel", "collective", "wait", "phase"), e
threads = {e["tid"]: e["args"]["name"] for e in meta if e["name"] == "thread_name"}
assert {"name": "process_name", "ph": "M", "pid": rank, "args": {"name": f"rank {rank}"}} in meta, meta
step_spans = [e for e in spans if e["name"] == "step"]
assert [e["args"]["step"] for e in step_spans] == steps, step_spans
main = step_spans[0]["tid"]
assert threads[main] == "main", threads
names = {e["name"] for e in spans if e["cat"] == "kernel"}
for k in ("embedding.forward", "rms_norm.forward", "rms_norm.backward", "linear.forward",
          "linear.backward", "rope.forward", "attention.forward", "attention.backward",
          "swiglu.forward", "lm_head_loss.forward_backward", "add", "adamw_step_all",
          "sum_squares_all"):
    assert k in names, (k, sorted(names))
phases = {e["name"] for e in spans if e["cat"] == "phase"}
assert phases >= {"step", "data", "zero_grad", "forward", "backward", "reduce_gradients",
                  "clip_grad_norm", "optimizer"}, phases
# The step's thread's kernels: disjoint, each inside a step, and how much of the steps they fill.
kernels = sorted((e for e in spans if e["cat"] == "kernel" and e["tid"] == main), key=lambda e: e["ts"])
for a, b in zip(kernels, kernels[1:]):
    assert a["ts"] + a["dur"] <= b["ts"] + 1e-3, ("overlapping kernel spans", a, b)
for k in kernels:
    assert any(s["ts"] <= k["ts"] and k["ts"] + k["dur"] <= s["ts"] + s["dur"] + 1e-3 for s in step_spans), k
steps_us = sum(s["dur"] for s in step_spans)
covered = sum(k["dur"] for k in kernels) / steps_us
collectives = [e for e in spans if e["cat"] == "collective"]
assert all(threads.get(e["tid"]) == "communication" for e in collectives), collectives[:3]
waits = [e for e in spans if e["cat"] == "wait" and e["tid"] == main]
# The step's time on its thread inside a kernel, a wait for a collective or FSDP's acquire,
# prefetch and release (their page commits and queueing): the union of those spans.
accounted, end = 0.0, None
for e in sorted((e for e in spans if e["tid"] == main and (e["cat"] in ("kernel", "wait")
                 or e["name"].startswith("fsdp."))), key=lambda e: e["ts"]):
    start, stop = e["ts"], e["ts"] + e["dur"]
    if end is None or start > end:
        accounted += stop - start
        end = stop
    elif stop > end:
        accounted += stop - end
        end = stop
# Printed: the kernels' share, spans, collectives, their names, waits, the waits' share, the
# accounted share.
print(f"{covered:.4f} {len(spans)} {len(collectives)} {sorted({e['name'] for e in collectives})} "
      f"{len(waits)} {sum(w['dur'] for w in waits) / steps_us:.4f} {accounted / steps_us:.4f}")
PY
}
for n in 2 4; do
  out=$(check "$work/a/profile_traces/iteration_$n/rank0_trace.json" 0 $n) || fail "iteration_$n: $out"
  echo "iteration_$n: kernels cover $out"
  "$python" -c 'import sys; sys.exit(0 if float(sys.argv[1]) >= 0.9 else 1)' "${out%% *}" \
    || fail "iteration_$n: the kernels cover less than 90 % of the step time ($out)"
done

# profiler_active = 2: iteration_4 holds steps 3 and 4; the same losses as without profiling,
# which writes no folder.
"$titan" train "${common[@]}" --threads 2 --job.dump_folder="$work/b" --profiling.enable_profiling=true \
  --profiling.profile_freq=4 --profiling.profiler_active=2 --profiling.save_traces_folder=traces \
  > "$work/b.log" 2>&1 || fail "the run failed" "$work/b.log"
check "$work/b/traces/iteration_4/rank0_trace.json" 0 3,4 > /dev/null || fail "iteration_4 does not hold steps 3 and 4"
[ "$(ls "$work/b/traces")" = iteration_4 ] || fail "traces of other steps: $(ls "$work/b/traces")"
"$titan" train "${common[@]}" --threads 2 --job.dump_folder="$work/c" > "$work/c.log" 2>&1 || fail "the run failed" "$work/c.log"
[ ! -e "$work/c/profile_traces" ] || fail "a trace folder without profiling"
losses() { "$python" -c 'import json,sys
print([json.loads(l)["loss"] for l in open(sys.argv[1])])' "$1"; }
[ "$(losses "$work/a/metrics.jsonl")" = "$(losses "$work/c/metrics.jsonl")" ] \
  && [ "$(losses "$work/b/metrics.jsonl")" = "$(losses "$work/c/metrics.jsonl")" ] \
  || fail "profiling changed the losses"

# Bad values: one line each.
for bad in "--profiling.profile_freq=0" "--profiling.profiler_active=3 --profiling.profile_freq=2"; do
  # shellcheck disable=SC2086
  if "$titan" train "${common[@]}" --job.dump_folder="$work/d" --profiling.enable_profiling=true $bad \
      > "$work/d.log" 2> "$work/d.err"; then fail "$bad was accepted"; fi
  [ "$(wc -l < "$work/d.err")" = 1 ] && grep -q "^titan train: error: profiling\.profile" "$work/d.err" \
    || fail "$bad: not one line naming the key" "$work/d.err"
done

# Two ranks under FSDP: one trace per rank, with its collectives.
. "$(dirname "$0")/mpi_env.sh"
"$titan" launch --nproc 2 train "${common[@]}" --training.steps=2 --threads 1 --job.dump_folder="$work/m" \
  --profiling.enable_profiling=true --profiling.profile_freq=2 > "$work/m.log" 2>&1 \
  || fail "the 2-rank run failed" "$work/m.log"
for r in 0 1; do
  out=$(check "$work/m/profile_traces/iteration_2/rank${r}_trace.json" $r 2) || fail "rank $r: $out"
  echo "rank $r: $out"
  read -r _ _ n_collectives names n_waits _ accounted <<< "$(echo "$out" | sed "s/\[\(.*\)\]/\1/; s/, /,/g")"
  [ "$n_collectives" -gt 0 ] && [[ "$names" == *"'all_gather'"* ]] && [[ "$names" == *"'reduce_scatter'"* ]] \
    || fail "rank $r: no all_gather and reduce_scatter spans ($out)"
  [ "$n_waits" -gt 0 ] || fail "rank $r: no waits for collectives on the main thread ($out)"
  "$python" -c 'import sys; sys.exit(0 if float(sys.argv[1]) >= 0.9 else 1)' "$accounted" \
    || fail "rank $r: kernels, waits and FSDP's acquire/release cover less than 90 % of the step ($out)"
done
echo ok
