#!/usr/bin/env bash
# titan generate and titan eval take --device as training.device does: an unknown name, a build
# without CUDA or a machine without the device is one line naming the flag, before the model folder
# is read (none exists here). (On a machine with a GPU and a CUDA build, scripts/cuda-device-check.sh
# runs them instead.)
# usage: infer_device.sh TITAN
set -euo pipefail
titan=$(realpath "$1")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
. "$(dirname "$0")/tree_sum.sh"

for command in generate eval; do
  args=(--model "$work/none")
  [ "$command" = generate ] && args+=(--prompt hi) || args+=(--data "$work/none.jsonl")
  expect_refusal "${command}_gpu" "^titan $command: error: --device gpu: unknown device 'gpu' \(cpu, cuda or cuda:N\)$" \
    "$titan" "$command" "${args[@]}" --device gpu
  for device in cuda cuda:1; do
    expect_refusal "${command}_$device" "^titan $command: error: --device $device: (this titan was built without CUDA \(configure with -DTITAN_CUDA=ON where nvcc is installed\)|no CUDA device.*)$" \
      "$titan" "$command" "${args[@]}" --device "$device"
  done
done
echo "infer_device: ok"
