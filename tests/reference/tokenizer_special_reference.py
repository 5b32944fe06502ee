"""Hugging Face ids with and without the post-processor's special tokens, and of
apply_chat_template(tokenize=True), as the reference for Tokenizer::encode_with_special_tokens
(tests/unit/test_tokenizer_chat.cpp).

usage: tokenizer_special_reference.py TOKENIZER_DIR REQUEST.json RESPONSE.json

REQUEST: {"texts": [str], "chats": [[{"role", "content"}]]}
RESPONSE: {"with_special": [[id]], "without_special": [[id]],   (tokenizers, per text)
           "chat_ids": [[id]]}                                   (transformers, per chat)
"""
import json
import sys

from tokenizers import Tokenizer
from transformers import AutoTokenizer


def main() -> None:
    folder = sys.argv[1]
    with open(sys.argv[2], encoding="utf-8") as f:
        request = json.load(f)
    tok = Tokenizer.from_file(folder + "/tokenizer.json")
    hf = AutoTokenizer.from_pretrained(folder)
    chat_ids = []
    for messages in request["chats"]:
        ids = hf.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
        chat_ids.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    response = {
        "with_special": [tok.encode(t).ids for t in request["texts"]],
        "without_special": [tok.encode(t, add_special_tokens=False).ids for t in request["texts"]],
        "chat_ids": chat_ids,
    }
    with open(sys.argv[3], "w", encoding="utf-8") as f:
        json.dump(response, f)


if __name__ == "__main__":
    main()
