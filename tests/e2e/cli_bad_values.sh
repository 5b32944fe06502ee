#!/usr/bin/env bash
# Values that used to mean something else are refused in one line, and keys that do nothing in
# this world say so: `titan eval --max-batches` -5 (read as "all") and 0 (blamed on the data);
# `titan train` in one process with the collective timeouts or the FSDP reshard policy set; an
# empty or too short validation file before the first step; a bad selective_ac_option.
# usage: cli_bad_values.sh TITAN
set -euo pipefail
titan=$(realpath "$1")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
. "$(dirname "$0")/tree_sum.sh"

for n in -5 0 -1x 2.5; do
  expect_refusal "max_batches$n" "^titan: error: --max-batches: must be -1 \(all batches\) or a positive number of batches, not '$n' \(run 'titan --help'\)$" \
    "$titan" eval --model "$work/none" --data "$work/none.jsonl" --max-batches "$n"
done

"$titan" train --training.steps=1 --lr_scheduler.warmup_steps=0 --training.seq_len=32 \
  --training.local_batch_size=2 --threads 1 --checkpoint.last_save_in_hf=false \
  --comm.train_timeout_seconds=30 --parallelism.fsdp_reshard_after_forward=always \
  --job.dump_folder="$work/run" > "$work/train.log" 2> "$work/train.err"
diff <(grep '^warning: ' "$work/train.err") - <<'TXT' || { echo "unexpected warnings:"; cat "$work/train.err"; exit 1; }
warning: comm.train_timeout_seconds has no effect: one process (it limits a collective's wait for the other ranks under mpirun)
warning: parallelism.fsdp_reshard_after_forward has no effect: no FSDP (data_parallel_shard_degree resolves to 1 in one process)
TXT
# An empty or too short validation set is refused at start-up, naming the key and the file (it
# failed after the first steps, as "evaluation: the data gave no full batch").
: > "$work/empty.txt"
echo "too short" > "$work/short.txt"
for f in empty short; do
  expect_refusal "validation_$f" "^titan train: error: validation\.dataset_path $work/$f\.txt: the validation data gives no full batch of 2 rows of 32 tokens \(training\.local_batch_size x training\.seq_len\): empty or too short$" \
    "$titan" train --training.steps=3 --lr_scheduler.warmup_steps=0 --training.seq_len=32 \
    --training.local_batch_size=2 --threads 1 --checkpoint.last_save_in_hf=false \
    --validation.enable=true --validation.freq=2 --validation.dataset_path="$work/$f.txt" \
    --job.dump_folder="$work/run_$f"
  if grep -q "^step " "$work/validation_$f.out"; then echo "validation_$f: steps ran first"; exit 1; fi
done
# activation_checkpoint.selective_ac_option: "op" or a positive layer count under selective, and
# not beside mode = "none"; refused before anything is read, by train and plan alike.
for option in 0 -1 abc; do
  for command in train plan; do
    expect_refusal "sac_$command$option" "^titan $command: error: activation_checkpoint\.selective_ac_option \"$option\" is not \"op\" or a positive layer count N \(every N-th layer recomputed\)$" \
      "$titan" "$command" --activation_checkpoint.mode=selective --activation_checkpoint.selective_ac_option="$option" \
      --job.dump_folder="$work/sac"
  done
done
expect_refusal sac_none "^titan train: error: activation_checkpoint\.selective_ac_option = \"op\" is set but activation_checkpoint\.mode is \"none\": set mode = \"selective\" for it to count$" \
  "$titan" train --activation_checkpoint.selective_ac_option=op --job.dump_folder="$work/sac"
echo "cli_bad_values: ok"
