# Sourced by the e2e tests that train one model in several layouts and compare them (tensor and
# expert parallel, EP x TP, checkpoint layouts, the global load-balancing loss, each rank's data
# share). The caller sets
# titan, python, work and the array common (the flags every run shares); the file sets the MPI
# environment (mpi_env.sh) and these:
#   run NAME NPROC ARGS...      one job (NPROC 1: without mpirun), its metrics in NAME.jsonl, its
#                               output in NAME.log (printed, and the test stopped, if it fails)
#   one_line LOG PATTERN        exactly one line of the log matches
#   equal_to_single [--adapter] REF FIRST_STEP RUN...
#                               tests/e2e/equal_to_single.py: losses and grad norms within 1e-5
#                               relative of REF's from FIRST_STEP on, the exports' tensors the same
#                               (--adapter: the LoRA adapters')
#   same_export REF RUN...      each RUN's export byte for byte REF's
#   refused NAME NPROC PATTERN ARGS...
#                               an NPROC-rank job (the common flags and ARGS) fails, exactly one
#                               line of its output matching PATTERN
#   write_tiny_qwen3_moe FOLDER a Hugging Face Qwen3-MoE folder from transformers (its layout, one
#                               tensor per expert; random weights, seed 0) with a tokenizer
# and the array tiny_moe_layouts: the flags the tiny_moe layout tests share (a caller's common).
e2e_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$e2e_dir/mpi_env.sh"

# The tiny_moe flavor (8 experts, 2 per token) with the load-balancing loss on, local (every rank's
# statistics its data-parallel rank's whole rows, as the single process's micro-batches of one
# row), 10 steps of global batch 4, in fp32. The learning rate 1e-5, not the default 8e-4: at 8e-4
# the tiny MoE's trajectory is chaotic -- AdamW moves a weight whose moments nearly cancel by up
# to 2 lr whichever side the rounding falls, and a token's routing can then flip -- so layouts
# that round differently part after a few steps (measured in the sanitizer build: FSDP 2 x TP 2 x
# EP 2 against TP 2 x EP 2 within 1e-9 for 3 steps, then 7.3e-5 at step 4; at 1e-5 within 3e-8
# over 10 steps); the experts' partial sums over TP ranks round differently from whole products.
# shellcheck disable=SC2034  # used by the sourcing scripts
tiny_moe_layouts=(--model.flavor=tiny_moe --model.output_router_logits=true
                  --model.router_aux_loss_scope=local --optimizer.lr=1e-5 --training.steps=10
                  --training.seq_len=64 --training.local_batch_size=1 --training.global_batch_size=4
                  --lr_scheduler.warmup_steps=2 --metrics.log_freq=1
                  --checkpoint.last_save_in_hf=true --threads 1)

run() {
  local name="$1" n="$2"
  shift 2
  local launch=("$titan")
  [ "$n" = 1 ] || launch=("$titan" launch --nproc "$n")
  "${launch[@]}" train "${common[@]}" "$@" --job.dump_folder="$work/$name" \
    --metrics.save_jsonl="$work/$name.jsonl" > "$work/$name.log" 2>&1 || { cat "$work/$name.log"; exit 1; }
}
one_line() {
  [ "$(grep -c -- "$2" "$1")" = 1 ] || { echo "expected one line matching '$2':"; cat "$1"; exit 1; }
}
equal_to_single() { "$python" "$e2e_dir/equal_to_single.py" "$work" "$@"; }
same_export() {
  local reference="$1" name
  shift
  for name in "$@"; do
    cmp "$work/$reference/hf/model.safetensors" "$work/$name/hf/model.safetensors" \
      || { echo "$name: export differs from $reference's"; exit 1; }
    echo "$name: export byte for byte $reference's"
  done
}
refused() {
  local name="$1" n="$2" pattern="$3"
  shift 3
  if "$titan" launch --nproc "$n" train "${common[@]}" "$@" --job.dump_folder="$work/$name" > "$work/$name.log" 2>&1; then
    echo "$name: ran"; cat "$work/$name.log"; exit 1
  fi
  one_line "$work/$name.log" "$pattern"
}
write_tiny_qwen3_moe() {
  "$python" - "$1" "$e2e_dir/../fixtures/llama3-style-tokenizer" <<'PY'
import shutil, sys, torch
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
folder, tokenizer = sys.argv[1:]
config = Qwen3MoeConfig(vocab_size=472, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                        max_position_embeddings=512, num_experts=4, num_experts_per_tok=2,
                        moe_intermediate_size=32, decoder_sparse_step=1, mlp_only_layers=[])
torch.manual_seed(0)
Qwen3MoeForCausalLM(config).save_pretrained(folder, safe_serialization=True)
for f in ("tokenizer.json", "tokenizer_config.json"):
    shutil.copy(f"{tokenizer}/{f}", f"{folder}/{f}")
PY
}
