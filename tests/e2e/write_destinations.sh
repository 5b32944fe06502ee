#!/usr/bin/env bash
# Commands that write never destroy what titan did not write, nor what they read: each refused
# case below exits non-zero with one error line and leaves every folder involved byte-identical.
set -euo pipefail
titan=$(realpath "$1")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
. "$(dirname "$0")/tree_sum.sh"

# A model folder as a user has it: titan's fp32 export plus a README, a LICENSE and a folder.
"$titan" train --training.steps=1 --lr_scheduler.warmup_steps=0 --training.seq_len=64 --training.local_batch_size=2 \
  --checkpoint.last_save_in_hf=true --job.dump_folder="$work/run" --threads 2 > "$work/run.log"
grep -q '"written_by": "titan"' "$work/run/hf/titan.json" || { echo "no marker in the export"; exit 1; }
cp -r "$work/run/hf" "$work/model"
rm "$work/model/titan.json"
echo "read me" > "$work/model/README.md"
echo "license" > "$work/model/LICENSE"
mkdir "$work/model/notes" && echo "keep" > "$work/model/notes/todo.txt"
# Another project's folder that merely holds a config.json.
mkdir -p "$work/project/src" && echo '{}' > "$work/project/config.json" && echo "int main(){}" > "$work/project/src/main.cpp"
# A dataset.
printf '{"text": "one"}\n{"text": "two"}\n' > "$work/data.jsonl"

tree_sum "$work" > "$work.before"
same() { tree_sum "$work" | grep -v -e "\.out$" -e "\.err$" | diff <(grep -v -e "\.out$" -e "\.err$" "$work.before") - > /dev/null \
  || { echo "$1: something changed"; tree_sum "$work" | diff "$work.before" - | head; exit 1; }; }

expect_refusal convert_project "^titan convert: error: .*/project: already exists and is not an empty folder, and titan did not write it \(no titan.json\), so it is not replaced" \
  "$titan" convert "$work/model" "$work/project" --overwrite
same convert_project
expect_refusal convert_in_place "^titan convert: error: .*/model: is the source model folder .*/model; writing there would replace what is being read" \
  "$titan" convert "$work/model" "$work/model" --overwrite --dtype bfloat16
same convert_in_place
expect_refusal convert_inside "^titan convert: error: .*/model/bf16: lies inside the source model folder" \
  "$titan" convert "$work/model" "$work/model/bf16" --dtype bfloat16
same convert_inside
expect_refusal convert_holding "^titan convert: error: $work: holds the source model folder" \
  "$titan" convert "$work/model" "$work" --overwrite
same convert_holding
expect_refusal convert_user_model "^titan convert: error: .*/model: already exists and is not an empty folder, and titan did not write it" \
  "$titan" convert "$work/run/hf" "$work/model" --overwrite
same convert_user_model

expect_refusal bin_in_place "^titan tokenize: error: .*/data.jsonl: is the input .*/data.jsonl" \
  "$titan" tokenize --tokenizer "$work/model" --bin "$work/data.jsonl" "$work/data.jsonl"
same bin_in_place
expect_refusal bin_inside "^titan tokenize: error: .*/model/README.md: is the input" \
  "$titan" tokenize --tokenizer "$work/model" --bin "$work/model/README.md" "$work/model"
same bin_inside
expect_refusal bin_not_token_file "^titan tokenize: error: .*/project/config.json: already exists and is not a token file" \
  "$titan" tokenize --tokenizer "$work/model" --bin "$work/project/config.json" "$work/data.jsonl"
same bin_not_token_file
expect_refusal jsonl_in_place "^titan tokenize: error: .*/data.jsonl: is the input" \
  "$titan" tokenize --tokenizer "$work/model" --jsonl "$work/data.jsonl" --out "$work/data.jsonl"
same jsonl_in_place
expect_refusal jsonl_over_a_file "^titan tokenize: error: .*/project/config.json: exists; titan tokenize --out does not replace a file" \
  "$titan" tokenize --tokenizer "$work/model" --jsonl "$work/data.jsonl" --out "$work/project/config.json"
same jsonl_over_a_file

for flag in "" --overwrite; do
  expect_refusal "tokenizer_model$flag" "^titan tokenizer: error: .*/model: already exists and is not an empty folder" \
    "$titan" tokenizer train --vocab-size 300 --out "$work/model" $flag "$work/data.jsonl"
  same "tokenizer_model$flag"
done
expect_refusal tokenizer_export "^titan tokenizer: error: .*/run/hf: already exists and is not an empty folder, and it holds a model, not a tokenizer" \
  "$titan" tokenizer train --vocab-size 300 --out "$work/run/hf" --overwrite "$work/data.jsonl"
same tokenizer_export
expect_refusal tokenizer_input "^titan tokenizer: error: .*/project: holds the input" \
  "$titan" tokenizer train --vocab-size 300 --out "$work/project" --overwrite "$work/project/src"
same tokenizer_input

# What titan wrote, it replaces when asked: a convert output and a trained tokenizer, twice over.
"$titan" convert "$work/model" "$work/bf16" --dtype bfloat16 > /dev/null
"$titan" convert "$work/model" "$work/bf16" --dtype float16 --overwrite > /dev/null
grep -q '"torch_dtype": "float16"\|"dtype": "float16"' "$work/bf16/config.json" || { echo "--overwrite did not replace"; exit 1; }
"$titan" tokenizer train --vocab-size 300 --out "$work/tok" "$work/data.jsonl" 2> /dev/null
"$titan" tokenizer train --vocab-size 300 --out "$work/tok" --overwrite "$work/data.jsonl" 2> /dev/null
# ... but not once a file of someone else's is in it.
echo "mine" > "$work/bf16/NOTES.md"
tree_sum "$work" > "$work.before"
expect_refusal convert_added_file "^titan convert: error: .*/bf16: already exists and is not an empty folder, and it holds \"NOTES.md\", which titan did not write there" \
  "$titan" convert "$work/model" "$work/bf16" --overwrite
same convert_added_file
for f in "$work"/*.err; do cat "$f"; done
