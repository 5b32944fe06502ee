"""Writes tests/fixtures/llama3-style-tokenizer/: a small tokenizer.json laid out as Llama 3's
(the Llama 3 Split regex + ByteLevel, Llama 3's special tokens, and the post_processor
Sequence[ByteLevel, TemplateProcessing] whose single template puts <|begin_of_text|> before $A),
trained with Hugging Face tokenizers on a few English and multilingual lines, plus a
tokenizer_config.json with Llama 3.1 Instruct's bos/eos tokens and chat template
(tests/fixtures/chat_templates.json). Deterministic; rerun only to change the fixture.

usage: make_llama3_style_tokenizer.py OUT_DIR
"""
import json
import pathlib
import sys

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
    r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
            "<|eot_id|>"]
CORPUS = [
    "You are a helpful assistant. What is the capital of France? The capital of France is Paris.",
    "Hello there! How can I help you today? I'd like to show off how chat templating works.",
    "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n",
    "assistant user system tool The quick brown fox jumps over the lazy dog 1234567890.",
    "Ünïcödé tëxt, 多语言文本, emoji 🙂 and tabs\tand\nnew lines\n\n  indented.",
]


def main() -> None:
    out = pathlib.Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 4, trainer)
    tok.add_special_tokens(SPECIALS)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True),
        processors.TemplateProcessing(
            single="<|begin_of_text|> $A",
            pair="<|begin_of_text|> $A <|begin_of_text|>:1 $B:1",
            special_tokens=[("<|begin_of_text|>", bos)],
        ),
    ])
    tok.save(str(out / "tokenizer.json"))
    fixtures = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "chat_templates.json"
    llama31 = next(t for t in json.loads(fixtures.read_text(encoding="utf-8"))
                   if t["kind"] == "llama3_1")
    config = {
        "bos_token": "<|begin_of_text|>",
        "eos_token": "<|eot_id|>",
        "chat_template": llama31["chat_template"],
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n",
                                               encoding="utf-8")


if __name__ == "__main__":
    main()
