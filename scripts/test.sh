#!/usr/bin/env bash
# The whole test suite on a fresh machine: installs what is missing, builds with warnings as
# errors, generates the PyTorch / Transformers references, runs every test.
#   scripts/test.sh              Release build (build/)
#   scripts/test.sh --sanitize   AddressSanitizer + UBSan build (build-sanitize/)
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=build
[ "${1:-}" = "--sanitize" ] && build_dir=build-sanitize
scripts/setup.sh --tests --werror "$@"


ctest --test-dir "$build_dir" --output-on-failure -j2 --timeout 600
