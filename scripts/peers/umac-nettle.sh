#!/bin/sh
# scripts/peers/umac-nettle.sh: cohort's UMAC against Nettle's (issue 18, section 1).
#
# Installs nettle-dev from Debian if it is missing, builds scripts/peers/umac_nettle_bench.c
# against libnettle into target/peers/, then runs ROUNDS rounds of, in alternating order,
#   cohort gears bench --gears umac-32,umac-64,partial-64 --sizes 8192,65536
#   target/peers/umac_nettle_bench (Nettle's umac32 and umac64 at the same sizes)
# both timing full tags the same way (an iteration count for about MILLIS/5 ms, best of 5).
# Prints each round, then the medians of the per-round ratios cohort/Nettle, and of
# partial-64 / hmac-sha256 at 64 KiB (hmac-sha256 is measured by cohort in the same process),
# with the CPU model and the load average.
#
# Environment: ROUNDS (default 5), MILLIS (per measurement, default 200), COHORT (the cohort
# binary; default target/release/cohort, built if absent), COHORT_UMAC_NH (force an NH path).
set -eu

ROUNDS=${ROUNDS:-5}
MILLIS=${MILLIS:-200}
root=$(cd "$(dirname "$0")/../.." && pwd)
out="$root/target/peers"
bench="$out/umac_nettle_bench"

if [ ! -f /usr/include/nettle/umac.h ]; then
    echo "nettle-dev is missing: installing it from Debian" >&2
    if [ "$(id -u)" = 0 ]; then
        apt-get install -y nettle-dev
    else
        sudo apt-get install -y nettle-dev
    fi
fi
mkdir -p "$out"
${CC:-cc} -O2 -Wall -o "$bench" "$root/scripts/peers/umac_nettle_bench.c" -lnettle

COHORT=${COHORT:-"$root/target/release/cohort"}
if [ ! -x "$COHORT" ]; then
    (cd "$root" && cargo build --release -p cohort)
fi

cpu=$(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //')
nettle_version=$(dpkg-query -W -f '${Version}' libnettle8 2>/dev/null || echo unknown)
echo "CPU: $cpu ($(nproc) cores)"
echo "Nettle (libnettle8) $nettle_version; cohort $("$COHORT" --version 2>/dev/null || echo '?')"
echo "NH path: ${COHORT_UMAC_NH:-default (fastest the CPU supports)}; $ROUNDS rounds, $MILLIS ms per measurement"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

run_cohort() {
    "$COHORT" gears bench --gears umac-32,umac-64,partial-64 --sizes 8192,65536 \
        --millis "$MILLIS" 2>/dev/null |
        awk '$1 ~ /^(hmac-sha256|umac-32|umac-64|partial-64)$/ { print "cohort", $1, $2, $3 }'
}
run_nettle() {
    "$bench" "$MILLIS" 8192 65536 |
        awk '{ sub(/^umac/, "umac-", $2); printf "nettle %s %s %.1f\n", $2, $3, $4 / 1e6 }'
}

r=1
while [ "$r" -le "$ROUNDS" ]; do
    if [ $((r % 2)) = 1 ]; then
        run_cohort >"$tmp/c"
        run_nettle >"$tmp/n"
    else
        run_nettle >"$tmp/n"
        run_cohort >"$tmp/c"
    fi
    # One line per (gear, size) with both rates (MB/s) and the ratio, tagged with the round.
    awk -v r="$r" '
        FNR == NR { rate[$2 " " $3] = $4; next }
        $1 == "cohort" && ($2 " " $3) in rate {
            printf "round %d %-8s %6d B  cohort %9.1f MB/s  nettle %9.1f MB/s  ratio %.3f\n",
                r, $2, $3, $4, rate[$2 " " $3], $4 / rate[$2 " " $3]
        }
        $1 == "cohort" { c[$2 " " $3] = $4 }
        END {
            if (("partial-64 65536") in c && ("hmac-sha256 65536") in c)
                printf "round %d partial-64  65536 B  %.1f MB/s  hmac-sha256 %.1f MB/s  ratio %.1f\n",
                    r, c["partial-64 65536"], c["hmac-sha256 65536"],
                    c["partial-64 65536"] / c["hmac-sha256 65536"]
        }' "$tmp/n" "$tmp/c" | tee -a "$tmp/all"
    r=$((r + 1))
done

echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "medians over $ROUNDS rounds (ratio per round, then the median; goal in brackets):"
for key in "umac-32 8192" "umac-32 65536" "umac-64 8192" "umac-64 65536" "partial-64 65536"; do
    set -- $key
    awk -v g="$1" -v s="$2" '
        $3 == g && $4 == s { v[n++] = $NF }
        END {
            if (n == 0) { printf "  %-10s %6d B  no data\n", g, s; exit }
            for (i = 0; i < n; i++) for (j = i + 1; j < n; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
            m = (n % 2) ? v[(n - 1) / 2] : (v[n / 2 - 1] + v[n / 2]) / 2
            if (g == "partial-64") { goal = 150; what = "x hmac-sha256" } else { goal = 1.25; what = "x Nettle" }
            printf "  %-10s %6d B  %8.3f %s  (goal >= %s)  %s\n", g, s, m, what, goal, (m >= goal) ? "met" : "NOT met"
        }' "$tmp/all"
done
