"""LoRA fine-tuning as PEFT does it, for tests/e2e/train_lora.sh.

  family SOURCE MODEL qwen2|llama|qwen3_moe
        Writes a tiny random Qwen2 (q/k/v biases, non-zero), Llama (untied lm_head) or Qwen3-MoE
        (layer 0 dense: mlp_only_layers; layers 1 and 2 sparse, 4 experts, 2 per token) into
        MODEL, whose vocabulary is SOURCE's tokenizer's (the caller copies the tokenizer files).
  init MODEL ADAPTER RANK ALPHA TARGETS
        Writes a PEFT LoRA adapter folder for MODEL with PEFT's own init --
        LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=TARGETS (comma-separated),
        lora_dropout=0) -- and then B set to small seeded random values, so that the adapter
        changes the model's output and A's gradients are not zero at the first step.
  check MODEL DATA ADAPTER METRICS EXPORT STEPS MICRO_BATCH LR EPS [EVAL_LOSS [DROPOUT SEED]]
        Loads ADAPTER onto MODEL with PeftModel.from_pretrained(is_trainable=True) and trains it for
        STEPS steps on DATA (chat: labels -100 outside the assistant replies, the loss over the
        assistant tokens of the whole global batch, tests/reference/chat_sft_reference.py), in
        micro-batches of MICRO_BATCH, clipping to 1.0 and torch's AdamW over the adapter's
        parameters (betas 0.9/0.95, EPS, weight decay 0.1, constant LR). Compares every step's loss
        with titan's metrics JSONL (METRICS); loads titan's exported adapter folder EXPORT with
        PeftModel.from_pretrained and compares its A and B with PEFT's trained ones; EVAL_LOSS
        (`titan eval --adapter EXPORT` over DATA, "-" for none) with PEFT's loss of MODEL +
        EXPORT. DROPOUT > 0: PEFT's lora_dropout with titan's masks for training.seed SEED
        (lora_dropout_reference.py: the masks titan draws, from its documented formula).
  check-bf16 MODEL DATA ADAPTER EXPORT LR EPS [MAX_NORM [DROPOUT SEED]]
        titan's bf16 mixed-precision run of one AdamW step (no weight decay, no clipping: the
        gradients' norm must be under titan's clipping norm MAX_NORM, default 1.0; EXPORT:
        its adapter folder) against PEFT's gradients under torch.autocast("cpu", bfloat16), the
        way PyTorch users train in bf16. One step moves each value by LR * g / (|g| + EPS)
        (AdamW's first step, bias-corrected), so titan's gradient g is read back from the move.
        titan rounds a subset of what autocast rounds (the matmuls' operands, not every linear's
        output), so the two differ by about autocast's own rounding noise, measured as its
        distance from the fp32 gradients: at most twice that (tests/unit/test_mixed_precision.cpp
        argues the factor); and titan computed in bf16: its gradients are further from fp32's
        than a tenth of that noise. Distances: the largest over all of A and B, relative to
        autocast's largest gradient. DROPOUT > 0: both PEFT runs drop out with titan's masks of
        step 1 for training.seed SEED (as check does).
  merged MODEL EXPORT MERGED
        MERGED (titan's lora.merge_on_export folder) against
        PeftModel.from_pretrained(MODEL, EXPORT).merge_and_unload(): every weight.

Fails (exit 1) naming the first quantity out of tolerance.
"""
import json
import os
import sys

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import (AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM,
                          Qwen2Config, Qwen2ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from chat_sft_reference import batch, rows, scored  # noqa: E402
import lora_dropout_reference  # noqa: E402

LOSS_TOL = 1e-5  # absolute, on losses about ln(vocab)
# Absolute, on A and B after STEPS updates of LR 1e-3 with AdamW's eps 1e-4 (as
# chat_sft_reference.py argues: the update is then linear in small gradients).
WEIGHT_TOL = 1e-6
EVAL_TOL = 1e-5
MERGE_TOL = 1e-6


def base(model_dir):
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                attn_implementation="eager")


def family(source_dir, model_dir, name):
    """A tiny random Qwen2 (q/k/v biases) or Llama (untied) beside SOURCE's tokenizer and chat
    template (copied into MODEL by the caller)."""
    tok = AutoTokenizer.from_pretrained(source_dir)
    dims = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
                pad_token_id=tok.pad_token_id)
    torch.manual_seed(2)
    if name == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(tie_word_embeddings=True, **dims))
    elif name == "qwen3_moe":
        dims.update(num_hidden_layers=3)
        model = Qwen3MoeForCausalLM(Qwen3MoeConfig(
            tie_word_embeddings=False, head_dim=16, moe_intermediate_size=48, num_experts=4,
            num_experts_per_tok=2, norm_topk_prob=True, mlp_only_layers=[0], **dims))
    else:
        model = LlamaForCausalLM(LlamaConfig(tie_word_embeddings=False, head_dim=16, **dims))
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith(".bias"):
                p.copy_(0.1 * torch.randn_like(p))
    model.save_pretrained(model_dir, safe_serialization=True)


def init(model_dir, adapter_dir, rank, alpha, targets):
    torch.manual_seed(1)
    config = LoraConfig(r=int(rank), lora_alpha=float(alpha), target_modules=targets.split(","),
                        lora_dropout=0.0, task_type="CAUSAL_LM")
    model = get_peft_model(base(model_dir), config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.05 * torch.randn_like(p))
    model.save_pretrained(adapter_dir)


def loss_of(model, micro, where=None):
    """where: the dropout masks' key (lora_dropout_reference.Where), its first_row set to each
    micro-batch's first row in the global batch."""
    total = sum(scored(l) for _, _, l in micro)
    loss = 0.0
    first_row = 0
    for ids, mask, labels in micro:
        if where is not None:
            where.first_row = first_row
        first_row += ids.shape[0]
        loss = loss + model(input_ids=ids, attention_mask=mask, labels=labels,
                            num_items_in_batch=total).loss
    return loss


def lora_tensors(model):
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}


def check(model_dir, data, adapter, metrics, export, steps, micro_batch, lr, eps, eval_loss=None,
          dropout=0.0, seed=0):
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = PeftModel.from_pretrained(base(model_dir), adapter, is_trainable=True)
    where = lora_dropout_reference.install(model, dropout, seed) if dropout > 0 else None
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert trainable and all(
        "lora_" in n for n, p in model.named_parameters() if p.requires_grad)
    conversations = rows(tok, data)
    micro = [batch(tok, conversations[i:i + micro_batch])
             for i in range(0, len(conversations), micro_batch)]
    opt = torch.optim.AdamW(trainable, lr=lr, betas=(0.9, 0.95), eps=eps, weight_decay=0.1)
    titan = {r["step"]: r["loss"] for r in map(json.loads, open(metrics))
             if "loss" in r and "step" in r}
    failures = []
    for step in range(1, steps + 1):
        opt.zero_grad()
        if where is not None:
            where.step = step
        loss = loss_of(model, micro, where)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        opt.step()
        got = titan.get(step)
        loss = loss.detach()
        print(f"step {step}: titan {got}, PEFT {float(loss):.7f}")
        if got is None or abs(got - float(loss)) > LOSS_TOL:
            failures.append(f"step {step} loss: titan {got}, PEFT {float(loss):.7f}")
    want = lora_tensors(model)
    exported = PeftModel.from_pretrained(base(model_dir), export)
    got = lora_tensors(exported)
    assert sorted(got) == sorted(want), (sorted(got)[:4], sorted(want)[:4])
    worst = max((float((got[n] - want[n]).abs().max()), n) for n in want)
    moved = max(float((want[n] - w).abs().max())
                for n, w in lora_tensors(PeftModel.from_pretrained(base(model_dir),
                                                                   adapter)).items())
    print(f"adapter after {steps} steps: {len(want)} tensors, max |titan - PEFT| = "
          f"{worst[0]:.3g} ({worst[1]}); the steps moved them by up to {moved:.3g}")
    if worst[0] > WEIGHT_TOL:
        failures.append(f"adapter: {worst[1]} differs by {worst[0]:.3g} > {WEIGHT_TOL}")
    if moved < 100 * WEIGHT_TOL:
        failures.append(f"the steps moved the adapter by only {moved:.3g}: too little to compare")
    if eval_loss is not None:
        exported.eval()
        with torch.no_grad():
            loss = loss_of(exported, micro)
            plain = loss_of(base(model_dir).eval(), micro)
        print(f"titan eval --adapter {eval_loss}, PEFT {float(loss):.7f} (the model without "
              f"the adapter {float(plain):.7f})")
        if abs(eval_loss - float(loss)) > EVAL_TOL:
            failures.append(f"eval loss: titan {eval_loss}, PEFT {float(loss):.7f}")
        if abs(float(plain) - float(loss)) < 10 * EVAL_TOL:
            failures.append("the adapter does not change the loss enough to be checked")
    if failures:
        print("FAILED: " + "; ".join(failures))
        sys.exit(1)
    print("LoRA: titan equals PEFT")


def peft_gradients(model_dir, data, adapter, autocast, dropout=0.0, seed=0):
    """The adapter's gradients (A and B, sorted by name, flattened) of the first step's loss."""
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = PeftModel.from_pretrained(base(model_dir), adapter, is_trainable=True)
    where = lora_dropout_reference.install(model, dropout, seed) if dropout > 0 else None
    model.train()
    conversations = rows(tok, data)
    micro = [batch(tok, conversations)]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = loss_of(model, micro, where)
    loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if "lora_" in n}
    return torch.cat([grads[n].flatten() for n in sorted(grads)])


def check_bf16(model_dir, data, adapter, export, lr, eps, max_norm=1.0, dropout=0.0, seed=0):
    fp32 = peft_gradients(model_dir, data, adapter, False, dropout, seed)
    autocast = peft_gradients(model_dir, data, adapter, True, dropout, seed)
    assert float(fp32.norm()) < max_norm, "the step would be clipped"
    start = lora_tensors(PeftModel.from_pretrained(base(model_dir), adapter))
    end = lora_tensors(PeftModel.from_pretrained(base(model_dir), export))
    move = torch.cat([(start[n] - end[n]).flatten() for n in sorted(start)]).double() / lr
    titan = move * eps / (1 - move.abs())  # move = g / (|g| + eps), solved for g
    scale = float(autocast.abs().max())
    vs_autocast = float((titan - autocast).abs().max()) / scale
    noise = float((autocast - fp32).abs().max()) / scale
    vs_fp32 = float((titan - fp32).abs().max()) / scale
    print(f"bf16 LoRA: the adapter's gradients, titan vs PEFT under autocast {vs_autocast:.3g} "
          f"(tol {2 * noise:.3g}: twice autocast's from fp32's); titan vs PEFT in fp32 "
          f"{vs_fp32:.3g} (at least {0.1 * noise:.3g})")
    if vs_autocast > 2 * noise or vs_fp32 < 0.1 * noise:
        print("FAILED: titan's bf16 LoRA gradients are not autocast's to bf16's rounding")
        sys.exit(1)


def merged(model_dir, export, merged_dir):
    want = PeftModel.from_pretrained(base(model_dir), export).merge_and_unload().state_dict()
    got = base(merged_dir).state_dict()
    assert sorted(got) == sorted(want), (sorted(got)[:4], sorted(want)[:4])
    worst = max((float((got[n] - want[n]).abs().max()), n) for n in want)
    print(f"merged export: max |titan - PEFT merge_and_unload| = {worst[0]:.3g} ({worst[1]})")
    if worst[0] > MERGE_TOL:
        print(f"FAILED: {worst[1]} differs by {worst[0]:.3g} > {MERGE_TOL}")
        sys.exit(1)


if __name__ == "__main__":
    command, a = sys.argv[1], sys.argv[2:]
    if command == "init":
        init(*a)
    elif command == "family":
        family(*a)
    elif command == "merged":
        merged(*a)
    elif command == "check-bf16":
        check_bf16(a[0], a[1], a[2], a[3], float(a[4]), float(a[5]),
                   float(a[6]) if len(a) > 6 else 1.0, float(a[7]) if len(a) > 7 else 0.0,
                   int(a[8]) if len(a) > 8 else 0)
    else:
        check(a[0], a[1], a[2], a[3], a[4], int(a[5]), int(a[6]), float(a[7]), float(a[8]),
              float(a[9]) if len(a) > 9 and a[9] != "-" else None,
              float(a[10]) if len(a) > 10 else 0.0, int(a[11]) if len(a) > 11 else 0)
