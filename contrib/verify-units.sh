#!/usr/bin/env bash
# Checks contrib/systemd/*.service with `systemd-analyze verify` (syntax, directives,
# specifiers, ExecStart executable) and prints the `systemd-analyze security` exposure score
# of each, failing above MAX_EXPOSURE. The units name /usr/local/bin/cohort; the copies
# checked here name the binary given as $1 instead, so this runs before any install.
#
#   contrib/verify-units.sh target/debug/cohort
set -euo pipefail
cd "$(dirname "$0")"
bin=$(realpath "${1:?usage: $0 PATH/TO/cohort}")
# systemd's own scale: 0 = fully locked down, 10 = exposed; "OK" ends at 2.0... "MEDIUM" at 6.9.
MAX_EXPOSURE=${MAX_EXPOSURE:-2.5}
command -v systemd-analyze >/dev/null || { echo "FAIL: systemd-analyze not found" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for unit in systemd/*.service; do
  sed "s|/usr/local/bin/cohort|$bin|g" "$unit" > "$tmp/$(basename "$unit")"
done
status=0
for unit in "$tmp"/*.service; do
  name=$(basename "$unit")
  # A template is checked as one instance of it.
  check=$unit
  if [[ $name == *@.service ]]; then
    check="$tmp/${name%@.service}@example.service"
    cp "$unit" "$check"
  fi
  if ! out=$(systemd-analyze verify --man=no "$check" 2>&1) || [ -n "$out" ]; then
    echo "FAIL: systemd-analyze verify $name:" >&2
    echo "$out" >&2
    status=1
    continue
  fi
  score=$(systemd-analyze security --offline=yes "$check" 2>/dev/null \
    | sed -n 's/.*Overall exposure level for .*: \([0-9.]*\).*/\1/p')
  if [ -z "$score" ]; then
    echo "FAIL: no exposure score for $name" >&2
    status=1
  elif awk -v s="$score" -v m="$MAX_EXPOSURE" 'BEGIN { exit !(s > m) }'; then
    echo "FAIL: $name exposure $score > $MAX_EXPOSURE" >&2
    systemd-analyze security --offline=yes "$check" 2>/dev/null | grep -E '^✗' >&2 || true
    status=1
  else
    echo "ok: $name verified, exposure $score"
  fi
done
exit $status
