# Sourced by the e2e tests that save training checkpoints in one layout and resume them in
# others (checkpoint_layouts.sh, checkpoint_expert_tensor_layouts.sh). The caller sets work and
# python; each NAME is a run's folder under $work:
#   resume_from NAME            the flags that load NAME's step-5 checkpoint as the initial state
#   one_process_layout NAME     NAME's step-5 checkpoint holds the one process's files (gathered
#                               onto rank 0), no sharding.json
#   resumed NAME...             each run says once (rank 0 for the job) that it resumed step 5
#   same_steps_after STEP REF RUN
#                               RUN's losses and grad norms of steps STEP + 1 to 10 REF's bit for
#                               bit (a resume in the layout that saved: the same sums in the same
#                               order)
#   same_checkpoint A B         the step folders A and B hold the same files, each byte for byte
#                               but job_config.toml (but its async_mode line and the run's own
#                               folder and metrics file) and trainer_state.json (but
#                               job_config.toml's checksum)
# shellcheck shell=bash
resume_from() { echo --checkpoint.initial_load_path="$work/$1/checkpoint/step-5" --checkpoint.initial_load_model_only=false; }
one_process_layout() {
  local dir="$work/$1/checkpoint/step-5"
  [ -f "$dir/model.safetensors" ] && [ -f "$dir/optimizer.safetensors" ] && [ ! -e "$dir/sharding.json" ] \
    || { echo "$1: step-5 is not the one process's layout: $(ls "$dir")"; exit 1; }
}
resumed() {
  local name
  for name in "$@"; do
    [ "$(grep -c "^resumed step 5 from" "$work/$name.log")" = 1 ] \
      || { echo "$name: did not say once that it resumed step 5"; cat "$work/$name.log"; exit 1; }
  done
}
same_steps_after() {
  local steps='import json, sys
for r in map(json.loads, open(sys.argv[1])):
    if "loss" in r and r["step"] > int(sys.argv[2]): print(r["step"], repr(r["loss"]), repr(r["grad_norm"]))'
  [ "$("$python" -c "$steps" "$work/$2.jsonl" "$1" | wc -l)" = $((10 - $1)) ] || { echo "$2: not $((10 - $1)) steps after step $1"; exit 1; }
  diff <("$python" -c "$steps" "$work/$2.jsonl" "$1") <("$python" -c "$steps" "$work/$3.jsonl" "$1") \
    || { echo "$3: steps $(($1 + 1)) to 10 differ from $2's"; return 1; }
  echo "$3: steps $(($1 + 1)) to 10 $2's bit for bit"
}
run_keys='^(async_mode|dump_folder|save_jsonl) = '
same_checkpoint() {
  local a="$work/$1" b="$work/$2"
  diff <(ls -A "$a") <(ls -A "$b") > /dev/null || { echo "$1 and $2 hold different files"; exit 1; }
  for f in "$a"/*; do
    local name
    name=$(basename "$f")
    case "$name" in
      job_config.toml)
        diff <(grep -Ev "$run_keys" "$f") <(grep -Ev "$run_keys" "$b/$name") > /dev/null \
          || { echo "$2/$name differs from $1's beyond async_mode and the run's folders"; exit 1; } ;;
      trainer_state.json)
        "$python" -c 'import json,sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
for s in (a, b): s["checksums"].pop("job_config.toml")
sys.exit(a != b)' "$f" "$b/$name" || { echo "$2/$name differs from $1's beyond job_config.toml's checksum"; exit 1; } ;;
      *) cmp -s "$f" "$b/$name" || { echo "$2/$name differs from $1's"; exit 1; } ;;
    esac
  done
  echo "$2: the files of $1 byte for byte"
}
