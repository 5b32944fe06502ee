"""A stand-in tokenizer.model for bench/llama_cpp_compare.sh: llama.cpp's converter needs a
tokenizer in the model folder, and a Hugging Face BPE one must be a tokenizer it knows (it hashes
the ids of a test string; bench_generate's random model has none). A SentencePiece model is taken
without that check, and the converter pads its vocabulary to the config's vocab_size with unused
entries, so the GGUF keeps the model's 151936-row embedding and lm_head. llama-bench feeds random
token ids, so the vocabulary's content does not enter the timings. Trained on a fixed synthetic
text: the same file every run."""
import io
import sys

import sentencepiece as spm


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: llama_cpp_vocab.py OUT/tokenizer.model")
    text = [" ".join(str(i * j) for j in range(1, 24)) for i in range(1, 400)]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(text), model_writer=model, vocab_size=64,
        hard_vocab_limit=False, minloglevel=2)
    with open(sys.argv[1], "wb") as f:
        f.write(model.getvalue())


if __name__ == "__main__":
    main()
