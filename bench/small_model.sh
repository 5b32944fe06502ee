# Sourced, right after `me=NAME` and `cd` to the repository, by the benchmarks that train
# bench_train_step's `small` dims through `titan train` (h 512, 8 layers, 8/4 heads of 128, I 2048,
# V 151936 tied; 115.5 M parameters):
#   die MESSAGE              "$me: MESSAGE" on stderr, exit 1
#   parse_options USAGE ARGS...  each `--name value` of ARGS sets the script's variable `name`
#                            (dashes as underscores); USAGE ("--steps N, --dtype float32|bfloat16")
#                            names the options there are and is what an unknown one is told
#   positive_integers V...   dies unless each V is a whole number above 0
#   small_model_workspace    dies unless build/titan exists ($titan); makes $work (removed at exit)
#                            holding the model folder $work/small, and $logs ($TITAN_BENCH_LOGS,
#                            default a temporary folder) for the runs' logs
#   load_average             the machine's load averages, for the lines around the timed runs
#   make_small_model DIR     writes DIR/config.json and the built-in debug tokenizer's files (its
#                            2048 ids cost the same as any in the 151,936-row embedding)
die() {
  echo "$me: $*" >&2
  exit 1
}

parse_options() {
  local usage="$1" name
  shift
  while [ $# -gt 0 ]; do
    [ $# -ge 2 ] || die "$1 needs a value"
    name=${1#--}
    [[ "$1" == --* && " ${usage//,/} " == *" --$name "* ]] || die "unknown argument '$1' (expected $usage)"
    printf -v "${name//-/_}" '%s' "$2"
    shift 2
  done
}

positive_integers() {
  local v
  for v in "$@"; do
    [[ "$v" =~ ^[1-9][0-9]*$ ]] || die "'$v': expected a positive integer"
  done
}

small_model_workspace() {
  titan=build/titan
  [ -x "$titan" ] || die "$titan not found: build first (cmake --build build)"
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  logs=${TITAN_BENCH_LOGS:-$(mktemp -d)}
  mkdir -p "$logs"
  make_small_model "$work/small"
}

load_average() { uptime | sed 's/.*load average: //'; }

make_small_model() {
  local dir="$1"
  local tokenizer="${XDG_CACHE_HOME:-$HOME/.cache}/titan/debug-tokenizer-v1-2048"
  [ -f "$tokenizer/tokenizer.json" ] ||
    die "$tokenizer not found: run 'build/titan train --training.steps=1' once to make it"
  mkdir -p "$dir"
  cp "$tokenizer/tokenizer.json" "$tokenizer/tokenizer_config.json" "$dir/"
  cat > "$dir/config.json" <<'JSON'
{"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936,
 "hidden_size": 512, "intermediate_size": 2048, "num_hidden_layers": 8,
 "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 128,
 "max_position_embeddings": 4096, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
 "hidden_act": "silu", "tie_word_embeddings": true, "initializer_range": 0.02,
 "torch_dtype": "float32"}
JSON
}
