"""Hugging Face tokenizers and transformers as the reference for tokenizers titan.cpp trains
(tests/unit/test_bpe_trainer.cpp).

usage: data_tokenizer_reference.py REQUEST.json RESPONSE.json

REQUEST: {"dir": folder with tokenizer.json and tokenizer_config.json,
          "texts_hex": [UTF-8 bytes in hex (may be invalid UTF-8)]}
RESPONSE: {"ids": [[int]], "roundtrip_hex": [hex of decode(ids)],
           "vocab_size": len of the tokenizer, "eos_token": str, "pad_token": str,
           "auto_ids": [[int]] (transformers' AutoTokenizer on the same texts)}
Bytes are decoded with errors="replace" before encoding, as text read that way would be.
"""
import json
import os
import sys

from tokenizers import Tokenizer
from transformers import AutoTokenizer


def main() -> None:
    with open(sys.argv[1], encoding="utf-8") as f:
        request = json.load(f)
    folder = request["dir"]
    tok = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
    texts = [bytes.fromhex(h).decode("utf-8", errors="replace") for h in request["texts_hex"]]
    ids = [tok.encode(t, add_special_tokens=False).ids for t in texts]
    auto = AutoTokenizer.from_pretrained(folder)
    response = {
        "ids": ids,
        "roundtrip_hex": [tok.decode(i, skip_special_tokens=False).encode("utf-8").hex() for i in ids],
        "vocab_size": tok.get_vocab_size(with_added_tokens=True),
        "eos_token": auto.eos_token,
        "pad_token": auto.pad_token,
        "auto_ids": [auto(t, add_special_tokens=False)["input_ids"] for t in texts],
    }
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        json.dump(response, f)


if __name__ == "__main__":
    main()
