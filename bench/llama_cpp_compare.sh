#!/usr/bin/env bash
# titan's prefill and decode against llama.cpp's on the same model (issue 14): bench_generate's
# Qwen3-0.6B-dims model (all 28 layers, random weights, seeded) in fp32 and in bf16, batch 1,
# a 512-token prompt and 128 new tokens, 2 threads, a 16-bit KV cache in both engines: titan's
# bf16 one, llama.cpp's f16 one (llama-bench's default; it has no f32 cache; --llama-kv bf16 for
# its bf16 one).
#
#   bench/llama_cpp_compare.sh [--threads 2] [--dtype both|float32|bfloat16] [--reps 5]
#                              [--llama-kv f16|bf16] [--llama-omp-wait libgomp|short]
#                              [--depth 512] [--rounds 1]
#
# --depth D makes the prompt D tokens long: both engines prefill D tokens from an empty cache
# and decode at depth D and after.
#
# --rounds N runs both engines N times per dtype, alternating which goes first (titan in odd rounds,
# llama.cpp in even ones), and prints each round's ratios and their median: decode is bound by
# the memory's bandwidth, which on a shared VM moves by 2x within a minute, so one engine after the
# other compares the two moments as much as the two engines.
#
# --llama-omp-wait short runs llama-bench with the OMP_WAIT_POLICY and GOMP_SPINCOUNT that
# bench_generate ran with (its short spin, passive waits); libgomp, the default, leaves them as
# they are, as llama.cpp ships. ggml's OpenMP build ends every graph node with an omp barrier:
# on a machine with more runnable threads than cores, libgomp's spinning there slows its decode
# several times (docs/PERFORMANCE.md, "Against llama.cpp").
#
# llama.cpp is the copy vendored in the llama-cpp-python 0.3.36 source package: fetched with pip
# and its llama-bench built (Release, CPU only, -DGGML_NATIVE=ON) once into
# $TITAN_LLAMA_CPP_DIR (default ${XDG_CACHE_HOME:-~/.cache}/titan/llama.cpp-0.3.36), reused after.
# The model is exported by `bench_generate --export` and converted by llama.cpp's own
# convert_hf_to_gguf.py (--outtype f32 / bf16) in a temporary folder, removed at the end; the
# folder gets a stand-in tokenizer first (bench/llama_cpp_vocab.py says why it does not matter).
#
# For each dtype, one after the other in the same run: titan's bench_generate (prefill D
# tokens, best of 3; decode of 96 tokens at depth D+1 to D+96), then llama-bench's ppD at depth 0
# (-p D -n 0) and tg128 at depth D (-p 0 -n 128 -d D), the mean of --reps repetitions.
# Prints a table of tokens/s and the titan / llama.cpp ratios; the full logs stay under the
# cache's logs/ folder.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
me=llama_cpp_compare.sh
die() {
  echo "$me: $*" >&2
  exit 1
}

threads=2 dtypes=both reps=5 llama_kv=f16 llama_omp_wait=libgomp depth=512 rounds=1
while [ $# -gt 0 ]; do
  [ $# -ge 2 ] || die "$1 needs a value"
  case "$1" in
    --threads) threads=$2 ;;
    --dtype) dtypes=$2 ;;
    --reps) reps=$2 ;;
    --llama-kv) llama_kv=$2 ;;
    --llama-omp-wait) llama_omp_wait=$2 ;;
    --depth) depth=$2 ;;
    --rounds) rounds=$2 ;;
    *) die "unknown argument '$1' (expected --threads N, --dtype both|float32|bfloat16, --reps N, --llama-kv f16|bf16, --llama-omp-wait libgomp|short, --depth N, --rounds N)" ;;
  esac
  shift 2
done
[[ "$threads" =~ ^[1-9][0-9]*$ ]] || die "--threads $threads: expected a positive integer"
[[ "$reps" =~ ^[1-9][0-9]*$ ]] || die "--reps $reps: expected a positive integer"
[[ "$depth" =~ ^[1-9][0-9]*$ ]] || die "--depth $depth: expected a positive integer"
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || die "--rounds $rounds: expected a positive integer"
case "$llama_kv" in
  f16 | bf16) ;;
  *) die "--llama-kv $llama_kv: expected f16 or bf16" ;;
esac
case "$llama_omp_wait" in
  libgomp | short) ;;
  *) die "--llama-omp-wait $llama_omp_wait: expected libgomp or short" ;;
esac
case "$dtypes" in
  both) dtypes="float32 bfloat16" ;;
  float32 | bfloat16) ;;
  *) die "--dtype $dtypes: expected both, float32 or bfloat16" ;;
esac

version=0.3.36
cache=${TITAN_LLAMA_CPP_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/titan/llama.cpp-$version}
py=$root/.venv/bin/python
[ -x "$py" ] || die ".venv/bin/python not found: run scripts/setup.sh --tests first"
mkdir -p "$cache/logs" || die "cannot create the cache folder $cache"
logs=$cache/logs

# 1. llama.cpp: the sdist, unpacked, and its llama-bench built; each step kept once done.
sdist=$cache/sdist
llama=$sdist/vendor/llama.cpp
bench=$cache/build/bin/llama-bench
if [ ! -d "$sdist" ]; then
  tarball=$cache/llama_cpp_python-$version.tar.gz
  if [ ! -f "$tarball" ]; then
    echo "$me: downloading the llama-cpp-python==$version source package"
    rm -rf "$cache/download"
    "$root/.venv/bin/pip" download --no-deps --no-binary :all: -d "$cache/download" \
      "llama-cpp-python==$version" > "$logs/download.log" 2>&1 ||
      die "pip download of llama-cpp-python==$version failed; see $logs/download.log"
    mv "$cache/download/llama_cpp_python-$version.tar.gz" "$tarball" ||
      die "pip download did not write llama_cpp_python-$version.tar.gz; see $logs/download.log"
    rm -rf "$cache/download"
  fi
  rm -rf "$cache/unpack"
  mkdir -p "$cache/unpack"
  tar -xzf "$tarball" -C "$cache/unpack" || die "cannot unpack $tarball"
  mv "$cache/unpack/llama_cpp_python-$version" "$sdist" ||
    die "$tarball holds no llama_cpp_python-$version folder"
  rm -rf "$cache/unpack"
fi
if [ ! -f "$llama/CMakeLists.txt" ] || [ ! -f "$llama/convert_hf_to_gguf.py" ]; then
  die "$llama is not a llama.cpp source tree (remove $sdist to unpack it again)"
fi
if [ ! -x "$bench" ]; then
  echo "$me: building llama.cpp's llama-bench (-j2; takes a while, log: $logs/build.log)"
  # CPU only (no CUDA, Metal, Vulkan: their defaults are off), no HTTPS download support, a static
  # binary; only the llama-bench target.
  {
    cmake -S "$llama" -B "$cache/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
      -DBUILD_SHARED_LIBS=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
      -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF &&
      cmake --build "$cache/build" -j2 --target llama-bench
  } > "$logs/build.log" 2>&1 || die "building llama-bench failed; see $logs/build.log"
fi

# 2. What convert_hf_to_gguf.py imports (its vendored gguf-py aside): the project's pinned
# references plus sentencepiece, all in tests/reference/requirements.txt (PyYAML comes with
# transformers).
imports="torch, numpy, yaml, safetensors, transformers, sentencepiece"
if ! "$py" -c "import $imports" > /dev/null 2>&1; then
  echo "$me: installing the converter's missing Python packages from tests/reference/requirements.txt"
  "$root/.venv/bin/pip" install -q -r tests/reference/requirements.txt > "$logs/pip.log" 2>&1 ||
    die "pip install -r tests/reference/requirements.txt failed; see $logs/pip.log"
  "$py" -c "import $imports" > "$logs/pip.log" 2>&1 ||
    die "the converter's packages ($imports) still do not import; see $logs/pip.log"
fi

# 3. titan's bench_generate, and the model as GGUF files.
{
  cmake -S . -B build && cmake --build build -j2 --target bench_generate
} > "$logs/titan-build.log" 2>&1 || die "building titan's bench_generate failed; see $logs/titan-build.log"
work=$(mktemp -d "${TMPDIR:-/tmp}/titan-llama-cpp.XXXXXX")
trap 'rm -rf "$work"' EXIT
gguf_type() { [ "$1" = float32 ] && echo f32 || echo bf16; }
for d in $dtypes; do
  build/bench/bench_generate --dtype "$d" --export "$work/hf" > "$logs/export-$d.log" 2>&1 ||
    die "bench_generate --export failed; see $logs/export-$d.log"
  "$py" bench/llama_cpp_vocab.py "$work/hf/$d/tokenizer.model" > "$logs/vocab.log" 2>&1 ||
    die "writing the stand-in tokenizer.model failed; see $logs/vocab.log"
  echo "$me: converting the $d model with convert_hf_to_gguf.py --outtype $(gguf_type "$d")"
  "$py" "$llama/convert_hf_to_gguf.py" "$work/hf/$d" --outtype "$(gguf_type "$d")" \
    --outfile "$work/$d.gguf" > "$logs/convert-$d.log" 2>&1 ||
    die "convert_hf_to_gguf.py --outtype $(gguf_type "$d") failed; see $logs/convert-$d.log"
  rm -rf "$work/hf/$d"  # 1.2-2.4 GB the GGUF now holds
done

# 4. The runs: for each round and dtype, titan and llama.cpp, titan first in odd rounds.
load() { cut -d' ' -f1-3 /proc/loadavg; }
echo "$me: $(date -u '+%F %H:%M UTC'), load average $(load), $threads threads, depth $depth, llama-bench --reps $reps, $rounds round(s)"
echo "$me: KV cache: titan bf16, llama.cpp $llama_kv; llama-bench's OpenMP waits: $llama_omp_wait"
declare -A result
run_titan() { # dtype round
  local d=$1 r=$2 log=$logs/titan-$1-round$2.log
  echo "$me: round $r: titan $d (load $(load))"
  build/bench/bench_generate --threads "$threads" --dtype "$d" --kv-cache bfloat16 \
    --prompt "$depth" > "$log" 2>&1 || die "bench_generate --dtype $d failed; see $log"
  # Tokens over seconds: the line's tokens/s is rounded to a whole number.
  result[titan_pp_${d}_$r]=$(sed -n 's/.*] prefill \([0-9]*\) tokens: \([0-9.]*\) s,.*/\1 \2/p' \
    "$log" | awk '{ printf "%.1f", $1 / $2 }')
  # The segments' line (the step-by-step line decodes with read passes between the steps).
  result[titan_tg_${d}_$r]=$(sed -n 's/.*] decode at depth [0-9]*-[0-9]*: \([0-9.]*\) tokens\/s.*/\1/p' \
    "$log")
  if [ -z "${result[titan_pp_${d}_$r]}" ] || [ -z "${result[titan_tg_${d}_$r]}" ]; then
    die "no prefill or decode line in bench_generate's output; see $log"
  fi
  if [ "$llama_omp_wait" = short ] && [ -z "${llama_env[*]}" ]; then
    # bench_generate's header line: "... OMP_WAIT_POLICY=P GOMP_SPINCOUNT=N".
    read -r policy spin <<< "$(sed -n 's/.*OMP_WAIT_POLICY=\([^ ]*\) GOMP_SPINCOUNT=\([^ ]*\)$/\1 \2/p' "$log")"
    [ -n "${spin:-}" ] || die "no OMP_WAIT_POLICY / GOMP_SPINCOUNT line in $log"
    llama_env=(OMP_WAIT_POLICY="$policy" GOMP_SPINCOUNT="$spin")
  fi
}
run_llama() { # dtype round
  local d=$1 r=$2 run kind out
  echo "$me: round $r: llama.cpp $d (load $(load)${llama_env[*]:+; ${llama_env[*]}})"
  common=(-m "$work/$d.gguf" -t "$threads" -ctk "$llama_kv" -ctv "$llama_kv" -r "$reps" -o json)
  for run in "pp:-p $depth -n 0" "tg:-p 0 -n 128 -d $depth"; do
    kind=${run%%:*}
    out=$logs/llama-$kind-$d-round$r
    # shellcheck disable=SC2086  # the run's flags are split on purpose
    env "${llama_env[@]}" "$bench" "${common[@]}" ${run#*:} > "$out.json" 2> "$out.log" ||
      die "llama-bench ${run#*:} on the $d model failed; see $out.log"
    result[llama_${kind}_${d}_$r]=$("$py" -c '
import json, sys
r = json.load(open(sys.argv[1]))
print("%.2f %.2f" % (r[0]["avg_ts"], r[0]["stddev_ts"]))' "$out.json" 2> /dev/null) ||
      die "cannot read llama-bench's result; see $out.json"
  done
}
# llama-bench's waits come from titan's first run (its header line), so round 1 runs titan first.
llama_env=()
for r in $(seq 1 "$rounds"); do
  for d in $dtypes; do
    if [ $((r % 2)) -eq 1 ]; then
      run_titan "$d" "$r"
      run_llama "$d" "$r"
    else
      run_llama "$d" "$r"
      run_titan "$d" "$r"
    fi
  done
done
echo "$me: done $(date -u '+%H:%M UTC'), load average $(load)"

# 5. The table: each round's tokens/s and ratios, then each dtype's median ratios.
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
median() { tr ' ' '\n' | sort -g | awk '{ v[NR] = $1 } END { printf "%.2f", NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
echo
printf '%-6s %-12s %-8s %18s %18s\n' round engine weights "prefill tok/s" "decode tok/s"
declare -A ratios
for r in $(seq 1 "$rounds"); do
  for d in $dtypes; do
    read -r lpp lpp_sd <<< "${result[llama_pp_${d}_$r]}"
    read -r ltg ltg_sd <<< "${result[llama_tg_${d}_$r]}"
    rpp=$(ratio "${result[titan_pp_${d}_$r]}" "$lpp")
    rtg=$(ratio "${result[titan_tg_${d}_$r]}" "$ltg")
    ratios[pp_$d]="${ratios[pp_$d]:+${ratios[pp_$d]} }$rpp"
    ratios[tg_$d]="${ratios[tg_$d]:+${ratios[tg_$d]} }$rtg"
    printf '%-6s %-12s %-8s %18s %18s\n' "$r" titan "$d" "${result[titan_pp_${d}_$r]}" "${result[titan_tg_${d}_$r]}"
    printf '%-6s %-12s %-8s %18s %18s\n' "$r" llama.cpp "$d" "$lpp +- $lpp_sd" "$ltg +- $ltg_sd"
    printf '%-6s %-12s %-8s %17sx %17sx\n' "$r" "titan/llama" "$d" "$rpp" "$rtg"
  done
done
if [ "$rounds" -gt 1 ]; then
  for d in $dtypes; do
    printf '%-6s %-12s %-8s %17sx %17sx\n' median "titan/llama" "$d" \
      "$(median <<< "${ratios[pp_$d]}")" "$(median <<< "${ratios[tg_$d]}")"
  done
fi
echo "(prefill: $depth tokens from an empty cache; decode: titan 96 tokens at depth $((depth + 1))-$((depth + 96)),"
echo " llama.cpp 128 tokens at depth $depth-$((depth + 128)); KV cache titan bf16, llama.cpp $llama_kv;"
echo " llama-bench's OpenMP waits: $llama_omp_wait; logs: $logs)"
