"""Hugging Face tokenizers' single-thread encode time, for bench/bench_tokenizer.cpp.

usage: tokenizer_bench.py TOKENIZER_JSON DOCS.jsonl REPEATS RESULT.json

Encodes every {"text": ...} document with Tokenizer.encode (no encode_batch, one thread): a first
pass (cold word cache), then REPEATS passes. RESULT: {"first_seconds", "best_seconds", "tokens",
"checksum"}, the
checksum being the same ids hash bench_tokenizer.cpp computes, so the ids are compared too.
"""
import json
import os
import sys
import time

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

from tokenizers import Tokenizer  # noqa: E402  (after the thread settings)


def ids_checksum(all_ids) -> int:
    h = 1469598103934665603
    for ids in all_ids:
        for i in ids:
            h = ((h ^ i) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
        h = ((h ^ 0xFFFFFFFF) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h


def main() -> None:
    tok = Tokenizer.from_file(sys.argv[1])
    with open(sys.argv[2], encoding="utf-8") as f:
        docs = [json.loads(line)["text"] for line in f]
    repeats = int(sys.argv[3])
    start = time.perf_counter()
    all_ids = [tok.encode(d, add_special_tokens=False).ids for d in docs]
    first = time.perf_counter() - start
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for d in docs:
            tok.encode(d, add_special_tokens=False)
        best = min(best, time.perf_counter() - start)
    with open(sys.argv[4], "w", encoding="utf-8") as f:
        json.dump({"first_seconds": first, "best_seconds": best, "tokens": sum(len(i) for i in all_ids),
                   "checksum": str(ids_checksum(all_ids))}, f)


if __name__ == "__main__":
    main()
