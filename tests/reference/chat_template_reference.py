"""transformers' apply_chat_template as the reference for titan's chat templates
(tests/unit/test_tokenizer_chat.cpp).

usage: chat_template_reference.py REQUEST.json RESPONSE.json

REQUEST: [{"dir": tokenizer folder, "messages": [{"role", "content", optional
           "reasoning_content"}], "add_generation_prompt": bool, "enable_thinking": bool,
           optional "date_string"}]
RESPONSE: [rendered text] (tokenize=False), one per case.
"""
import json
import sys

from transformers import AutoTokenizer


def main() -> None:
    with open(sys.argv[1], encoding="utf-8") as f:
        cases = json.load(f)
    tokenizers = {}
    rendered = []
    for case in cases:
        if case["dir"] not in tokenizers:
            tokenizers[case["dir"]] = AutoTokenizer.from_pretrained(case["dir"])
        extra = {"date_string": case["date_string"]} if "date_string" in case else {}
        rendered.append(tokenizers[case["dir"]].apply_chat_template(
            case["messages"],
            tokenize=False,
            add_generation_prompt=case["add_generation_prompt"],
            enable_thinking=case["enable_thinking"],
            **extra,
        ))
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        json.dump(rendered, f)


if __name__ == "__main__":
    main()
