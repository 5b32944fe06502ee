"""transformers' apply_chat_template as the reference for titan's Qwen3 chat template
(tests/unit/test_tokenizer_chat.cpp).

usage: tokenizer_chat_reference.py TOKENIZER_DIR REQUEST.json RESPONSE.json

REQUEST: [{"messages": [{"role", "content", optional "reasoning_content"}],
           "add_generation_prompt": bool, "enable_thinking": bool}]
RESPONSE: [rendered text] (tokenize=False), one per case.
"""
import json
import sys

from transformers import AutoTokenizer


def main() -> None:
    tok = AutoTokenizer.from_pretrained(sys.argv[1])
    with open(sys.argv[2], encoding="utf-8") as f:
        cases = json.load(f)
    rendered = [
        tok.apply_chat_template(
            case["messages"],
            tokenize=False,
            add_generation_prompt=case["add_generation_prompt"],
            enable_thinking=case["enable_thinking"],
        )
        for case in cases
    ]
    with open(sys.argv[3], "w", encoding="utf-8") as f:
        json.dump(rendered, f)


if __name__ == "__main__":
    main()
