#!/usr/bin/env bash
# A run's record: the resolved config saved as job_config.toml in the dump folder, in every
# checkpoint and in the export (and a run from that file trains the same losses); metrics JSONL in
# the dump folder by default (metrics.save_jsonl moves it, "" turns it off); "step N/total", an ETA
# and the total time in the log; one line per checkpoint saved with its path, size and seconds.
set -euo pipefail
titan=$(realpath "$1")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "$1"; [ -n "${2:-}" ] && cat "$2"; exit 1; }
common=(--training.steps=4 --lr_scheduler.warmup_steps=1 --training.seq_len=64 --training.local_batch_size=2
        --metrics.log_freq=1 --threads 2)

"$titan" train "${common[@]}" --job.dump_folder="$work/a" --checkpoint.enable=true --checkpoint.interval=2 \
  > "$work/a.log" 2>&1 || fail "the run failed" "$work/a.log"
for f in job_config.toml checkpoint/step-2/job_config.toml checkpoint/step-4/job_config.toml hf/job_config.toml; do
  [ -f "$work/a/$f" ] || fail "no $f" "$work/a.log"
done
cmp -s "$work/a/job_config.toml" "$work/a/hf/job_config.toml" || fail "the export's job_config.toml differs from the dump folder's"
grep -qx 'steps = 4' "$work/a/job_config.toml" || fail "job_config.toml does not hold the flags' values" "$work/a/job_config.toml"
[ "$(wc -l < "$work/a/metrics.jsonl")" = 4 ] || fail "metrics.jsonl in the dump folder lacks the 4 steps" "$work/a/metrics.jsonl"
for n in 1 2 3 4; do
  grep -qE "^step +$n/4  loss .*  eta [0-9.]+s" "$work/a.log" || fail "no 'step $n/4 ... eta' line" "$work/a.log"
done
grep -qE "^summary: .*  \|  total time [0-9.]+s$" "$work/a.log" || fail "no total time in the summary" "$work/a.log"
[ "$(grep -c '^checkpoint saved: ' "$work/a.log")" = 2 ] || fail "not one line per checkpoint" "$work/a.log"
grep -qE "^checkpoint saved: $work/a/checkpoint/step-2 \([0-9.]+ [KM]iB, [0-9.]+ s\)$" "$work/a.log" \
  || fail "the step-2 line lacks path, size or seconds" "$work/a.log"
grep -qE "^checkpoint saved: $work/a/checkpoint/step-4 \([0-9.]+ [KM]iB, [0-9.]+ s, model weights only\)$" "$work/a.log" \
  || fail "the step-4 line lacks path, size or seconds" "$work/a.log"

# The saved config is the run: trained again from it (elsewhere), the losses are the same bits.
"$titan" train --config "$work/a/job_config.toml" --threads 2 --job.dump_folder="$work/b" \
  --checkpoint.enable=false > "$work/b.log" 2>&1 || fail "the saved config does not run" "$work/b.log"
losses() { python3 -c 'import json,sys
print([json.loads(l)["loss"] for l in open(sys.argv[1])])' "$1"; }
[ "$(losses "$work/a/metrics.jsonl")" = "$(losses "$work/b/metrics.jsonl")" ] \
  || fail "the run from job_config.toml trained other losses" "$work/b.log"

# A relative metrics.save_jsonl lies under the dump folder; "" writes none.
"$titan" train "${common[@]}" --job.dump_folder="$work/c" --metrics.save_jsonl=logs.jsonl > "$work/c.log" 2>&1 \
  || fail "the run failed" "$work/c.log"
[ -f "$work/c/logs.jsonl" ] && [ ! -e "$work/c/metrics.jsonl" ] || fail "metrics.save_jsonl=logs.jsonl not under the dump folder"
"$titan" train "${common[@]}" --job.dump_folder="$work/d" --metrics.save_jsonl= > "$work/d.log" 2>&1 \
  || fail "the run failed" "$work/d.log"
[ -z "$(find "$work/d" -name '*.jsonl')" ] || fail "metrics.save_jsonl = \"\" still wrote a file"
echo "ok"
