#!/usr/bin/env bash
# Proves the README's quick start on a bare Debian 12: `scripts/setup.sh && build/titan train`
# (a short train) in a fresh debootstrap root, so a package missing from setup.sh fails here and
# not on a user's new machine.
#   scripts/check-clean-install.sh [--variant minbase|default] [--steps N] [--refresh]
# Runs as root (chroot, mounts). What it does:
#   - the bare root (debootstrap bookworm, minbase by default: the smallest Debian, so setup.sh
#     must name every package) is built once from this machine's Debian mirror and cached as
#     $TITAN_CLEAN_ROOT_CACHE/clean-root-bookworm-VARIANT.tar.zst (default /var/cache/titan);
#     --refresh rebuilds it. Every run unpacks a fresh copy under $TMPDIR (default /var/tmp).
#   - into it: the checkout's HEAD as a fresh clone has it (`git archive`; uncommitted changes
#     are not included) at /work/titan.cpp, and nothing beside it (the tests' assets are in the
#     repository, tests/fixtures); the host's resolv.conf,
#     its Debian apt sources and the Acquire:: proxy / validity settings apt needs to reach them,
#     and http(s)_proxy from the environment. No pip configuration: the quick start installs no
#     Python package.
#   - runs scripts/setup.sh, then build/titan train --training.steps=N (20), each in a clean
#     environment (env -i, HOME=/root), and checks the summary's loss fell and outputs/hf exists.
#   - always unmounts and removes the temporary root (trap), also on failure or Ctrl-C. The host's
#     packages are not touched, except installing debootstrap and zstd when missing.
# Time on the 2-core development VM, including cleanup: cached 2.8 min on the quiet machine (in
# CI's run: setup.sh 159 s -- the package install and the build of the titan binary -- training
# 7 s), 5 min with other builds sharing the cores; cold adds the 90-100 s of debootstrap and
# caching the root. (Before setup.sh built only the binary: cold 15.5-18.5 min, cached 9.5-15.5
# min, with other builds sharing the cores.)
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

suite=bookworm
variant=minbase
steps=20
refresh=0
while [ $# -gt 0 ]; do
  case "$1" in
    --variant) variant=${2:-}; shift ;;
    --steps) steps=${2:-}; shift ;;
    --refresh) refresh=1 ;;
    *) echo "check-clean-install: unknown argument '$1' (expected --variant minbase|default, --steps N, --refresh)" >&2; exit 2 ;;
  esac
  shift
done
case "$variant" in minbase | default) ;; *) echo "check-clean-install: --variant must be minbase or default, not '$variant'" >&2; exit 2 ;; esac
[[ "$steps" =~ ^[1-9][0-9]*$ ]] || { echo "check-clean-install: --steps must be a positive integer, not '$steps'" >&2; exit 2; }
[ "$(id -u)" -eq 0 ] || { echo "check-clean-install: must run as root (it uses debootstrap, chroot and mount); try: sudo $0" >&2; exit 2; }

cache_dir=${TITAN_CLEAN_ROOT_CACHE:-/var/cache/titan}
cache=$cache_dir/clean-root-$suite-$variant.tar.zst
cache_partial=$cache.partial.$$  # written whole, then renamed: a concurrent run never reads half
step="start"
work=""
started=$SECONDS

# The first URI of an enabled apt source (one-line .list or deb822 .sources) serving suite $1.
apt_uri_for_suite() {
  local files=()
  [ -f /etc/apt/sources.list ] && files+=(/etc/apt/sources.list)
  for f in /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] && files+=("$f")
  done
  [ ${#files[@]} -gt 0 ] || return 0
  awk -v suite="$1" '
    FNR == 1 { flush(); deb822 = FILENAME ~ /\.sources$/ }
    function flush() { if (types ~ /(^| )deb( |$)/ && enabled != "no" && (" " suites " ") ~ (" " suite " ") && uris != "") { split(uris, u, " "); print u[1]; found = 1; exit } types = uris = suites = enabled = "" }
    !deb822 && $1 == "deb" { sub(/\[[^]]*\]/, ""); $0 = $0; if ($3 == suite) { print $2; found = 1; exit } next }
    deb822 && /^[[:space:]]*$/ { flush(); next }
    deb822 && /^[[:space:]]*#/ { next }
    deb822 { key = tolower($1); sub(/:$/, "", key); $1 = ""; sub(/^ +/, "");
             if (key == "types") types = $0; else if (key == "uris") uris = $0;
             else if (key == "suites") suites = $0; else if (key == "enabled") enabled = tolower($0) }
    END { if (!found) flush() }' "${files[@]}"
}

# Kills what still runs inside the temporary roots, again until none is left (a dying make may
# still spawn one), and reaps the killed chroot (call with stderr closed: bash reports it).
kill_processes_in_work() {
  local pid root inside attempt
  for attempt in $(seq 50); do
    inside=()
    for pid in /proc/[0-9]*; do
      root=$(readlink "$pid/root" 2> /dev/null) || continue
      [[ "$root" == "$work"/* ]] && inside+=("${pid#/proc/}")
    done
    [ ${#inside[@]} -gt 0 ] || break
    kill -9 "${inside[@]}" || true
    sleep 0.1
  done
  wait || true
}

# Unmounts everything under $work (deepest first) and removes $work only when nothing is mounted
# there any more.
cleanup() {
  [ -n "$work" ] && [ -d "$work" ] || return 0
  kill_processes_in_work 2> /dev/null
  local m
  for m in $(awk -v w="$work/" 'index($2, w) == 1 { print $2 }' /proc/self/mounts | sort -r); do
    umount "$m" 2> /dev/null || umount -l "$m" || true
  done
  if awk -v w="$work/" 'index($2, w) == 1 { found = 1 } END { exit !found }' /proc/self/mounts; then
    echo "check-clean-install: left $work in place: something is still mounted under it" >&2
  else
    rm -rf --one-file-system "$work" || echo "check-clean-install: could not remove all of $work" >&2
  fi
}

on_exit() {
  local rc=$?
  trap '' INT TERM
  cleanup
  rm -f "$cache_partial"
  case "$rc" in
    0) ;;
    130 | 143) echo "check-clean-install: interrupted during step '$step'" >&2 ;;
    *) echo "check-clean-install: FAILED at step '$step' (exit $rc, after $((SECONDS - started)) s)" >&2 ;;
  esac
  exit "$rc"
}
trap on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

step="host tools"
if ! command -v debootstrap > /dev/null || ! command -v zstd > /dev/null; then
  echo "check-clean-install: installing debootstrap and zstd on this machine (the only host packages it installs)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap zstd
fi
mirror=$(apt_uri_for_suite "$suite")
security=$(apt_uri_for_suite "$suite-security")
[ -n "$mirror" ] || { echo "check-clean-install: no enabled apt source for '$suite' in /etc/apt/sources.list(.d)" >&2; exit 1; }
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
[ -f "$keyring" ] || { echo "check-clean-install: $keyring is missing (apt-get install debian-archive-keyring)" >&2; exit 1; }

work=$(mktemp -d "${TMPDIR:-/var/tmp}/titan-clean-install.XXXXXX")

if [ "$refresh" -eq 1 ] || [ ! -f "$cache" ]; then
  step="debootstrap $suite ($variant) from $mirror"
  echo "check-clean-install: building the bare root ($variant $suite from $mirror; cached as $cache)"
  t=$SECONDS
  variant_arg=()
  [ "$variant" = default ] || variant_arg=(--variant="$variant")
  if ! debootstrap "${variant_arg[@]}" --keyring="$keyring" "$suite" "$work/bare" "$mirror" > "$work/debootstrap.log" 2>&1; then
    tail -n 30 "$work/debootstrap.log" >&2
    exit 1
  fi
  step="cache the bare root in $cache"
  mkdir -p "$cache_dir"
  tar -C "$work/bare" --numeric-owner -cf - . | zstd -q -T0 --force -o "$cache_partial"
  mv "$cache_partial" "$cache"
  rm -rf --one-file-system "$work/bare"
  echo "check-clean-install: bare root cached in $((SECONDS - t)) s"
fi

step="unpack a fresh root from $cache"
root=$work/root
mkdir "$root"
zstd -q -dc "$cache" | tar -C "$root" --numeric-owner -xpf -

step="copy the checkout into the root"
mkdir -p "$root/work"
git -C "$repo" archive --format=tar --prefix=titan.cpp/ HEAD | tar -C "$root/work" -xf -
echo "check-clean-install: checkout HEAD $(git -C "$repo" rev-parse --short HEAD) copied into a fresh $variant $suite root"

step="configure the root's network and apt sources"
rm -f "$root/etc/resolv.conf"
cp -L /etc/resolv.conf "$root/etc/resolv.conf"
rm -f "$root/etc/apt/sources.list"
{
  printf 'Types: deb\nURIs: %s\nSuites: %s %s-updates\nComponents: main\nSigned-By: %s\n' \
    "$mirror" "$suite" "$suite" "$keyring"
  [ -z "$security" ] || printf '\nTypes: deb\nURIs: %s\nSuites: %s-security\nComponents: main\nSigned-By: %s\n' \
    "$security" "$suite" "$keyring"
} > "$root/etc/apt/sources.list.d/debian.sources"
# Only what reaching the mirror needs: proxies and the snapshot-mirror validity switches.
cat /etc/apt/apt.conf /etc/apt/apt.conf.d/* 2>/dev/null |
  grep -E '^[[:space:]]*Acquire::(https?::Proxy|ftp::Proxy|Check-Valid-Until|Check-Date)[[:space:]"].*;[[:space:]]*$' \
    > "$root/etc/apt/apt.conf.d/99host-network" || true
# Package scripts must not start services: they would run on the host.
printf '#!/bin/sh\nexit 101\n' > "$root/usr/sbin/policy-rc.d"
chmod 755 "$root/usr/sbin/policy-rc.d"

step="mount /proc, /sys, /dev in the root"
mount -t proc proc "$root/proc"
mount --bind /sys "$root/sys"
mount -o remount,bind,ro "$root/sys"
mount --bind /dev "$root/dev"
mount --bind /dev/pts "$root/dev/pts"
mount -t tmpfs -o mode=1777 tmpfs "$root/dev/shm"

env_args=(HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin TERM=dumb)
for v in http_proxy https_proxy no_proxy HTTP_PROXY HTTPS_PROXY NO_PROXY; do
  [ -z "${!v:-}" ] || env_args+=("$v=${!v}")
done
# Runs the shell command $1 in the checkout inside the root, in the background: a Ctrl-C then
# reaches the trap at once (a foreground apt-get would hold it until its install ends) and the
# cleanup kills what runs in the root.
run_in_root() {
  chroot "$root" /usr/bin/env -i "${env_args[@]}" /bin/bash -c "set -euo pipefail; cd /work/titan.cpp; $1" &
  wait $!
}

step="scripts/setup.sh"
echo "check-clean-install: running scripts/setup.sh in the root"
t=$SECONDS
run_in_root scripts/setup.sh
setup_s=$((SECONDS - t))

step="build/titan train --training.steps=$steps"
echo "check-clean-install: running build/titan train --training.steps=$steps in the root"
t=$SECONDS
run_in_root "build/titan train --training.steps=$steps --metrics.log_freq=5 2>&1 | tee /tmp/train.log"
train_s=$((SECONDS - t))

step="the loss must fall (summary line of the train)"
read -r first last < <(sed -n 's/^summary: loss \([0-9.]*\) -> \([0-9.]*\).*/\1 \2/p' "$root/tmp/train.log") || true
[ -n "${last:-}" ] || { echo "check-clean-install: the train printed no 'summary: loss A -> B' line" >&2; exit 1; }
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a) }' ||
  { echo "check-clean-install: the loss did not fall: $first -> $last" >&2; exit 1; }

step="the Hugging Face folder outputs/hf"
for f in config.json model.safetensors tokenizer.json; do
  [ -s "$root/work/titan.cpp/outputs/hf/$f" ] ||
    { echo "check-clean-install: the train wrote no outputs/hf/$f" >&2; exit 1; }
done

step="done"
echo "check-clean-install: OK in $((SECONDS - started)) s (setup.sh ${setup_s} s, train ${train_s} s), loss $first -> $last"
