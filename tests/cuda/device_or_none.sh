#!/usr/bin/env bash
# A CUDA check binary in the CUDA build's ctest run, which runs where no GPU may be: it passes when
# the binary exits 0 (a GPU, every check passed), or when the machine has no device and the binary
# says exactly that in one line, "no CUDA device (...)", and exits 1. Any other output or exit
# status fails.
# usage: device_or_none.sh BINARY
set -uo pipefail
out=$("$1" 2>&1)
rc=$?
echo "$out"
[ "$rc" -eq 0 ] && exit 0
if [ "$rc" -eq 1 ] && [ "$(printf '%s\n' "$out" | wc -l)" -eq 1 ] && [[ "$out" == "no CUDA device ("*")" ]]; then
  echo "device_or_none: no GPU here, said in one line as expected"
  exit 0
fi
echo "device_or_none: $1 failed (exit $rc)" >&2
exit 1
