#!/usr/bin/env bash
# Binary files given as data are refused by their magic bytes, in one line saying what the file
# is and how to turn it into JSON Lines, by every reader (titan tokenize --bin here, titan train
# too): Parquet, Arrow (file and stream), safetensors, zip, NumPy, tar, bzip2, and a Parquet file
# gzip-compressed under a .txt name. A gzip-compressed text file is still read as text. Parquet
# and Arrow are written as their layouts begin (pyarrow is not in the reference environment).
set -euo pipefail
titan=$(realpath "$1")
python="$2"
tokenizer="$(cd "$(dirname "$0")/.." && pwd)/fixtures/qwen3-tokenizer"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "$1"; [ -n "${2:-}" ] && cat "$2"; exit 1; }
cd "$work"
"$python" - <<'PY'
import bz2, gzip, io, struct, tarfile, zipfile
import numpy as np
import safetensors.numpy as st
open("d.parquet", "wb").write(b"PAR1" + b"\x15\x04" * 20 + b"PAR1")
open("d.feather", "wb").write(b"ARROW1\x00\x00" + b"\x00" * 32 + b"ARROW1")
open("cache.arrow", "wb").write(b"\xff\xff\xff\xff" + struct.pack("<i", 120) + b"\x10\x00" * 20)
st.save_file({"w": np.zeros(3, dtype=np.float32)}, "w.safetensors")
with zipfile.ZipFile("z.jsonl", "w") as z:
    z.writestr("a.jsonl", '{"text": "x"}\n')
np.save("a.npy", np.arange(5))
with tarfile.open("t.txt", "w") as t:
    info = tarfile.TarInfo("a.txt"); data = b"some text\n"; info.size = len(data)
    t.addfile(info, io.BytesIO(data))
open("b.txt", "wb").write(bz2.compress(b"some text\n"))
open("p.txt", "wb").write(gzip.compress(open("d.parquet", "rb").read()))
open("ok.txt", "wb").write(gzip.compress(b"plain text, gzip-compressed\n"))
PY
refused() {  # FILE PATTERN
  if "$titan" tokenize --tokenizer "$tokenizer" --bin "out.bin" "$1" > "$1.out" 2> "$1.err"; then fail "$1 was read as data"; fi
  [ "$(wc -l < "$1.err")" = 1 ] || fail "$1: not one line" "$1.err"
  grep -qF "titan tokenize: error: $1: $2" "$1.err" || fail "$1: unclear refusal" "$1.err"
}
refused d.parquet "a Parquet file, not text: convert it to JSON Lines first, e.g. python -c \"import datasets; datasets.Dataset.from_parquet('d.parquet').to_json('d.jsonl')\""
refused d.feather "an Apache Arrow (Feather) file, not text: convert it to JSON Lines first"
refused cache.arrow "an Apache Arrow stream (a Hugging Face datasets cache file?), not text: convert it to JSON Lines first, e.g. python -c \"import datasets; datasets.Dataset.from_file('cache.arrow').to_json('cache.jsonl')\""
refused w.safetensors "a safetensors file (tensors, e.g. model weights), not text"
refused z.jsonl "a zip archive, not text: unzip it"
refused a.npy "a NumPy array (.npy), not text"
refused t.txt "a tar archive, not text"
refused b.txt "bzip2-compressed, not text: bunzip2 it"
refused p.txt "gzip-compressed; inside, a Parquet file, not text"
[ ! -e out.bin ] || fail "a token file was written"
"$titan" tokenize --tokenizer "$tokenizer" --bin out.bin ok.txt > ok.out 2>&1 || fail "gzip-compressed text refused" ok.out
# titan train says the same before training (the tiny model with its own tokenizer, from a first run).
"$titan" train --training.steps=1 --lr_scheduler.warmup_steps=0 --training.seq_len=16 --training.local_batch_size=1 \
  --threads 2 --job.dump_folder=first > first.log 2>&1 || fail "the first run failed" first.log
if "$titan" train --training.dataset=mine --training.dataset_path=d.parquet --model.hf_assets_path=first/hf \
  --training.steps=1 --lr_scheduler.warmup_steps=0 --threads 2 --job.dump_folder=run > train.out 2> train.err; then fail "train read a Parquet file"; fi
grep -q "d.parquet: a Parquet file, not text" train.err || fail "train: unclear refusal" train.err
echo ok
