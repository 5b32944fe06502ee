# Sourced by the e2e scripts: tree_sum DIR prints every path under DIR with the sha256 of each file,
# so that two calls compare a folder's names and bytes before and after a command.
tree_sum() {
  (cd "$1" && find . -print | LC_ALL=C sort && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 -r sha256sum)
}

# expect_refusal NAME PATTERN COMMAND...: the command fails with exactly one line on stderr, the
# titan error line, matching PATTERN (grep -E).
expect_refusal() {
  local name="$1" pattern="$2"
  shift 2
  if "$@" > "$work/$name.out" 2> "$work/$name.err"; then
    echo "$name: the command succeeded"; cat "$work/$name.out"; exit 1
  fi
  [ "$(wc -l < "$work/$name.err")" = 1 ] || { echo "$name: expected one error line:"; cat "$work/$name.err"; exit 1; }
  grep -qE "$pattern" "$work/$name.err" || { echo "$name: unexpected error:"; cat "$work/$name.err"; exit 1; }
}
