#!/usr/bin/env bash
# Checks the README's install command: `cargo install --path crates/cohort` into a temporary
# root, then runs the installed binary (--version, completions, man). By default it installs
# the debug build and shares the workspace's target/ (so CI, which built target/debug
# already, only links); `--release` installs what users get (a full release build).
#
#   scripts/install-check.sh            # cargo install --debug, target/ reused
#   scripts/install-check.sh --release  # cargo install (release), target/ reused
set -euo pipefail
cd "$(dirname "$0")/.."
profile=(--debug)
[ "${1:-}" = "--release" ] && profile=()
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
cargo install --quiet --locked --path crates/cohort --root "$root" "${profile[@]}"
bin="$root/bin/cohort"
[ -x "$bin" ] || { echo "FAIL: $bin was not installed" >&2; exit 1; }
want="cohort $(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)"
got=$("$bin" --version)
[ "$got" = "$want" ] || { echo "FAIL: $bin --version says '$got', expected '$want'" >&2; exit 1; }
# The installed binary needs nothing from the source tree: run it from elsewhere.
(cd / && bash -c 'source <("$0" completions bash) && complete -p cohort' "$bin" >/dev/null) \
  || { echo "FAIL: the installed completions do not load in bash" >&2; exit 1; }
(cd / && "$bin" man | head -5 | grep -q '^\.TH') \
  || { echo "FAIL: the installed man page is not roff" >&2; exit 1; }
echo "ok: cargo install --path crates/cohort --root $root${profile[*]:+ ${profile[*]}}: $got"
