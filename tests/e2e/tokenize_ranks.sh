#!/usr/bin/env bash
# `titan tokenize --bin` under mpirun: each rank tokenizes a share of every batch of documents,
# rank 0 gathers the tokens and writes the file (data/dataset_tokenize.h). On 2 and 3 ranks the
# token file is byte for byte the one-process file, for data crossing the 8192-document batches:
# a JSON Lines file with empty texts, "ids" records and bad lines (skipped with --skip-bad-lines),
# a gzipped plain-text file and the default corpus. Without --skip-bad-lines every rank stops at the
# first bad line, rank 0 naming its document and the rank that read it, and no file is left;
# without --bin the command is refused under mpirun.
# usage: tokenize_ranks.sh TITAN PYTHON
set -euo pipefail
titan="$1"
python="$2"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
. "$(dirname "$0")/mpi_env.sh"
corpus=/usr/share/doc/jargon-text/jargon.txt.gz
"$titan" tokenizer train --vocab-size 2048 --out "$work/tok" "$corpus" > /dev/null 2>&1
"$python" - "$work" <<'PY'
import gzip, json, sys
work = sys.argv[1]
with open(f"{work}/a.jsonl", "w") as out:
    for i in range(20000):
        if i % 4999 == 17:
            out.write("{not json\n")
        elif i % 1000 == 3:
            out.write(json.dumps({"text": ""}) + "\n")
        elif i % 777 == 5:
            out.write(json.dumps({"ids": [i % 2000, 7, 11]}) + "\n")
        else:
            out.write(json.dumps({"text": f"record {i}: " + " ".join(f"w{(i * 7 + w) % 331}" for w in range(i % 13))}) + "\n")
with gzip.open(f"{work}/b.txt.gz", "wt") as out:
    out.write("\n\n".join(f"paragraph {i} of plain text" for i in range(9000)) + "\n")
PY
inputs=("$work/a.jsonl" "$work/b.txt.gz" "$corpus")
"$titan" tokenize --tokenizer "$work/tok" --skip-bad-lines --bin "$work/one.bin" "${inputs[@]}" 2> "$work/one.log"
for n in 2 3; do
  mpirun -np "$n" "$titan" tokenize --tokenizer "$work/tok" --skip-bad-lines --bin "$work/ranks$n.bin" \
    "${inputs[@]}" > "$work/ranks$n.log" 2>&1 || { cat "$work/ranks$n.log"; exit 1; }
  cmp "$work/one.bin" "$work/ranks$n.bin" || { echo "$n ranks: the token file differs"; exit 1; }
  grep -q "skipped 4 bad record(s)" "$work/ranks$n.log" || { echo "$n ranks: no skip count"; cat "$work/ranks$n.log"; exit 1; }
  echo "$n ranks: the token file byte for byte one process's ($(stat -c %s "$work/one.bin") bytes)"
done
grep -q "skipped 4 bad record(s)" "$work/one.log" || { echo "one process: no skip count"; cat "$work/one.log"; exit 1; }

# Without --skip-bad-lines: the first bad line (line 18, document 17: rank 1's of 2) stops all.
if mpirun -np 2 "$titan" tokenize --tokenizer "$work/tok" --bin "$work/bad.bin" "${inputs[@]}" > "$work/bad.log" 2>&1; then
  echo "a bad line did not stop the ranks"; cat "$work/bad.log"; exit 1
fi
# Rank 0 names the document and the rank that read it (whose own line, naming the line, may be
# cut short when mpirun ends the job at the first rank's exit).
grep -q "a.jsonl: document 17 (from 0, in file order) is a bad record, read by rank 1" "$work/bad.log" ||
  { echo "rank 0 does not name the document"; cat "$work/bad.log"; exit 1; }
if compgen -G "$work/bad.bin*" > /dev/null; then echo "a file was left: $(ls "$work"/bad.bin*)"; exit 1; fi

# Other forms of titan tokenize run in one process.
if mpirun -np 2 "$titan" tokenize --tokenizer "$work/tok" --text hello > "$work/text.log" 2>&1; then
  echo "--text ran under mpirun"; cat "$work/text.log"; exit 1
fi
grep -q "under mpirun titan tokenize runs only with --bin" "$work/text.log" || { cat "$work/text.log"; exit 1; }
echo "titan tokenize --bin on several ranks: every check passed"
