"""Reference data for the Llama and Qwen2 model tests, computed by Hugging Face Transformers' own
LlamaForCausalLM and Qwen2ForCausalLM (eager attention, float32).

For each case it writes
  OUT_DIR/<case>/model/                the model as save_pretrained writes it (config.json,
                                       generation_config.json, model.safetensors)
  OUT_DIR/<case>/reference.safetensors with
    param.<hf name>   the weights (named_parameters: a tied lm_head.weight is not listed)
    input_ids         I32 (B, S)
    labels            I32 (B, S): HF's labels, aligned with input_ids, -100 where ignored
    targets           I32 (B, S): what position s predicts (labels shifted left by one, -100
                      last), as titan's model takes them
    logits            F32 (B, S, V)
    loss              F32 (1): HF's mean cross-entropy over the scored positions
    grad.<hf name>    d loss / d parameter, for every parameter
    prompt_ids        I32 (P)
    generated_ids     I32 (8): generate()'s greedy new tokens (do_sample=False,
                      max_new_tokens=8, its default dynamic KV cache); none is eos
and the config overrides (JSON strings), batch and seq in the file's __metadata__.

Biases get random values (HF initialises them to zero, which a model without them would match)
and norm weights are perturbed likewise. The weights are drawn with initializer_range 0.2 so that
greedy decoding does not just repeat a token. No greedy step may be near a tie between its two best
logits (which a rounding difference could flip): the script checks the gap.

usage: python families_reference.py OUT_DIR
"""
import os
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from reference_common import hf_targets, make_batch, metadata, named, perturb_norms, save_reference

BATCH, SEQ = 2, 7
PROMPT_LEN, NEW_TOKENS = 5, 8
MIN_GREEDY_GAP = 1e-3
BIAS_STD = 0.05
# initializer_range 0.2, not HF's 0.02: at 0.02 the residual stream is mostly the token's own
# embedding and greedy decoding repeats one token, which would not show a KV-cache fault.
TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
            initializer_range=0.2, bos_token_id=1, eos_token_id=2)
# Llama 3.x's RoPE, with an original context short enough that it changes the angles of a
# 15-token sequence (wavelengths above 64 / low_freq_factor are scaled).
LLAMA3 = dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
              high_freq_factor=4.0, original_max_position_embeddings=64)

# case: (config class, model class, overrides on TINY)
CASES = {
    # Llama 3.2 1B / 3B's shape: tied embeddings, llama3 RoPE, no biases.
    "llama_tied": (LlamaConfig, LlamaForCausalLM,
                   dict(tie_word_embeddings=True, rms_norm_eps=1e-5, rope_parameters=LLAMA3)),
    # Every bias LlamaConfig can switch on: q/k/v/o (attention_bias) and gate/up/down (mlp_bias).
    "llama_untied_bias": (LlamaConfig, LlamaForCausalLM,
                          dict(tie_word_embeddings=False, attention_bias=True, mlp_bias=True,
                               rms_norm_eps=1e-5,
                               rope_parameters=dict(rope_type="default", rope_theta=10000.0))),
    # Qwen2.5-0.5B's shape (tied) and the larger ones' (untied): q/k/v biases, none on o_proj.
    "qwen2_tied": (Qwen2Config, Qwen2ForCausalLM,
                   dict(tie_word_embeddings=True, rms_norm_eps=1e-6,
                        rope_parameters=dict(rope_type="default", rope_theta=1000000.0))),
    "qwen2_untied": (Qwen2Config, Qwen2ForCausalLM,
                     dict(tie_word_embeddings=False, rms_norm_eps=1e-6,
                          rope_parameters=dict(rope_type="default", rope_theta=1000000.0))),
}


def randomize_biases(model):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.copy_(BIAS_STD * torch.randn_like(p))


def greedy(model, prompt, eos):
    """generate()'s greedy continuation of `prompt`, and the smallest gap between the best and
    second-best logit over its steps."""
    with torch.no_grad():
        out = model.generate(prompt[None, :], attention_mask=torch.ones_like(prompt[None, :]),
                             do_sample=False, max_new_tokens=NEW_TOKENS, pad_token_id=eos,
                             return_dict_in_generate=True, output_logits=True)
    new = out.sequences[0, len(prompt):]
    gap = min((top[0] - top[1]).item() for top in (s[0].topk(2).values for s in out.logits))
    return new, gap


def make(name, config_class, model_class, overrides, out_dir):
    torch.manual_seed(2468)
    config_args = {**TINY, **overrides}
    config = config_class(**config_args)
    config.architectures = [model_class.__name__]
    model = model_class._from_config(config, attn_implementation="eager", dtype=torch.float32)
    perturb_norms(model)
    randomize_biases(model)
    biases = [k for k, _ in model.named_parameters() if k.endswith(".bias")]
    params = named("param.", model.named_parameters())
    ids, labels = make_batch(config.vocab_size, BATCH, SEQ)
    prompt = torch.randint(0, config.vocab_size, (PROMPT_LEN,), dtype=torch.int64)

    out = model(input_ids=ids, labels=labels)
    out.loss.backward()
    grads = named("grad.", ((k, v.grad) for k, v in model.named_parameters()))
    model.zero_grad()

    generated, gap = greedy(model, prompt, config.eos_token_id)
    print(f"{name}: {len(params)} parameters ({len(biases)} biases), loss {out.loss.item():.6f}, "
          f"generated {generated.tolist()}, smallest greedy gap {gap:.3e}")
    assert len(generated) == NEW_TOKENS, f"{name}: generation stopped at eos"
    assert gap > MIN_GREEDY_GAP, f"{name}: a greedy step is near a tie ({gap})"

    folder = os.path.join(out_dir, name)
    model.save_pretrained(os.path.join(folder, "model"))
    assert os.path.isfile(os.path.join(folder, "model", "model.safetensors")), name
    tensors = {**params, **grads,
               "input_ids": ids.to(torch.int32), "labels": labels.to(torch.int32),
               "targets": hf_targets(labels).to(torch.int32),
               "logits": out.logits.detach(), "loss": out.loss.detach().reshape(1),
               "prompt_ids": prompt.to(torch.int32), "generated_ids": generated.to(torch.int32)}
    save_reference(tensors, os.path.join(folder, "reference.safetensors"),
                   metadata(config_args, config, BATCH, SEQ, architecture=model_class.__name__))


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out_dir = sys.argv[1]
    torch.set_num_threads(1)
    for name, (config_class, model_class, overrides) in CASES.items():
        make(name, config_class, model_class, overrides, out_dir)
    print(f"wrote {len(CASES)} cases to {out_dir}")


if __name__ == "__main__":
    main()
