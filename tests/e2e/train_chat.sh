#!/usr/bin/env bash
# Fine-tuning on chat data (training.dataset = "chat") through the titan binary, against
# Transformers:
# - 3 fp32 AdamW steps on four conversations of different lengths (a global batch of all four, in
#   two micro-batches of two padded rows) equal Transformers' Trainer step -- labels -100 outside
#   the assistant replies, the loss over the assistant tokens of the whole global batch
#   (num_items_in_batch) -- step by step (loss within 1e-5) and in the exported weights (1e-6);
#   tests/reference/chat_sft_reference.py;
# - the same with the four packed into one row (training.dataset_packing: attention inside each
#   conversation, positions restarting), against the same reference;
# - the same on 2 ranks (FSDP); packed on 2 ranks (each encoding its share of the conversations)
#   within 1e-5 of one process; bf16 mixed precision within bf16's rounding;
# - the validation pass on chat data equals `titan eval --chat` on the export, and both equal
#   Transformers' masked loss of the trained model; `titan eval --chat --packing` (the four in one
#   row) equals the same eval one conversation per row (2e-6, the fp32 sums' order),
#   Transformers' masked loss, and the packed run's validation pass (which packs too); a last batch the conversations do not fill is
#   kept (empty rows), so every conversation is scored whatever the batch size;
# - bad inputs stop with one line naming what and where: a record without "messages", a bad role,
#   an over-long conversation (file:line, in train and eval), a model folder without a chat
#   template (train and eval), a template whose turn tokens the tokenizer lacks;
#   training.truncate_long_conversations cuts instead;
# - a run resumed from a checkpoint (the epoch ending after it) equals the uninterrupted one;
# - the conversations docs/TRAINING.md fine-tunes on (examples/chat) are learned, and `titan
#   generate --chat` on the export answers two of their questions word for word.
# The model: a tiny random Qwen3 over a 512-token tokenizer titan trains on the Jargon File, with
# the official Qwen3 chat template (tests/fixtures/chat_templates.json).
# usage: train_chat.sh TITAN PYTHON
set -euo pipefail
titan=$(realpath "$1")
python="$2"
source_dir="$(cd "$(dirname "$0")/../.." && pwd)"
. "$(dirname "$0")/tree_sum.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
reference="$source_dir/tests/reference/chat_sft_reference.py"

"$titan" tokenizer train --vocab-size 512 --out "$work/model" \
  /usr/share/doc/jargon-text/jargon.txt.gz > /dev/null 2>&1
rm "$work/model/titan.json"  # the folder becomes a model folder, not a tokenizer titan wrote
"$python" "$reference" make "$work/model" "$source_dir/tests/fixtures/chat_templates.json" \
  > /dev/null 2>&1
cp -r "$work/model" "$work/no-template"
cp -r "$work/model" "$work/llama-template"
"$python" - "$work" "$source_dir/tests/fixtures/chat_templates.json" <<'PY'
import json, sys
work, templates = sys.argv[1:]
path = f"{work}/no-template/tokenizer_config.json"
config = json.load(open(path))
del config["chat_template"]
json.dump(config, open(path, "w"))
# A Llama 3.1 template over a ChatML tokenizer: its turn tokens are not in the vocabulary.
llama = next(t for t in json.load(open(templates)) if t["kind"] == "llama3_1")
path = f"{work}/llama-template/tokenizer_config.json"
config = json.load(open(path))
config["chat_template"] = llama["chat_template"]
config["bos_token"] = "<|endoftext|>"
json.dump(config, open(path, "w"))
PY

cp "$source_dir"/tests/fixtures/chat_data/{sft,no-messages,bad-role,long}.jsonl "$work"

# ---- one SFT run against Transformers ----
chat=(--preset hf --model.hf_assets_path="$work/model" --checkpoint.initial_load_path="$work/model"
      --checkpoint.initial_load_in_hf=true --training.dataset=chat
      --lr_scheduler.warmup_steps=0 --lr_scheduler.decay_type=none --metrics.log_freq=1)
common=("${chat[@]}" --threads 2)
"$titan" train "${common[@]}" --training.dataset_path="$work/sft.jsonl" --training.seq_len=160 \
  --training.local_batch_size=2 --training.global_batch_size=4 --training.steps=3 \
  --optimizer.lr=1e-3 --optimizer.eps=1e-4 --checkpoint.last_save_in_hf=true \
  --validation.enable=true --validation.dataset_path="$work/sft.jsonl" --validation.freq=3 \
  --metrics.save_jsonl="$work/sft-metrics.jsonl" --job.dump_folder="$work/sft" > "$work/sft.log"
grep -q "chat data: the Qwen3 chat template of $work/model; loss on the assistant replies only" \
  "$work/sft.log" || { echo "the log does not say how chat data is read"; cat "$work/sft.log"; exit 1; }

validation=$("$python" -c 'import json,sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "validation_loss" in r: print("%.6f" % r["validation_loss"])' "$work/sft-metrics.jsonl")
"$titan" eval --model "$work/sft/hf" --data "$work/sft.jsonl" --chat --seq-len 160 --batch-size 2 \
  --threads 2 > "$work/eval.log" 2> /dev/null
evaluated=$(awk '{print $2}' "$work/eval.log")
echo "validation loss $validation, titan eval --chat $evaluated"
[ -n "$validation" ] && [ "$validation" = "$evaluated" ] || { echo "eval and validation disagree"; exit 1; }
"$python" "$reference" check "$work/model" "$work/sft.jsonl" "$work/sft-metrics.jsonl" \
  "$work/sft/hf" 3 2 1e-3 1e-4 "$evaluated" > "$work/reference.log" 2>&1 \
  || { cat "$work/reference.log"; exit 1; }
grep -v "Loading weights" "$work/reference.log"
# The same tokens scored: Transformers' assistant tokens are titan eval's.
scored=$(sed -n 's/^assistant tokens in the global batch: //p' "$work/reference.log")
grep -q "($scored assistant tokens scored in 2 batches" "$work/eval.log" \
  || { echo "titan eval --chat did not score Transformers' $scored assistant tokens"; cat "$work/eval.log"; exit 1; }

# Packed (training.dataset_packing): the four conversations in one row of exactly their length
# (seq_len = the sum of each one's tokens but its last), attention kept inside each and positions
# restarting at each, so the step is Transformers' step over them in rows of their own (the same
# reference, loss within 1e-5 per step, weights within 1e-6).
packed_len=$("$python" - "$work/model" "$work/sft.jsonl" "$reference" <<'PY'
import importlib.util, sys
from transformers import AutoTokenizer
spec = importlib.util.spec_from_file_location("reference", sys.argv[3])
reference = importlib.util.module_from_spec(spec)
spec.loader.exec_module(reference)
tok = AutoTokenizer.from_pretrained(sys.argv[1])
print(sum(len(ids) - 1 for ids, _ in reference.rows(tok, sys.argv[2])))
PY
)
"$titan" train "${common[@]}" --training.dataset_path="$work/sft.jsonl" --training.dataset_packing=true \
  --training.seq_len="$packed_len" --training.local_batch_size=1 --training.global_batch_size=1 \
  --training.steps=3 --optimizer.lr=1e-3 --optimizer.eps=1e-4 --checkpoint.last_save_in_hf=true \
  --validation.enable=true --validation.dataset_path="$work/sft.jsonl" --validation.freq=3 \
  --metrics.save_jsonl="$work/packed-metrics.jsonl" --job.dump_folder="$work/packed" > "$work/packed.log"
grep -q "conversations packed into rows (training.dataset_packing)" "$work/packed.log" ||
  { echo "the log does not say the conversations are packed"; cat "$work/packed.log"; exit 1; }
# titan eval --chat --packing on the export packs the same way (one row of the four): its loss
# equals the same conversations' one per row, and Transformers' masked loss of the trained model.
"$titan" eval --model "$work/packed/hf" --data "$work/sft.jsonl" --chat --packing \
  --seq-len "$packed_len" --batch-size 1 --threads 2 > "$work/eval-packed.log" 2> /dev/null
grep -q "($scored assistant tokens scored in 1 batches of 1 rows; a row is whole conversations packed" \
  "$work/eval-packed.log" || { echo "titan eval --packing: not one packed row"; cat "$work/eval-packed.log"; exit 1; }
"$titan" eval --model "$work/packed/hf" --data "$work/sft.jsonl" --chat --seq-len 160 \
  --batch-size 2 --threads 2 > "$work/eval-unpacked.log" 2> /dev/null
evaluated_packed=$(awk '{print $2}' "$work/eval-packed.log")
evaluated_unpacked=$(awk '{print $2}' "$work/eval-unpacked.log")
validation_packed=$("$python" -c 'import json,sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "validation_loss" in r: print("%.6f" % r["validation_loss"])' "$work/packed-metrics.jsonl")
echo "titan eval --chat on the packed run's export: packed $evaluated_packed, one per row $evaluated_unpacked; the run's packed validation $validation_packed"
[ -n "$validation_packed" ] && [ "$validation_packed" = "$evaluated_packed" ] \
  || { echo "the packed run's validation and titan eval --packing disagree"; exit 1; }
"$python" -c 'import sys; a, b = map(float, sys.argv[1:]); sys.exit(abs(a - b) > 2e-6)' \
  "$evaluated_packed" "$evaluated_unpacked" \
  || { echo "packed and unpacked eval disagree"; cat "$work/eval-packed.log" "$work/eval-unpacked.log"; exit 1; }
"$python" "$reference" check "$work/model" "$work/sft.jsonl" "$work/packed-metrics.jsonl" \
  "$work/packed/hf" 3 2 1e-3 1e-4 "$evaluated_packed" > "$work/reference-packed.log" 2>&1 \
  || { cat "$work/reference-packed.log"; exit 1; }
grep -E "^(step|weights|titan eval|chat SFT)" "$work/reference-packed.log" | sed "s/^/packed ($packed_len tokens a row): /"

# The same run on 2 ranks (FSDP; one row per micro-batch, two micro-batches each): the loss is
# still over the assistant tokens of the whole global batch, so it equals Transformers' step too.
. "$(dirname "$0")/mpi_env.sh"
"$titan" launch --nproc 2 train "${chat[@]}" --threads 1 --training.dataset_path="$work/sft.jsonl" \
  --training.seq_len=160 --training.local_batch_size=1 --training.global_batch_size=4 \
  --training.steps=3 --optimizer.lr=1e-3 --optimizer.eps=1e-4 --checkpoint.last_save_in_hf=true \
  --metrics.save_jsonl="$work/fsdp-metrics.jsonl" --job.dump_folder="$work/fsdp" > "$work/fsdp.log" 2>&1 \
  || { cat "$work/fsdp.log"; exit 1; }
grep -q "dp_shard 2" "$work/fsdp.log" || { echo "not FSDP over 2 ranks"; cat "$work/fsdp.log"; exit 1; }
"$python" "$reference" check "$work/model" "$work/sft.jsonl" "$work/fsdp-metrics.jsonl" \
  "$work/fsdp/hf" 3 2 1e-3 1e-4 > "$work/reference-fsdp.log" 2>&1 \
  || { cat "$work/reference-fsdp.log"; exit 1; }
grep -E "^(weights|chat SFT)" "$work/reference-fsdp.log" | sed 's/^/FSDP 2: /'

# Each rank tokenizes only the conversations of its own rows (data/loader.h), on one stream of
# batches every rank walks: 2 ranks (a row each per micro-batch, conversations cut to 65 tokens)
# saved at step 2 resume on one process and on 4 ranks (HSDP 2 x 2) with the uninterrupted run's
# losses (within 1e-5: the sums meet in another order) and its count of cut conversations, which
# every rank counts in its own rows and the job sums.
share=("${chat[@]}" --threads 1 --training.dataset_path="$work/sft.jsonl" --training.seq_len=64
       --training.truncate_long_conversations=true --training.local_batch_size=1
       --training.global_batch_size=4 --training.steps=4 --checkpoint.enable=true
       --checkpoint.interval=2 --checkpoint.keep_latest_k=0 --checkpoint.last_save_in_hf=false)
"$titan" launch --nproc 2 train "${share[@]}" --metrics.save_jsonl="$work/share2.jsonl" \
  --job.dump_folder="$work/share2" > "$work/share2.log" 2>&1 || { cat "$work/share2.log"; exit 1; }
cut_line=$(grep "^conversations cut" "$work/share2.log") \
  || { echo "no conversation was cut"; cat "$work/share2.log"; exit 1; }
for layout in 1 4; do
  cp -r "$work/share2" "$work/share2to$layout"
  rm -rf "$work/share2to$layout/checkpoint/step-4"
  run=("$titan" train)
  [ $layout = 4 ] && run=("$titan" launch --nproc 4 train --parallelism.data_parallel_replicate_degree=2)
  "${run[@]}" "${share[@]}" --metrics.save_jsonl="$work/share2to$layout.jsonl" \
    --job.dump_folder="$work/share2to$layout" > "$work/share2to$layout.log" 2>&1 \
    || { cat "$work/share2to$layout.log"; exit 1; }
  grep -q "resumed step 2 from" "$work/share2to$layout.log" \
    || { echo "not resumed on $layout"; cat "$work/share2to$layout.log"; exit 1; }
  [ "$(grep "^conversations cut" "$work/share2to$layout.log")" = "$cut_line" ] \
    || { echo "cut conversations differ on $layout: $cut_line"; cat "$work/share2to$layout.log"; exit 1; }
done
"$python" - "$work" <<'PY'
import json, sys
work = sys.argv[1]
def losses(name):
    return {r["step"]: r["loss"] for r in map(json.loads, open(f"{work}/{name}.jsonl")) if "loss" in r}
whole = losses("share2")
for name in ("share2to1", "share2to4"):
    resumed = losses(name)
    assert sorted(resumed) == [3, 4], resumed
    worst = max(abs(resumed[s] - whole[s]) / abs(whole[s]) for s in (3, 4))
    assert worst <= 1e-5, (name, whole, resumed)
    print(f"chat, 2 ranks each tokenizing its own rows, resumed on {name[-1]}: steps 3-4 within {worst:.1e}")
PY

# Packed conversations on 2 ranks (FSDP, rows of 160 tokens): the ranks split the encoding of each
# window of conversations and sum their lengths, each encoding the others' only where they land in
# its own rows (data/loader.h); the losses equal one process's within 1e-5 (the sums meet in
# another order).
packshare=("${chat[@]}" --threads 1 --training.dataset_path="$work/sft.jsonl"
           --training.dataset_packing=true --training.seq_len=160 --training.local_batch_size=1
           --training.global_batch_size=2 --training.steps=4 --checkpoint.last_save_in_hf=false)
"$titan" train "${packshare[@]}" --metrics.save_jsonl="$work/packshare1.jsonl" \
  --job.dump_folder="$work/packshare1" > "$work/packshare1.log" 2>&1 || { cat "$work/packshare1.log"; exit 1; }
"$titan" launch --nproc 2 train "${packshare[@]}" --metrics.save_jsonl="$work/packshare2.jsonl" \
  --job.dump_folder="$work/packshare2" > "$work/packshare2.log" 2>&1 || { cat "$work/packshare2.log"; exit 1; }
grep -q "dp_shard 2" "$work/packshare2.log" || { echo "not FSDP over 2 ranks"; cat "$work/packshare2.log"; exit 1; }
"$python" - "$work" <<'PY'
import json, sys
work = sys.argv[1]
def losses(name):
    return {r["step"]: r["loss"] for r in map(json.loads, open(f"{work}/{name}.jsonl")) if "loss" in r}
one, two = losses("packshare1"), losses("packshare2")
assert sorted(one) == sorted(two) == [1, 2, 3, 4], (one, two)
worst = max(abs(two[s] - one[s]) / abs(one[s]) for s in one)
assert worst <= 1e-5, (one, two)
print(f"packed chat on 2 ranks, each encoding its share: steps 1-4 within {worst:.1e} of one process")
PY

# A conversation that reads but does not encode (reasoning_content under the Qwen2.5 Instruct
# template) in packed data: one line naming its file and line, on one process and on 2 ranks
# sharing the encoding (every rank stops at it alike, rank 0 printing the line for the job:
# titan::JobWideError), a non-zero exit and no wait for the job's abort.
cp -r "$work/model" "$work/qwen25"
"$python" - "$work" "$source_dir/tests/fixtures/chat_templates.json" <<'PY'
import json, sys
work, templates = sys.argv[1:]
qwen25 = next(t for t in json.load(open(templates)) if t["kind"] == "qwen2_5")
path = f"{work}/qwen25/tokenizer_config.json"
config = json.load(open(path))
config["chat_template"] = qwen25["chat_template"]
json.dump(config, open(path, "w"))
lines = [json.loads(line) for line in open(f"{work}/sft.jsonl")]
lines[1]["messages"][-1]["reasoning_content"] = "Think twice."
with open(f"{work}/reasoning.jsonl", "w") as f:
    f.writelines(json.dumps(line) + "\n" for line in lines)
PY
unencodable=("${packshare[@]}" --model.hf_assets_path="$work/qwen25"
             --checkpoint.initial_load_path="$work/qwen25" --training.dataset_path="$work/reasoning.jsonl")
reasoning="titan train: error: $work/reasoning.jsonl:2: chat template: message 4 has reasoning_content, which the Qwen2\.5 Instruct template does not render \(only Qwen3's does\)$"
for nproc in 1 2; do
  log="$work/unencodable$nproc.log" start=$SECONDS status=0
  launch=("$titan")
  [ $nproc = 1 ] || launch=("$titan" launch --nproc 2)
  "${launch[@]}" train "${unencodable[@]}" --job.dump_folder="$work/unencodable$nproc" > "$log" 2>&1 || status=$?
  [ "$status" -ge 1 ] && [ "$status" -le 127 ] || { echo "unencodable on $nproc: exit status $status"; cat "$log"; exit 1; }
  [ $((SECONDS - start)) -lt 60 ] || { echo "unencodable on $nproc: took $((SECONDS - start)) s (a rank waited for the abort)"; cat "$log"; exit 1; }
  [ "$(grep -c 'titan train: error: ' "$log")" = 1 ] && grep -qE "^(\[rank 0 of 2\] )?$reasoning" "$log" \
    || { echo "unencodable on $nproc: expected one line matching '$reasoning':"; cat "$log"; exit 1; }
done
echo "an unencodable conversation in packed data: one line on one process and on 2 ranks"

# bf16 mixed precision on the same data: the same masked loss, to bf16's rounding.
"$titan" train "${common[@]}" --training.dataset_path="$work/sft.jsonl" --training.seq_len=160 \
  --training.local_batch_size=2 --training.global_batch_size=4 --training.steps=3 \
  --optimizer.lr=1e-3 --optimizer.eps=1e-4 --training.mixed_precision_param=bfloat16 \
  --checkpoint.last_save_in_hf=false --metrics.save_jsonl="$work/bf16-metrics.jsonl" \
  --job.dump_folder="$work/bf16" > "$work/bf16.log" 2>&1 || { cat "$work/bf16.log"; exit 1; }
grep -q "^mixed precision: " "$work/bf16.log" || { echo "not a bf16 run"; cat "$work/bf16.log"; exit 1; }
"$python" - "$work/sft-metrics.jsonl" "$work/bf16-metrics.jsonl" <<'PY'
import json, sys
fp32, bf16 = ({r["step"]: r["loss"] for r in map(json.loads, open(p)) if "loss" in r} for p in sys.argv[1:])
worst = max(abs(fp32[s] - bf16[s]) for s in (1, 2, 3))
print(f"bf16: losses within {worst:.2g} of fp32's")
assert sorted(bf16) == [1, 2, 3] and 0 < worst < 0.02, (fp32, bf16)
PY

# No conversation dropped: batches of 3 over the 4 conversations score them all, the last batch
# holding one conversation and two empty rows.
"$titan" eval --model "$work/sft/hf" --data "$work/sft.jsonl" --chat --seq-len 160 --batch-size 3 \
  --threads 2 > "$work/eval3.log" 2> /dev/null
grep -q "($scored assistant tokens scored in 2 batches of 3 rows" "$work/eval3.log" \
  || { echo "titan eval --chat --batch-size 3 dropped a conversation"; cat "$work/eval3.log"; exit 1; }
"$python" -c 'import sys; a, b = map(float, sys.argv[1:]); sys.exit(abs(a - b) > 2e-6)' \
  "$evaluated" "$(awk '{print $2}' "$work/eval3.log")" \
  || { echo "the loss depends on the batch size"; cat "$work/eval.log" "$work/eval3.log"; exit 1; }

# ---- bad inputs: one line each, naming what and where ----
bad=(--training.seq_len=48 --training.local_batch_size=2 --training.steps=2
     --checkpoint.last_save_in_hf=false)
expect_refusal no-messages "no-messages.jsonl:2: no non-empty \"messages\" list$" \
  "$titan" train "${common[@]}" "${bad[@]}" --training.dataset_path="$work/no-messages.jsonl" \
  --job.dump_folder="$work/bad1"
expect_refusal bad-role \
  "bad-role.jsonl:2: messages\[1\] has role \"robot\" \(expected system, user, assistant or tool\)$" \
  "$titan" train "${common[@]}" "${bad[@]}" --training.dataset_path="$work/bad-role.jsonl" \
  --job.dump_folder="$work/bad2"
expect_refusal long "long.jsonl:3: the conversation has [0-9]+ tokens, more than seq_len \+ 1 = 49 \(raise training.seq_len, or set training.truncate_long_conversations = true to cut it\)$" \
  "$titan" train "${common[@]}" "${bad[@]}" --training.steps=3 --training.dataset_path="$work/long.jsonl" \
  --training.global_batch_size=4 --job.dump_folder="$work/bad3"
# titan eval says on stderr what its matmuls compute in before it reads the data: one error line
# after that. The rows stream in, so a slow build (the sanitizers) may show the progress of the
# batches scored before the bad row; the error still comes alone on its line.
eval_refusal() {
  local name="$1" pattern="$2"
  shift 2
  if "$@" > "$work/$name.out" 2> "$work/$name.err"; then
    echo "$name: the command succeeded"; cat "$work/$name.out"; exit 1
  fi
  [ "$(grep -v -e '^precision: ' -e '^evaluating[ :]' "$work/$name.err" | wc -l)" = 1 ] \
    || { echo "$name: expected one error line:"; cat "$work/$name.err"; exit 1; }
  grep -qE "$pattern" "$work/$name.err" || { echo "$name: unexpected error:"; cat "$work/$name.err"; exit 1; }
}
eval_refusal eval-long "^titan eval: error: $work/long.jsonl:3: the conversation has [0-9]+ tokens, more than seq_len \+ 1 = 49 \(raise --seq-len, or pass --truncate-long-conversations to cut it\)$" \
  "$titan" eval --model "$work/model" --data "$work/long.jsonl" --chat --seq-len 48 --threads 2
expect_refusal no-template "^titan train: error: training.dataset = \"chat\" renders conversations with the chat template of model.hf_assets_path: $work/no-template: no chat template \(no chat_template.jinja, no \"chat_template\" in tokenizer_config.json\)$" \
  "$titan" train "${common[@]}" "${bad[@]}" --model.hf_assets_path="$work/no-template" \
  --checkpoint.initial_load_path="$work/no-template" --training.dataset_path="$work/sft.jsonl" \
  --job.dump_folder="$work/bad4"
expect_refusal wrong-tokens "^titan train: error: chat data with the Llama 3.1 Instruct template needs a tokenizer with the <\|start_header_id\|> and <\|eot_id\|> tokens$" \
  "$titan" train "${common[@]}" "${bad[@]}" --model.hf_assets_path="$work/llama-template" \
  --checkpoint.initial_load_path="$work/llama-template" --training.dataset_path="$work/sft.jsonl" \
  --job.dump_folder="$work/bad6"
expect_refusal eval-no-template "^titan eval: error: $work/no-template: no chat template \(no chat_template.jinja, no \"chat_template\" in tokenizer_config.json\)$" \
  "$titan" eval --model "$work/no-template" --data "$work/sft.jsonl" --chat --seq-len 48 --threads 2
# On documents the key would do nothing: a warning says so.
"$titan" train "${common[@]}" "${bad[@]}" --training.steps=1 --training.dataset=jargon \
  --training.dataset_path=/usr/share/doc/jargon-text/jargon.txt.gz \
  --training.truncate_long_conversations=true --job.dump_folder="$work/docs" > /dev/null 2> "$work/docs.err"
grep -q "^warning: training.truncate_long_conversations has no effect: training.dataset is not \"chat\"" \
  "$work/docs.err" || { echo "no warning for truncate_long_conversations on documents"; cat "$work/docs.err"; exit 1; }

# Cut when asked: the run trains, and titan eval scores the long conversation's first 49 tokens.
"$titan" train "${common[@]}" "${bad[@]}" --training.steps=3 --training.dataset_path="$work/long.jsonl" \
  --training.global_batch_size=4 --training.truncate_long_conversations=true \
  --job.dump_folder="$work/cut" > "$work/cut.log"
grep -q "^conversations cut to seq_len + 1 = 49 tokens: [1-9]" "$work/cut.log" \
  || { echo "the run does not say it cut conversations"; cat "$work/cut.log"; exit 1; }
"$titan" eval --model "$work/model" --data "$work/long.jsonl" --chat --seq-len 48 --batch-size 1 \
  --truncate-long-conversations --threads 2 2> /dev/null | grep -qE "^loss [0-9]" \
  || { echo "eval --truncate-long-conversations"; exit 1; }

# ---- resuming mid-run, across an epoch's end, gives the uninterrupted run's losses bit for bit ----
resume=(--training.dataset_path="$source_dir/examples/chat/conversations.jsonl" --training.seq_len=256
        --training.local_batch_size=2 --training.global_batch_size=4 --checkpoint.enable=true
        --checkpoint.interval=2 --checkpoint.last_save_model_only=false --checkpoint.last_save_in_hf=false)
"$titan" train "${common[@]}" "${resume[@]}" --training.steps=6 --job.dump_folder="$work/whole" \
  --metrics.save_jsonl="$work/whole.jsonl" > /dev/null
"$titan" train "${common[@]}" "${resume[@]}" --training.steps=3 --job.dump_folder="$work/split" > /dev/null
rm -r "$work/split/checkpoint/step-3"  # resume from step 2: the epoch (12 conversations) ends in step 3
"$titan" train "${common[@]}" "${resume[@]}" --training.steps=6 --job.dump_folder="$work/split" \
  --metrics.save_jsonl="$work/split.jsonl" > "$work/split.log"
grep -q "resumed step 2 from" "$work/split.log" || { echo "did not resume"; cat "$work/split.log"; exit 1; }
"$python" - "$work/whole.jsonl" "$work/split.jsonl" <<'PY'
import json, sys
whole, split = ({r["step"]: r["loss"] for r in map(json.loads, open(p)) if "loss" in r} for p in sys.argv[1:])
assert sorted(split) == [3, 4, 5, 6] and all(split[s] == whole[s] for s in split), (whole, split)
print("resumed chat run: steps 3-6 equal the uninterrupted run's bit for bit")
PY

# ---- the conversations docs/TRAINING.md fine-tunes on: learned, and answered by generate --chat ----
"$titan" train "${common[@]}" --training.dataset_path="$source_dir/examples/chat/conversations.jsonl" \
  --training.seq_len=256 --training.local_batch_size=6 --training.global_batch_size=12 \
  --training.steps=80 --optimizer.lr=1e-2 --lr_scheduler.warmup_steps=5 \
  --lr_scheduler.decay_type=linear --checkpoint.last_save_in_hf=true \
  --metrics.save_jsonl="$work/example.jsonl" --job.dump_folder="$work/example" > "$work/example.log"
"$python" - "$work/example.jsonl" <<'PY'
import json, sys
losses = [json.loads(l)["loss"] for l in open(sys.argv[1]) if '"loss"' in l]
print(f"examples/chat: loss {losses[0]:.4f} -> {losses[-1]:.4f} in {len(losses)} steps")
assert losses[-1] < 0.1, "the conversations were not learned"
PY
for qa in "What is 12 times 12?|12 times 12 is 144." \
          "Where does the chat template come from?|From the model folder: chat_template.jinja, or the chat_template of tokenizer_config.json."; do
  question="${qa%%|*}"
  answer="${qa#*|}"
  "$titan" generate --model "$work/example/hf" --chat --prompt "$question" --greedy \
    --max-new-tokens 100 --threads 2 > "$work/answer.txt" 2> /dev/null
  grep -qxF "$answer" "$work/answer.txt" || { echo "generate --chat: \"$question\" got:"; cat "$work/answer.txt"; exit 1; }
  echo "generate --chat on the export: \"$question\" -> \"$answer\""
done
echo "train_chat: ok"
