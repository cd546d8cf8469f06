#!/usr/bin/env bash
# Refreshes the fuzz corpus under fuzz/corpus/<target>: the seeds, built from real flights,
# records, packets and datagrams by each protocol crate's tests/fuzz_harness.rs
# (COHORT_WRITE_CORPUS=1 makes its `fuzz_corpus_replays` test write them as seed-<name>;
# cohort-hop's is in tests/fuzz_corpus.rs),
# and, given the FUZZ_WORK directory of a long run (scripts/fuzz.sh), the inputs of that run
# that add coverage (libFuzzer's -merge=1; nothing is added that the corpus already covers).
#
#   scripts/fuzz-corpus.sh [FUZZ_WORK_DIR [TARGET...]]
#
# Every input kept is replayed by `cargo test` (the same test, without the variable).
set -euo pipefail
cd "$(dirname "$0")/.."

for crate in cohort-gears cohort-kdc cohort-channel cohort-group cohort-hop; do
  COHORT_WRITE_CORPUS=1 cargo test --quiet --locked -p "$crate" \
    fuzz_corpus_replays >/dev/null
done
echo "seeds written"

[ $# -ge 1 ] || exit 0
work=$(cd "$1" && pwd)
shift
targets=("$@")
fuzz() { (cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz "$@"); }
if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets < <(fuzz list)
fi
sanitizer=${FUZZ_SANITIZER:-address}
for target in "${targets[@]}"; do
  [ -d "$work/$target" ] || continue
  before=$(find "fuzz/corpus/$target" -type f | wc -l)
  fuzz run -O -s "$sanitizer" "$target" "$PWD/fuzz/corpus/$target" "$work/$target" -- \
    -merge=1 >"$work/$target.merge.log" 2>&1 || { tail -20 "$work/$target.merge.log"; exit 1; }
  after=$(find "fuzz/corpus/$target" -type f | wc -l)
  printf '%-26s %6d -> %6d inputs\n' "$target" "$before" "$after"
done
