# shellcheck shell=bash
# The skeleton every network-namespace script shares (sourced, never run): the checks of
# its one argument (the cohort binary), of root and of the tools; a scratch directory;
# namespaces, veth pairs and their addresses; processes started in a namespace with their
# logs; cutting and restoring a link; waiting for a condition; the failure dump; and one
# cleanup trap that stops every process it started, deletes every namespace it made and
# removes the scratch directory.
#
# Owns: the lifecycle of a namespace test. Must not hold any test's checks, addresses or
# namespace names: each script passes its own, keeps its own steps and its own exit status
# semantics (FAIL and status 1 on a failed check, status 2 on a usage error).
#
# After `netns_init`, a script has COHORT (the binary's absolute path) and WORK (the
# scratch directory); it defines `dump` to list its logs (with `dump_log`) for `die`.

# fail MESSAGE...: FAIL on stderr and exit 1, before anything worth dumping has run.
fail() { echo "FAIL: $*" >&2; exit 1; }

# die MESSAGE...: FAIL on stderr, then the script's `dump` of its logs; exit 1.
die() {
  echo "FAIL: $*" >&2
  if declare -F dump >/dev/null; then dump >&2; fi
  exit 1
}

NETNS_NAMESPACES=() # made by netns_add: deleted on exit
NETNS_PIDS=()       # started by netns_start: stopped on exit
NETNS_ALIVE=()      # "PID WHAT" entries that `alive` checks

netns_cleanup() {
  local p
  for p in "${NETNS_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  for p in "${NETNS_NAMESPACES[@]}"; do ip netns del "$p" 2>/dev/null || true; done
  [ -z "${WORK:-}" ] || rm -rf "$WORK"
}

# netns_init WHY_ROOT ARGS...: checks the usage (one argument: PATH/TO/cohort), that it is
# executable, root (needed for WHY_ROOT), ip and python3; sets COHORT and WORK and the
# cleanup trap.
netns_init() {
  local why=$1
  shift
  [ $# -eq 1 ] || { echo "usage: $0 PATH/TO/cohort" >&2; exit 2; }
  [ -x "$1" ] || fail "$1 is not an executable"
  COHORT=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
  [ "$(id -u)" -eq 0 ] || fail "needs root ($why)"
  need_tool ip "ip (iproute2) not found"
  need_tool python3 "python3 not found"
  WORK=$(mktemp -d)
  trap netns_cleanup EXIT
}

# need_tool COMMAND MESSAGE: fails with MESSAGE unless COMMAND is on the PATH.
need_tool() { command -v "$1" >/dev/null || fail "$2"; }

# netns_add NS...: makes each namespace, with its loopback up; deleted on exit.
netns_add() {
  local ns
  for ns in "$@"; do
    ip netns add "$ns" || fail "cannot create network namespace $ns (ip netns unavailable?)"
    NETNS_NAMESPACES+=("$ns")
    ip -n "$ns" link set lo up
  done
}

# netns_veth NS1 DEV1 ADDR1 NS2 DEV2 ADDR2: a veth pair DEV1 (in NS1, address ADDR1) - DEV2
# (in NS2, address ADDR2), both ends up.
netns_veth() {
  ip link add "$2" type veth peer name "$5" || fail "cannot create a veth pair"
  ip link set "$2" netns "$1"; ip link set "$5" netns "$4"
  ip -n "$1" addr add "$3" dev "$2"; ip -n "$4" addr add "$6" dev "$5"
  ip -n "$1" link set "$2" up; ip -n "$4" link set "$5" up
}

# link_down NS DEV / link_up NS DEV: cut and restore a link at one of its ends.
link_down() { ip -n "$1" link set "$2" down; }
link_up() { ip -n "$1" link set "$2" up; }

# netns_start NAME NS STDIN COMMAND...: runs COMMAND in namespace NS (in this one if NS is
# -) in the background, stdin from STDIN, stdout to $WORK/NAME.out, stderr to
# $WORK/NAME.err; stopped on exit. Its process id is left in STARTED.
netns_start() {
  local name=$1 ns=$2 input=$3
  shift 3
  if [ "$ns" = - ]; then
    "$@" <"$input" >"$WORK/$name.out" 2>"$WORK/$name.err" &
  else
    ip netns exec "$ns" "$@" <"$input" >"$WORK/$name.out" 2>"$WORK/$name.err" &
  fi
  STARTED=$!
  NETNS_PIDS+=("$STARTED")
}

# watch_alive PID WHAT: `alive` fails with "WHAT exited" once PID is gone.
watch_alive() { NETNS_ALIVE+=("$1 $2"); }

# alive: every watched process still runs.
alive() {
  local entry
  for entry in "${NETNS_ALIVE[@]}"; do
    kill -0 "${entry%% *}" 2>/dev/null || die "${entry#* } exited"
  done
}

# reap PID: waits for a started process to end by itself and forgets it (the wait's status).
reap() {
  netns_forget "$1"
  wait "$1"
}

# stop_process PID: stops a started process and forgets it.
stop_process() {
  netns_forget "$1"
  kill "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
}

netns_forget() {
  local keep=() p
  for p in "${NETNS_PIDS[@]}"; do [ "$p" = "$1" ] || keep+=("$p"); done
  NETNS_PIDS=("${keep[@]}")
  keep=()
  for p in "${NETNS_ALIVE[@]}"; do [ "${p%% *}" = "$1" ] || keep+=("$p"); done
  NETNS_ALIVE=("${keep[@]}")
}

# wait_for SECONDS DESCRIPTION COMMAND...: polls until COMMAND succeeds; dies with "no
# DESCRIPTION within SECONDSs" when it does not.
wait_for() {
  local limit=$1 what=$2
  shift 2
  local end=$((SECONDS + limit))
  until "$@"; do
    [ $SECONDS -lt $end ] || die "no $what within ${limit}s"
    sleep 0.2
  done
}

# now: the time in seconds, with nanoseconds. elapsed FROM TO: TO - FROM, two decimals.
now() { date +%s.%N; }
elapsed() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.2f}')" "$1" "$2"; }

# dump_log FILE [LINES [SKIP]]: FILE under a header naming it; with LINES only its last
# LINES lines, leaving out those that match the extended regex SKIP, each cut at 300
# characters.
dump_log() {
  local file=$1 lines=${2:-} skip=${3:-^$}
  if [ -z "$lines" ]; then
    echo "--- ${file#"$WORK"/}"
    cat "$file" 2>/dev/null || true
  else
    echo "--- ${file#"$WORK"/} (last $lines lines${3:+ but those matching $3}, cut at 300 characters)"
    grep -vE "$skip" "$file" 2>/dev/null | tail -n "$lines" | cut -c1-300 || true
  fi
}
