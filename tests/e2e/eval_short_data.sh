#!/usr/bin/env bash
# titan eval fits the data: its defaults are shown in --help; a file shorter than one batch is not
# "no full batch" but one line with the tokens it holds and the --seq-len that fits, and that
# --seq-len then scores it (rows are never padded: titan eval scores full windows, as training's
# validation does).
set -euo pipefail
titan=$(realpath "$1")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "$1"; [ -n "${2:-}" ] && cat "$2"; exit 1; }

"$titan" eval --help > "$work/help.out"
for shown in "--seq-len INT:POSITIVE=2048" "--batch-size INT:POSITIVE=1" "--max-batches INT:-1|N>0=-1" \
             "--text-field TEXT=text" "--dtype TEXT=auto"; do
  grep -qF -- "$shown" "$work/help.out" || fail "--help does not show $shown" "$work/help.out"
done

"$titan" train --training.steps=1 --lr_scheduler.warmup_steps=0 --training.seq_len=64 --training.local_batch_size=2 \
  --threads 2 --job.dump_folder="$work/run" > "$work/train.log" 2>&1 || fail "training failed" "$work/train.log"
model="$work/run/hf"
printf '%s\n' '{"text": "The hacker ethic holds that information wants to be free."}' \
              '{"text": "A kludge is a clever programming trick."}' > "$work/small.jsonl"

short() {  # NAME ARGS...: refused in one line; prints the suggested --seq-len
  local name="$1"
  shift
  if "$titan" eval --model "$model" --data "$work/small.jsonl" --threads 2 "$@" > "$work/$name.out" 2> "$work/$name.err"; then
    fail "$name: a file shorter than one batch was scored" "$work/$name.out"
  fi
  [ "$(grep -v -e '^precision: ' -e '^evaluating[ :]' "$work/$name.err" | wc -l)" = 1 ] || fail "$name: not one line" "$work/$name.err"
  grep -oE "pass --seq-len [0-9]+ or less" "$work/$name.err" | grep -oE "[0-9]+" \
    || fail "$name: no --seq-len that fits" "$work/$name.err"
}
fits=$(short default)
grep -qE "^titan eval: error: the data holds [0-9]+ tokens \(an EOS after each document included\), fewer than one batch of 1 row\(s\) of --seq-len \+ 1 = 2049 tokens: pass --seq-len $fits or less$" "$work/default.err" \
  || fail "unclear message" "$work/default.err"
held=$(grep -oE "holds [0-9]+ tokens" "$work/default.err" | grep -oE "[0-9]+")
[ "$fits" = $((held - 1)) ] || fail "--seq-len $fits for $held tokens"
"$titan" eval --model "$model" --data "$work/small.jsonl" --threads 2 --seq-len "$fits" > "$work/fits.out" 2> "$work/fits.err" \
  || fail "the suggested --seq-len $fits does not score the file" "$work/fits.err"
grep -qE "^loss [0-9.]+  perplexity [0-9.]+  \($fits tokens scored in 1 batches" "$work/fits.out" || fail "not every token scored" "$work/fits.out"
if "$titan" eval --model "$model" --data "$work/small.jsonl" --threads 2 --seq-len $((fits + 1)) > /dev/null 2>&1; then
  fail "--seq-len $((fits + 1)) scored a file said to fit $fits at most"
fi
# Two rows: the suggestion fits both.
fits2=$(short two --batch-size 2)
grep -q "(or a smaller --batch-size)" "$work/two.err" || fail "no --batch-size hint" "$work/two.err"
"$titan" eval --model "$model" --data "$work/small.jsonl" --threads 2 --batch-size 2 --seq-len "$fits2" > "$work/fits2.out" 2>&1 \
  || fail "the suggested --seq-len $fits2 does not score 2 rows" "$work/fits2.out"
echo ok
