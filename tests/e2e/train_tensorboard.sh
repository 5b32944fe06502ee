#!/usr/bin/env bash
# metrics.enable_tensorboard: titan's own event files, read back by the `tensorboard` package's
# EventAccumulator (the reference venv), hold every scalar of every logged step and validation pass
# at its step, equal to the metrics JSONL's value (TensorBoard's scalars are float32: the JSONL's
# value rounded to float32, bit for bit), under torchtitan's tags, in
# job.dump_folder/save_tb_folder/<YYYYMMDD-HHMM>/events.out.tfevents.*; a relative or absolute
# save_tb_folder; on 2 ranks, rank 0's file only; no event file without the key; a folder it
# cannot create is one line.
set -euo pipefail
titan=$(realpath "$1")
python="$2"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "$1"; [ -n "${2:-}" ] && cat "$2"; exit 1; }
common=(--training.steps=7 --lr_scheduler.warmup_steps=2 --training.seq_len=64 --training.local_batch_size=2
        --metrics.log_freq=3 --validation.enable=true --validation.freq=3 --validation.steps=1
        --validation.dataset_path=/usr/share/doc/jargon-text/jargon.txt.gz)

"$titan" train "${common[@]}" --threads 2 --job.dump_folder="$work/a" --metrics.enable_tensorboard=true > "$work/a.log" 2>&1 \
  || fail "the run failed" "$work/a.log"
grep -qE "^TensorBoard event file $work/a/tb/[0-9]{8}-[0-9]{4}/events\.out\.tfevents\.[0-9]{10}\..+\.[0-9]+ \(tensorboard --logdir $work/a/tb\)$" "$work/a.log" \
  || fail "no line naming the event file" "$work/a.log"

check() {  # check DUMP_FOLDER TB_FOLDER: the event file's scalars against DUMP_FOLDER/metrics.jsonl
  "$python" - "$1/metrics.jsonl" "$2" <<'PY'
import glob, json, os, sys
import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

jsonl, tb = sys.argv[1], sys.argv[2]
runs = glob.glob(os.path.join(tb, "*"))
assert len(runs) == 1 and os.path.basename(runs[0]).replace("-", "").isdigit(), runs
files = glob.glob(os.path.join(runs[0], "events.out.tfevents.*"))
assert len(files) == 1, files
# Every record's framing and both CRC-32Cs checked by TensorBoard's own record reader (a bad one
# raises DataLossError), then the events parsed by its Event proto.
from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.tensorflow_stub import errors, pywrap_tensorflow
reader = pywrap_tensorflow.PyRecordReader_New(files[0].encode())
events = []
while True:
    try:
        reader.GetNext()
    except errors.OutOfRangeError:
        break
    events.append(Event.FromString(reader.record()))
assert events[0].file_version == "brain.Event:2", events[0]
assert all(e.HasField("summary") for e in events[1:]), events
acc = EventAccumulator(runs[0], size_guidance={"scalars": 0})  # 0: keep every event
acc.Reload()
# The JSONL's keys and the tags they are logged under.
tags = {"loss": "loss_metrics/global_avg_loss", "grad_norm": "grad_norm", "lr": "lr",
        "tokens_per_second": "throughput(tps)", "tflops": "tflops", "mfu": "mfu(%)",
        "memory_current_gib": "memory/current(GiB)", "memory_peak_gib": "memory/peak(GiB)",
        "step_time_s": "time_metrics/end_to_end(s)", "data_time_s": "time_metrics/data_loading(s)",
        "validation_loss": "validation_metrics/loss",
        "validation_perplexity": "validation_metrics/perplexity"}
expected = {}  # tag -> [(step, value)]
for line in open(jsonl):
    row = json.loads(line)
    for key, value in row.items():
        if key == "memory_peak_by_category_gib":
            for category, v in value.items():
                expected.setdefault(f"memory/peak_{category}(GiB)", []).append((row["step"], v))
        elif key in tags:
            expected.setdefault(tags[key], []).append((row["step"], value))
        else:
            assert key in ("step", "validation_tokens"), f"JSONL key {key} has no tag"
assert sorted(acc.Tags()["scalars"]) == sorted(expected), (sorted(acc.Tags()["scalars"]), sorted(expected))
for tag, want in expected.items():
    got = [(e.step, e.value) for e in acc.Scalars(tag)]
    assert [s for s, _ in got] == [s for s, _ in want], (tag, got, want)
    for (step, g), (_, w) in zip(got, want):
        assert np.float32(g) == np.float32(w), (tag, step, g, w)
steps = [s for s, _ in expected["loss_metrics/global_avg_loss"]]
print(f"{len(expected)} tags, steps {steps}, validation steps "
      f"{[s for s, _ in expected['validation_metrics/loss']]}")
PY
}
out=$(check "$work/a" "$work/a/tb") || fail "the event file does not hold the JSONL's scalars: $out"
echo "$out"
[ "$(echo "$out" | grep -c "steps \[1, 3, 6, 7\], validation steps \[3, 6\]")" = 1 ] \
  || fail "not the logged steps 1, 3, 6, 7 and validation steps 3, 6: $out"

# save_tb_folder: relative lies under the dump folder, absolute as is.
"$titan" train "${common[@]}" --threads 2 --job.dump_folder="$work/b" --metrics.enable_tensorboard=true \
  --metrics.save_tb_folder=logs/tensorboard > "$work/b.log" 2>&1 || fail "the run failed" "$work/b.log"
check "$work/b" "$work/b/logs/tensorboard" > /dev/null || fail "no event file under a relative save_tb_folder"
"$titan" train "${common[@]}" --threads 2 --job.dump_folder="$work/c" --metrics.enable_tensorboard=true \
  --metrics.save_tb_folder="$work/elsewhere" > "$work/c.log" 2>&1 || fail "the run failed" "$work/c.log"
check "$work/c" "$work/elsewhere" > /dev/null || fail "no event file under an absolute save_tb_folder"

# Two ranks: rank 0 alone writes, one event file whose values are the job's JSONL's.
. "$(dirname "$0")/mpi_env.sh"
"$titan" launch --nproc 2 train "${common[@]}" --threads 1 --job.dump_folder="$work/m" \
  --metrics.enable_tensorboard=true > "$work/m.log" 2>&1 || fail "the 2-rank run failed" "$work/m.log"
check "$work/m" "$work/m/tb" > /dev/null || fail "the 2-rank run's event files are not its JSONL's"

# Off by default: no tb folder, no line.
"$titan" train "${common[@]}" --threads 2 --job.dump_folder="$work/d" > "$work/d.log" 2>&1 || fail "the run failed" "$work/d.log"
[ ! -e "$work/d/tb" ] && ! grep -q TensorBoard "$work/d.log" || fail "an event file without metrics.enable_tensorboard"

# A folder it cannot create: one line naming it.
touch "$work/file"
if "$titan" train "${common[@]}" --threads 2 --job.dump_folder="$work/e" --metrics.enable_tensorboard=true \
    --metrics.save_tb_folder="$work/file/tb" > "$work/e.log" 2> "$work/e.err"; then
  fail "a save_tb_folder under a file was accepted"
fi
[ "$(wc -l < "$work/e.err")" = 1 ] && grep -q "^titan train: error: metrics.save_tb_folder: cannot create $work/file/tb/" "$work/e.err" \
  || fail "not one line naming the folder" "$work/e.err"
echo ok
