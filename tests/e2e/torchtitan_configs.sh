#!/usr/bin/env bash
# torchtitan's own example TOMLs (tests/fixtures/torchtitan, verbatim) start and train 2 steps with
# only the dataset, the model folder and flavor (a tiny one of the same family, written here by
# Transformers) and the step count given by flags: every key in them is implemented or named in a
# "has no effect here" line, all of a file's at once. The 70B and 405B ones ask for 8-way tensor
# parallelism, which titan refuses in one line naming the key.
set -euo pipefail
titan=$(realpath "$1")
python="$2"
fixtures="$(cd "$(dirname "$0")/.." && pwd)/fixtures"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "$1"; [ -n "${2:-}" ] && cat "$2"; exit 1; }
cd "$work"
"$python" - "$fixtures/llama3-style-tokenizer" <<'PY'
import random, shutil, sys
from transformers import LlamaConfig, Qwen3Config, Qwen3MoeConfig
tok = sys.argv[1]
common = dict(vocab_size=472, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=8192)
configs = {
    "llama": LlamaConfig(**common, rope_theta=500000.0),
    "qwen3": Qwen3Config(**common),
    "qwen3_moe": Qwen3MoeConfig(**common, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                decoder_sparse_step=1, mlp_only_layers=[]),
}
for name, config in configs.items():
    config.save_pretrained(name)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(f"{tok}/{f}", f"{name}/{f}")
random.seed(0)
words = "the hacker ethic kludge daemon foo bar core dump cruft grok hack mode wizard".split()
with open("data.txt", "w") as out:
    for _ in range(400):
        out.write(" ".join(random.choice(words) for _ in range(60)) + "\n\n")
PY
run() {  # TOML MODEL_FOLDER
  local toml="$1" model="$2" name
  name=$(basename "$toml" .toml)
  "$titan" train --config "$fixtures/torchtitan/$toml" --model.hf_assets_path="$work/$model" --model.flavor=hf \
    --training.dataset_path="$work/data.txt" --training.steps=2 --threads 2 > "$name.log" 2> "$name.err" \
    || fail "$toml did not train" "$name.err"
  grep -qE "^step +2/2  loss" "$name.log" || fail "$toml: no step 2" "$name.log"
  grep -q "no effect here" "$name.err" || fail "$toml: no 'no effect here' line" "$name.err"
}
run llama3_debug_model.toml llama
run llama3_8b.toml llama
ls outputs/tb/*/events.out.tfevents.* > /dev/null || fail "llama3_8b.toml: its enable_tensorboard wrote no event file" llama3_8b.log
run qwen3_0.6b.toml qwen3
run qwen3_1.7b.toml qwen3
run qwen3_32b.toml qwen3
run qwen3_moe_debug.toml qwen3_moe
# Every key of a file accounted for: the 8B's compile and quantize keys each named, once; its
# async checkpoint and selective AC ("op") are implemented, so not named.
for key in compile.enable quantize.linear.float8.filter_fqns; do
  [ "$(grep -c -- "$key" llama3_8b.err)" = 1 ] || fail "llama3_8b: $key not named once" llama3_8b.err
done
! grep -q "checkpoint.async_mode" llama3_8b.err || fail "llama3_8b: checkpoint.async_mode named" llama3_8b.err
! grep -q "activation_checkpoint" llama3_8b.err || fail "llama3_8b: selective AC named" llama3_8b.err
# qwen3_32b's selective_ac_option beside mode = "full" is named as without effect.
grep -q "activation_checkpoint.selective_ac_option has no effect: activation_checkpoint.mode is \"full\"" \
  qwen3_32b.err || fail "qwen3_32b: its option beside full not named" qwen3_32b.err
for toml in llama3_70b.toml llama3_405b.toml; do
  if "$titan" train --config "$fixtures/torchtitan/$toml" --model.hf_assets_path="$work/llama" --model.flavor=hf \
      --training.dataset_path="$work/data.txt" --training.steps=2 --threads 2 > tp.log 2> tp.err; then
    fail "$toml trained without its 8-way tensor parallelism"
  fi
  grep -q "^titan train: error: .*tensor_parallel_degree" tp.err || fail "$toml: unclear refusal" tp.err
  ! grep -q "unknown" tp.err || fail "$toml: unknown keys" tp.err
done
# A file's unknown keys are reported together, in one line.
printf '[training]\nstepz = 3\n[metricz]\nlog_freq = 1\n[compile]\nenable = true\n' > bad.toml
if "$titan" train --config bad.toml > bad.log 2> bad.err; then fail "bad.toml was accepted"; fi
[ "$(wc -l < bad.err)" = 1 ] || fail "not one line" bad.err
grep -q "bad.toml: 2 unknown keys: unknown section \[metricz\]; did you mean \[metrics\]?; unknown key 'stepz' in \[training\]; did you mean 'steps'?$" bad.err \
  || fail "unknown keys not reported together" bad.err
echo ok
