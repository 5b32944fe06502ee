#!/usr/bin/env bash
# The quick start's run (the tiny flavor on the built-in corpus with titan's own tokenizer, whose
# EOS ends every document) exports a folder whose config.json and generation_config.json name the
# tokenizer's EOS, so Transformers' generate stops on it (tests/reference/export_eos_check.py).
set -euo pipefail
titan=$(realpath "$1")
python="$2"
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$titan" train --training.steps=100 --threads 2 --job.dump_folder="$work/run" > "$work/train.log" 2>&1 \
  || { cat "$work/train.log"; exit 1; }
"$python" "$here/../reference/export_eos_check.py" "$work/run/hf"
