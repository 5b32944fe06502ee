#!/usr/bin/env bash
# training.device: an unknown name, and CUDA in a build without it (for the build) or on a machine
# without the device (for the machine) are refused in one line before anything is read or allocated; "cpu" (the default) trains with
# the same losses as leaving it unset. (On a GPU the CUDA run against the CPU's is a step of
# scripts/cuda-device-check.sh.)
# usage: train_device.sh TITAN cpu|cuda   (cuda: the build has the CUDA backend, -DTITAN_CUDA=ON)
set -euo pipefail
titan=$(realpath "$1")
build=${2:?"usage: train_device.sh TITAN cpu|cuda"}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
. "$(dirname "$0")/tree_sum.sh"

expect_refusal unknown "^titan train: error: training\.device: unknown device 'tpu' \(cpu, cuda or cuda:N\)$" \
  "$titan" train --training.device=tpu --job.dump_folder="$work/tpu"
expect_refusal no_ordinal "^titan train: error: training\.device: unknown device 'cuda:' \(cpu, cuda or cuda:N\)$" \
  "$titan" train --training.device=cuda: --job.dump_folder="$work/cuda_"
# The build says which it is: without CUDA, any cuda device is refused for the build; with it, a
# device the machine lacks is refused for the machine (cuda:99 everywhere; cuda itself where no GPU
# is, which is this suite's machine: on a GPU the CUDA runs are scripts/cuda-device-check.sh's).
case "$build" in
  cpu)
    for device in cuda cuda:1; do
      expect_refusal "$device" "^titan train: error: training\.device = \"$device\": this titan was built without CUDA \(configure with -DTITAN_CUDA=ON where nvcc is installed\)$" \
        "$titan" train --training.device="$device" --job.dump_folder="$work/$device"
    done ;;
  cuda)
    devices=(cuda:99)
    nvidia-smi -L > /dev/null 2>&1 || devices+=(cuda)
    for device in "${devices[@]}"; do
      expect_refusal "$device" "^titan train: error: training\.device = \"$device\": no CUDA device( 99)? \(.*\)$" \
        "$titan" train --training.device="$device" --job.dump_folder="$work/$device"
    done ;;
  *) echo "train_device.sh: the build is cpu or cuda, not '$build'" >&2; exit 2 ;;
esac
for device in cuda cuda:1 cuda:99; do
  [ ! -d "$work/$device" ] || { echo "the refused $device run wrote its dump folder"; exit 1; }
done

run() {  # run NAME [FLAGS...]: three steps of the tiny Qwen3; each step's loss and grad norm kept
  local name=$1
  shift
  "$titan" train --model.flavor=tiny --training.steps=3 --lr_scheduler.warmup_steps=0 \
    --training.seq_len=32 --training.local_batch_size=2 --threads 1 \
    --checkpoint.last_save_in_hf=false --metrics.log_freq=1 --job.dump_folder="$work/$name" "$@" > "$work/$name.log"
  grep -oE '"(loss|grad_norm)":[^,}]+' "$work/$name/metrics.jsonl" > "$work/$name.values"
  [ "$(wc -l < "$work/$name.values")" = 6 ] ||
    { echo "$name: not 3 steps"; cat "$work/$name.log"; exit 1; }
}
run unset
run cpu --training.device=cpu
diff "$work/unset.values" "$work/cpu.values" ||
  { echo "training.device = cpu trained differently"; exit 1; }
echo "train_device: ok"
