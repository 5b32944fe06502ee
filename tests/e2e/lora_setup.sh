# Sourced by train_lora.sh and train_lora_moe.sh: what their runs against PEFT share.
# lora_sft FILE: writes the four short conversations (chat JSONL) both train on.
lora_sft() {
  "$python" - "$1" <<'PY'
import json, sys
def line(*turns):
    return json.dumps({"messages": [{"role": r, "content": c} for r, c in turns]}) + "\n"
with open(sys.argv[1], "w") as f:
    f.write(line(("user", "What is a kludge?"), ("assistant", "A clever, inelegant fix that works.")))
    f.write(line(("system", "You answer briefly."), ("user", "Name a hacker virtue."),
                 ("assistant", "Laziness, impatience and hubris.")))
    f.write(line(("user", "Say hi."), ("assistant", "Hi!")))
    f.write(line(("user", "Explain grok in a sentence."),
                 ("assistant", "To grok is to understand something so thoroughly that it becomes "
                  "part of you.")))
PY
}

# lora_arguments MODEL DATA INIT RANK: sets `lora`, the titan train keys of 3 fp32 AdamW steps of a
# rank-RANK, alpha-16 adapter started from the PEFT adapter folder INIT on MODEL's chat DATA
# (seq_len 96, constant LR 1e-3, eps 1e-4: lora_reference.py check's), and `common`, those on
# one process (2 threads, micro-batches of 2, a global batch of 4).
lora_arguments() {
  lora=(--preset hf --model.hf_assets_path="$1" --checkpoint.initial_load_path="$1"
        --checkpoint.initial_load_in_hf=true --training.dataset=chat
        --training.dataset_path="$2" --training.seq_len=96
        --lr_scheduler.warmup_steps=0 --lr_scheduler.decay_type=none --metrics.log_freq=1
        --optimizer.lr=1e-3 --optimizer.eps=1e-4 --training.steps=3
        --lora.rank="$4" --lora.alpha=16 --lora.initial_adapter="$3")
  common=("${lora[@]}" --threads 2 --training.local_batch_size=2 --training.global_batch_size=4)
}
