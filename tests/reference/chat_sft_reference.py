"""Supervised fine-tuning on chat data as Transformers does it, for tests/e2e/train_chat.sh.

  make DIR TEMPLATES        DIR holds a tokenizer (tokenizer.json, tokenizer_config.json) with the
                            ChatML tokens: adds the official Qwen3 chat template (TEMPLATES is
                            tests/fixtures/chat_templates.json) and a tiny random Qwen3 model whose
                            vocabulary is the tokenizer's (fp32, seeded, RMSNorm weights perturbed).
  check DIR DATA METRICS EXPORT STEPS MICRO_BATCH LR EPS [EVAL_LOSS]
                            Trains DIR's model on DATA (JSON Lines of {"messages": [...]}) for STEPS
                            steps whose global batch is every conversation of DATA, in micro-batches
                            of MICRO_BATCH, as Transformers' Trainer does it since 4.46: each
                            micro-batch's loss is model(input_ids, attention_mask, labels,
                            num_items_in_batch = the assistant tokens of the whole global batch),
                            summed into the gradients; then clipping to 1.0 and torch's AdamW
                            (betas 0.9/0.95, EPS, weight decay 0.1, constant LR). Labels are
                            -100 outside the assistant replies, found here independently of titan:
                            the text Transformers renders with the folder's Jinja template, the
                            character spans from after each "<|im_start|>assistant\\n" through its
                            "<|im_end|>", and a token is labelled when its first character lies in
                            one. Compares every step's loss with titan's metrics JSONL (METRICS) and
                            the trained weights with titan's export (EXPORT); EVAL_LOSS (titan eval
                            --chat on the export) with the trained model's loss over DATA.

Fails (exit 1) naming the first quantity out of tolerance; also fails when the loss without the
mask or averaged per micro-batch would be as close, so the comparison can tell them apart.
"""
import json
import re
import sys

import torch
from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

LOSS_TOL = 1e-5  # absolute, on losses about ln(vocab)
# Absolute, on weights after STEPS updates of LR 1e-3 each. Adam's first steps move a weight by
# about LR g / (|g| + eps): with eps 1e-8 a gradient near 1e-8 (a cancellation, as exact as fp32
# sums allow) moves by a share of LR that rounding decides. An EPS of 1e-4 makes the update
# linear in such gradients, so the weights check the gradients to fp32 rounding.
WEIGHT_TOL = 1e-6


def make(model_dir, templates_path):
    templates = json.load(open(templates_path))
    qwen3 = next(t for t in templates if t["kind"] == "qwen3")
    config_path = f"{model_dir}/tokenizer_config.json"
    config = json.load(open(config_path))
    config["chat_template"] = qwen3["chat_template"]
    json.dump(config, open(config_path, "w"), indent=2, ensure_ascii=False)
    tok = AutoTokenizer.from_pretrained(model_dir)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
        tie_word_embeddings=True, eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tok.pad_token_id))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(model_dir, safe_serialization=True)


def rows(tok, data_path):
    """Each conversation's ids and labels (HF's: unshifted, -100 outside the replies)."""
    out = []
    for line in open(data_path):
        if not line.strip():
            continue
        messages = json.loads(line)["messages"]
        text = tok.apply_chat_template(messages, tokenize=False)
        spans = []
        for m in re.finditer(re.escape("<|im_start|>assistant\n"), text):
            end = text.index("<|im_end|>", m.end()) + len("<|im_end|>")
            spans.append((m.end(), end))
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        ids = enc["input_ids"]
        labels = [i if any(a <= s < b for a, b in spans) else -100
                  for i, (s, _) in zip(ids, enc["offset_mapping"])]
        assert any(l != -100 for l in labels), f"no assistant tokens in {text!r}"
        out.append((ids, labels))
    return out


def batch(tok, part):
    n = max(len(ids) for ids, _ in part)
    pad = tok.pad_token_id
    ids = torch.tensor([i + [pad] * (n - len(i)) for i, _ in part])
    labels = torch.tensor([l + [-100] * (n - len(l)) for _, l in part])
    mask = torch.tensor([[1] * len(i) + [0] * (n - len(i)) for i, _ in part])
    return ids, mask, labels


def scored(labels):
    return int((labels[:, 1:] != -100).sum())


def losses(model, micro):
    """The global batch's loss three ways: Transformers' Trainer's (over the assistant tokens of
    the whole batch), the mean of the micro-batches' means, and the unmasked one."""
    total = sum(scored(l) for _, _, l in micro)
    loss = 0.0
    per_micro = []
    unmasked = []
    for ids, mask, labels in micro:
        out = model(input_ids=ids, attention_mask=mask, labels=labels, num_items_in_batch=total)
        loss = loss + out.loss
        with torch.no_grad():
            per_micro.append(float(model(input_ids=ids, attention_mask=mask, labels=labels).loss))
            everything = torch.where(mask.bool(), ids, torch.full_like(ids, -100))
            unmasked.append(float(model(input_ids=ids, attention_mask=mask,
                                        labels=everything).loss))
    return loss, sum(per_micro) / len(per_micro), sum(unmasked) / len(unmasked)


def check(model_dir, data, metrics, export, steps, micro_batch, lr, eps, eval_loss=None):
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = Qwen3ForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                             attn_implementation="eager")
    model.train()
    conversations = rows(tok, data)
    micro = [batch(tok, conversations[i:i + micro_batch])
             for i in range(0, len(conversations), micro_batch)]
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), eps=eps,
                            weight_decay=0.1)
    print(f"assistant tokens in the global batch: {sum(scored(l) for _, _, l in micro)}")
    titan = [json.loads(l) for l in open(metrics)]
    titan = {r["step"]: r["loss"] for r in titan if "loss" in r and "step" in r}
    failures = []
    for step in range(1, steps + 1):
        opt.zero_grad()
        loss, per_micro, unmasked = losses(model, micro)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss = loss.detach()
        got = titan.get(step)
        print(f"step {step}: titan {got}, Transformers {float(loss):.7f} (per micro-batch mean "
              f"{per_micro:.7f}, unmasked {unmasked:.7f})")
        if got is None or abs(got - float(loss)) > LOSS_TOL:
            failures.append(f"step {step} loss: titan {got}, Transformers {float(loss):.7f}")
        for other, what in ((per_micro, "the per-micro-batch mean"), (unmasked, "the unmasked loss")):
            if abs(other - float(loss)) < 10 * LOSS_TOL:
                failures.append(f"step {step}: {what} {other} is too close to tell apart")
    trained = Qwen3ForCausalLM.from_pretrained(export, dtype=torch.float32)
    worst = (0.0, "")
    want = dict(model.named_parameters())
    for name, p in trained.named_parameters():
        d = float((p.detach() - want[name].detach()).abs().max())
        if d > worst[0]:
            worst = (d, name)
    print(f"weights after {steps} steps: max |titan - Transformers| = {worst[0]:.3g} ({worst[1]})")
    if worst[0] > WEIGHT_TOL:
        failures.append(f"weights: {worst[1]} differs by {worst[0]:.3g} > {WEIGHT_TOL}")
    if eval_loss is not None:
        model.eval()
        with torch.no_grad():
            loss, _, _ = losses(model, micro)
        print(f"titan eval --chat on the export {eval_loss}, Transformers {float(loss):.7f}")
        if abs(eval_loss - float(loss)) > LOSS_TOL:
            failures.append(f"eval loss: titan {eval_loss}, Transformers {float(loss):.7f}")
    if failures:
        print("FAILED: " + "; ".join(failures))
        sys.exit(1)
    print("chat SFT: titan equals Transformers")


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(*sys.argv[2:4])
    else:
        a = sys.argv[2:]
        check(a[0], a[1], a[2], a[3], int(a[4]), int(a[5]), float(a[6]), float(a[7]),
              float(a[8]) if len(a) > 8 else None)
