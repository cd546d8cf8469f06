#!/usr/bin/env bash
# Runs cohort's fuzz targets (fuzz/fuzz_targets) on the stable toolchain: cargo-fuzz with
# RUSTC_BOOTSTRAP=1, which lets stable rustc take libFuzzer's and the sanitizer's unstable
# flags (as oss-fuzz does). Each target runs SECONDS of wall time; the script prints the
# executions per target and fails if any target crashed, leaked or timed out (libFuzzer
# writes the input under fuzz/artifacts/<target>/).
#
#   scripts/fuzz.sh SECONDS [TARGET...]      every target when none is named
#
# FUZZ_SANITIZER=none builds without AddressSanitizer (faster). FUZZ_TARGET_DIR=DIR builds in
# DIR instead of fuzz/target (a build with another sanitizer there leaves the first one
# alone, so switching back does not rebuild everything). FUZZ_RUNS=N stops a target
# after N executions (SECONDS still bounds it). New inputs the fuzzer finds go to a scratch
# corpus, deleted at the end unless FUZZ_WORK=DIR names a directory to keep it in
# (DIR/<target>, reused by the next run); fuzz/corpus/<target> is read as seeds and never
# written (scripts/fuzz-corpus.sh refreshes it). Each target's libFuzzer output goes to
# <scratch>/<target>.<UTC time>.log. RUSTC_BOOTSTRAP is set for the cargo-fuzz commands
# only, never for the rest of the build.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ $# -lt 1 ] || ! [[ "$1" =~ ^[0-9]+$ ]] || [ "$1" -lt 1 ]; then
  echo "usage: scripts/fuzz.sh SECONDS [TARGET...]" >&2
  exit 2
fi
seconds=$1
shift
sanitizer=${FUZZ_SANITIZER:-address}

if ! cargo fuzz --version >/dev/null 2>&1; then
  cargo install cargo-fuzz --locked
fi
fuzz() { (cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz "$@"); }
target_dir=()
[ -n "${FUZZ_TARGET_DIR:-}" ] && target_dir=(--target-dir "$(mkdir -p "$FUZZ_TARGET_DIR" && cd "$FUZZ_TARGET_DIR" && pwd)")

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets < <(fuzz list)
fi

fuzz build -O -s "$sanitizer" "${target_dir[@]}"

if [ -n "${FUZZ_WORK:-}" ]; then
  scratch=$(mkdir -p "$FUZZ_WORK" && cd "$FUZZ_WORK" && pwd)
else
  scratch=$(mktemp -d)
  trap 'rm -rf "$scratch"' EXIT
fi
runs=()
[ -n "${FUZZ_RUNS:-}" ] && runs=("-runs=$FUZZ_RUNS")
failed=()
total=0
printf '%-26s %14s  %s\n' target execs result
for target in "${targets[@]}"; do
  mkdir -p "$scratch/$target"
  seeds=()
  [ -d "fuzz/corpus/$target" ] && seeds=("$PWD/fuzz/corpus/$target")
  # One log per run (a kept FUZZ_WORK directory collects them; a second run does not
  # overwrite the first's).
  log="$scratch/$target.$(date -u +%Y%m%dT%H%M%SZ).log"
  if fuzz run -O -s "$sanitizer" "${target_dir[@]}" "$target" "$scratch/$target" "${seeds[@]}" -- \
      -max_total_time="$seconds" "${runs[@]}" -print_final_stats=1 >"$log" 2>&1; then
    result=ok
  else
    result=FAILED
    failed+=("$target")
  fi
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  execs=${execs:-0}
  total=$((total + execs))
  printf '%-26s %14s  %s\n' "$target" "$execs" "$result"
  if [ "$result" = FAILED ]; then
    echo "---- last lines of $target's log:" >&2
    tail -40 "$log" >&2
  fi
done
printf '%-26s %14s\n' total "$total"
echo "sanitizer: $sanitizer, $seconds s per target, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
if [ ${#failed[@]} -gt 0 ]; then
  echo "FAIL: ${failed[*]}" >&2
  exit 1
fi
