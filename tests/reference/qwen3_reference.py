"""Reference tensors for the Qwen3 model tests, computed by Hugging Face Transformers' own
Qwen3ForCausalLM and Qwen3MoeForCausalLM (eager attention and experts, float32) and
torch.optim.AdamW.

For each tiny config it writes OUT_DIR/qwen3_<name>.safetensors holding the initial weights
("param.<hf name>"), input_ids and targets (I32; targets[s] is what position s predicts: HF's
labels shifted left by one, -100 last, as titan's model takes them), logits, loss, every parameter
gradient ("grad.<hf name>") and the weights after one AdamW step ("updated.<hf name>"); the config
and the optimizer settings go in the file's __metadata__ as strings.

OUT_DIR/qwen3_window.safetensors is one training step on torchtitan's rows: a window w of seq + 1
tokens per row, inputs w[:, :-1], labels w[:, 1:], the loss PyTorch's cross_entropy over every
position; it holds "window" (I32), the loss and every gradient.

The MoE configs (OUT_DIR/qwen3_moe_<name>.safetensors) run twice: as the config's default computes
it (output_router_logits false: no auxiliary loss) and with output_router_logits=True, whose loss
adds router_aux_loss_coef * the load-balancing loss; the second run's loss, aux loss and gradients
are stored as "loss_aux", "aux_loss" and "grad_aux.<hf name>". No token may be near a tie between
its k-th and (k+1)-th expert (which a rounding difference could flip): the script checks the gap.

usage: python qwen3_reference.py OUT_DIR
"""
import json
import sys

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

from reference_common import (hf_targets, make_batch, metadata, named, perturb_norms, routing_gap,
                              save_reference, titan_layout)

# name: (config overrides, batch, seq). Together they cover tied and untied embeddings, GQA ratios
# 1, 2 and 4, head_dim != hidden / heads, odd sequence lengths, batch > 1, and sequences longer
# than one 64-row attention block.
CONFIGS = {
    "tied_gqa2": (dict(hidden_size=32, intermediate_size=56, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                       tie_word_embeddings=True, vocab_size=97), 2, 7),
    "untied_mha": (dict(hidden_size=24, intermediate_size=40, num_hidden_layers=2,
                        num_attention_heads=2, num_key_value_heads=2, head_dim=12,
                        tie_word_embeddings=False, vocab_size=101), 3, 5),
    "gqa4_long": (dict(hidden_size=48, intermediate_size=72, num_hidden_layers=2,
                       num_attention_heads=8, num_key_value_heads=2, head_dim=8,
                       tie_word_embeddings=False, vocab_size=89), 2, 133),
    "tied_gqa4_odd": (dict(hidden_size=40, intermediate_size=64, num_hidden_layers=3,
                           num_attention_heads=4, num_key_value_heads=1, head_dim=20,
                           tie_word_embeddings=True, vocab_size=131), 1, 13),
}
# name: (config overrides, batch, seq). Sparse layers: all (moe_all_sparse); 1 and 3 of 4 through
# mlp_only_layers (moe_mixed); 1 of 3 through decoder_sparse_step (moe_step2). E not a power of
# two, k = 2 and 3, norm_topk_prob both ways, odd sequence lengths, batch > 1.
MOE_CONFIGS = {
    "all_sparse": (dict(hidden_size=32, intermediate_size=48, moe_intermediate_size=24,
                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=16, num_experts=5, num_experts_per_tok=2, norm_topk_prob=True,
                        decoder_sparse_step=1, mlp_only_layers=[], tie_word_embeddings=False,
                        vocab_size=97, router_aux_loss_coef=0.01), 2, 7),
    "mixed": (dict(hidden_size=24, intermediate_size=40, moe_intermediate_size=20,
                   num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1, head_dim=12,
                   num_experts=6, num_experts_per_tok=3, norm_topk_prob=False,
                   decoder_sparse_step=1, mlp_only_layers=[0, 2], tie_word_embeddings=True,
                   vocab_size=101, router_aux_loss_coef=0.02), 3, 5),
    "step2": (dict(hidden_size=40, intermediate_size=56, moe_intermediate_size=16,
                   num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                   num_experts=7, num_experts_per_tok=2, norm_topk_prob=True,
                   decoder_sparse_step=2, mlp_only_layers=[], tie_word_embeddings=False,
                   vocab_size=89, router_aux_loss_coef=0.001), 2, 9),
}
# The router's HF init (std 0.02) leaves all experts within ~1e-3 of each other; scaled up, the
# routing decisions have clear margins.
ROUTER_SCALE = 25.0
MIN_ROUTING_GAP = 1e-4
ADAMW = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


def make(name, overrides, batch, seq, out_dir):
    torch.manual_seed(1234)
    config = Qwen3Config(rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=512,
                         attention_dropout=0.0, **overrides)
    model = Qwen3ForCausalLM._from_config(config, attn_implementation="eager",
                                          dtype=torch.float32)
    perturb_norms(model)
    params = named("param.", model.named_parameters())
    ids, labels = make_batch(config.vocab_size, batch, seq)

    out = model(input_ids=ids, labels=labels)
    out.loss.backward()
    grads = named("grad.", ((k, v.grad) for k, v in model.named_parameters()))
    torch.optim.AdamW(model.parameters(), foreach=False, **ADAMW).step()
    updated = named("updated.", model.named_parameters())

    tensors = {**params, **grads, **updated,
               "input_ids": ids.to(torch.int32), "targets": hf_targets(labels).to(torch.int32),
               "logits": out.logits.detach(), "loss": out.loss.detach().reshape(1)}
    meta = metadata(overrides, config, batch, seq, rope_theta="10000.0",
                    max_position_embeddings="512", adamw=json.dumps(ADAMW))
    save_reference(tensors, f"{out_dir}/qwen3_{name}.safetensors", meta)


def make_moe(name, overrides, batch, seq, out_dir):
    torch.manual_seed(4321)
    config = Qwen3MoeConfig(rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=512,
                            attention_dropout=0.0, **overrides)
    assert not config.output_router_logits  # the class default the first run relies on
    model = Qwen3MoeForCausalLM._from_config(config, attn_implementation="eager",
                                             experts_implementation="eager", dtype=torch.float32)
    perturb_norms(model)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith("mlp.gate.weight"):
                p.mul_(ROUTER_SCALE)
    params = named("param.", titan_layout(model.named_parameters()).items())
    sparse = sum(k.endswith("mlp.gate.weight") for k in params)
    assert 0 < sparse, name
    ids, labels = make_batch(config.vocab_size, batch, seq)

    out = model(input_ids=ids, labels=labels)
    assert out.aux_loss is None
    out.loss.backward()
    grads = {k: v.grad.detach().clone() for k, v in model.named_parameters()}
    model.zero_grad()
    out_aux = model(input_ids=ids, labels=labels, output_router_logits=True)
    assert len(out_aux.router_logits) == sparse
    gap = routing_gap(out_aux.router_logits, config.num_experts_per_tok)
    print(f"moe_{name}: {sparse} sparse layers, smallest routing gap {gap:.3e}, "
          f"aux loss {out_aux.aux_loss.item():.6f}")
    assert gap > MIN_ROUTING_GAP, f"moe_{name}: a token is near a routing tie ({gap})"
    assert torch.equal(out_aux.logits, out.logits)
    out_aux.loss.backward()
    grads_aux = titan_layout((k, v.grad) for k, v in model.named_parameters())
    model.zero_grad()
    for k, v in model.named_parameters():
        v.grad = grads[k].clone()
    torch.optim.AdamW(model.parameters(), foreach=False, **ADAMW).step()
    updated = named("updated.", titan_layout(model.named_parameters()).items())
    grads = named("grad.", titan_layout(grads.items()).items())
    grads_aux = named("grad_aux.", grads_aux.items())

    tensors = {**params, **grads, **grads_aux, **updated,
               "input_ids": ids.to(torch.int32), "targets": hf_targets(labels).to(torch.int32),
               "logits": out.logits.detach(), "loss": out.loss.detach().reshape(1),
               "loss_aux": out_aux.loss.detach().reshape(1),
               "aux_loss": out_aux.aux_loss.detach().reshape(1)}
    meta = metadata(overrides, config, batch, seq, rope_theta="10000.0",
                    max_position_embeddings="512", adamw=json.dumps(ADAMW))
    save_reference(tensors, f"{out_dir}/qwen3_moe_{name}.safetensors", meta)


def make_window(overrides, batch, seq, out_dir):
    """One step on torchtitan's rows of seq inputs and seq targets (windows of seq + 1)."""
    torch.manual_seed(777)
    config = Qwen3Config(rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=512,
                         attention_dropout=0.0, **overrides)
    model = Qwen3ForCausalLM._from_config(config, attn_implementation="eager",
                                          dtype=torch.float32)
    params = named("param.", model.named_parameters())
    window = torch.randint(0, config.vocab_size, (batch, seq + 1), dtype=torch.int64)
    logits = model(input_ids=window[:, :-1]).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, config.vocab_size),
                                             window[:, 1:].reshape(-1))
    loss.backward()
    grads = named("grad.", ((k, v.grad) for k, v in model.named_parameters()))
    tensors = {**params, **grads, "window": window.to(torch.int32),
               "loss": loss.detach().reshape(1)}
    meta = metadata(overrides, config, batch, seq, rope_theta="10000.0",
                    max_position_embeddings="512")
    save_reference(tensors, f"{out_dir}/qwen3_window.safetensors", meta)


def main():
    out_dir = sys.argv[1]
    torch.set_num_threads(1)
    for name, (overrides, batch, seq) in CONFIGS.items():
        make(name, overrides, batch, seq, out_dir)
    for name, (overrides, batch, seq) in MOE_CONFIGS.items():
        make_moe(name, overrides, batch, seq, out_dir)
    overrides, batch, _ = CONFIGS["tied_gqa2"]
    make_window(overrides, batch, 9, out_dir)
    print(f"wrote {len(CONFIGS) + len(MOE_CONFIGS) + 1} reference files to {out_dir}")


if __name__ == "__main__":
    main()
