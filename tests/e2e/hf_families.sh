#!/usr/bin/env bash
# Llama and Qwen2 folders get everything a Qwen3 folder gets, through the titan binary: `info`,
# `convert`, `train --preset hf` with its HF export (which Transformers loads with no missing or
# unexpected keys, to the same weights), `eval`, and `generate`, whose greedy tokens equal
# Transformers' generate() on the same folder. The folders are tiny random models written by
# save_pretrained, with the Qwen3 tokenizer beside them (titan's tokenizer serves any family).
# usage: hf_families.sh TITAN PYTHON
set -euo pipefail
titan=$(realpath "$1")
python="$2"
source "$(dirname "$0")/tree_sum.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tokenizer="$(cd "$(dirname "$0")/../fixtures/qwen3-tokenizer" && pwd)"

"$python" "$(dirname "$0")/write_tiny_llama_qwen2.py" "$work" "$tokenizer" 0.2

common=(--training.seq_len=32 --training.local_batch_size=2 --lr_scheduler.warmup_steps=0
        --metrics.log_freq=1 --threads 2 --training.dataset=files)
corpus=/usr/share/doc/jargon-text/jargon.txt.gz
for name in llama qwen2; do
  src="$work/$name"
  arch=$([ $name = llama ] && echo LlamaForCausalLM || echo Qwen2ForCausalLM)
  "$titan" info "$src" > "$work/$name.info"
  grep -q "architecture  $arch" "$work/$name.info" || { echo "$name: info"; cat "$work/$name.info"; exit 1; }

  "$titan" convert "$src" "$work/$name-bf16" --dtype bfloat16 > /dev/null
  "$titan" info "$work/$name-bf16" | grep "architecture  $arch" > /dev/null || { echo "$name: convert"; exit 1; }

  "$titan" train "${common[@]}" --preset hf --model.hf_assets_path="$src" --training.steps=3 \
    --training.dataset_path="$corpus" --checkpoint.initial_load_path="$src" \
    --checkpoint.initial_load_in_hf=true --checkpoint.last_save_in_hf=true \
    --job.dump_folder="$work/$name-run" > "$work/$name-train.log"
  [ -f "$work/$name-run/hf/config.json" ] || { echo "$name: no export"; cat "$work/$name-train.log"; exit 1; }

  expect_refusal "$name-wrong-name" "model.name 'qwen3' does not match .*$arch" \
    "$titan" train "${common[@]}" --preset hf --model.hf_assets_path="$src" --model.name=qwen3 \
    --training.steps=1 --training.dataset_path="$corpus" --job.dump_folder="$work/$name-wrong"

  "$titan" eval --model "$work/$name-run/hf" --data "$corpus" --seq-len 32 --batch-size 2 \
    --max-batches 2 --threads 2 > "$work/$name-eval.log"
  grep -qE "^loss [0-9]" "$work/$name-eval.log" || { echo "$name: eval"; cat "$work/$name-eval.log"; exit 1; }

  printf '{"prompt": "The hacker wrote"}\n{"prompt": "A kludge is"}\n' > "$work/prompts.jsonl"
  "$titan" generate --model "$work/$name-run/hf" --prompts "$work/prompts.jsonl" --greedy \
    --max-new-tokens 8 --dtype float32 --threads 2 > "$work/$name-generate.jsonl" 2> /dev/null

  "$python" - "$src" "$work/$name-run/hf" "$work/$name-generate.jsonl" <<'PY'
import json, sys, torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer
src, exported, generated = sys.argv[1:]
model, info = AutoModelForCausalLM.from_pretrained(exported, dtype=torch.float32,
                                                    output_loading_info=True)
assert not info["missing_keys"] and not info["unexpected_keys"], info
state = load_file(f"{exported}/model.safetensors")
for key, p in model.state_dict().items():
    if key in state:
        assert torch.equal(p, state[key]), key
before = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
moved = sum(not torch.equal(a, b) for a, b in zip(before.parameters(), model.parameters()))
assert moved > 0, "training changed no parameter"
tok = AutoTokenizer.from_pretrained(exported)
for line in open(generated):
    r = json.loads(line)
    prompt = ["The hacker wrote", "A kludge is"][r["index"]]
    ids = tok(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=8, do_sample=False, eos_token_id=None,
                             pad_token_id=0)
    want = out[0, ids.shape[1]:].tolist()
    assert r["ids"] == want, (prompt, r["ids"], want)
print(f"{model.config.architectures[0]}: export loads, greedy ids equal Transformers'")
PY
done
echo "hf_families: ok"
