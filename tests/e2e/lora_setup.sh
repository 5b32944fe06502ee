# Sourced by train_lora.sh and train_lora_moe.sh: what their runs against PEFT share (both train
# on tests/fixtures/chat_data/lora-sft.jsonl).
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
