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
#   write_tiny_qwen3_moe FOLDER a Hugging Face Qwen3-MoE folder from transformers (its layout, one
#                               tensor per expert; random weights, seed 0) with a tokenizer
e2e_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$e2e_dir/mpi_env.sh"

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
