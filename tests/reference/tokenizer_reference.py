"""Hugging Face tokenizers as the reference for titan's tokenizer tests (tests/unit/test_tokenizer.cpp).

usage: tokenizer_reference.py REQUEST.json RESPONSE.json

REQUEST: {"tokenizer": path of tokenizer.json,
          "encode": [{"hex": UTF-8 bytes in hex (may be invalid UTF-8), "parse_special": bool}],
          "decode": [{"ids": [int], "skip_special": bool}]}
RESPONSE: {"encode": [{"ids": [int], "roundtrip_hex": hex of decode(ids)}],
           "decode": [hex of the decoded text]}
Bytes are decoded with errors="replace" before encoding, as text read that way would be.
"""
import json
import sys

from tokenizers import Tokenizer


def main() -> None:
    with open(sys.argv[1], encoding="utf-8") as f:
        request = json.load(f)
    tok = Tokenizer.from_file(request["tokenizer"])
    encoded = []
    for case in request["encode"]:
        text = bytes.fromhex(case["hex"]).decode("utf-8", errors="replace")
        # encode_special_tokens=True: special tokens in the text are encoded as ordinary text.
        tok.encode_special_tokens = not case["parse_special"]
        ids = tok.encode(text, add_special_tokens=False).ids
        roundtrip = tok.decode(ids, skip_special_tokens=False)
        encoded.append({"ids": ids, "roundtrip_hex": roundtrip.encode("utf-8").hex()})
    tok.encode_special_tokens = False
    decoded = [
        tok.decode(case["ids"], skip_special_tokens=case["skip_special"]).encode("utf-8").hex()
        for case in request["decode"]
    ]
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        json.dump({"encode": encoded, "decode": decoded}, f)


if __name__ == "__main__":
    main()
