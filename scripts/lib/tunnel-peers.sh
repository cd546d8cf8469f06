# shellcheck shell=bash
# What scripts/peers/tunnel-stunnel.sh and scripts/tunnel-ab.sh share (sourced, never run,
# from the workspace root): the request/reply client built from scripts/peers/tunnel_rr.c
# ($RR), a scratch directory ($WORK) and the processes started ($PIDS), both cleaned up on
# exit, and a free loopback port (`port`).

mkdir -p target/peers
cc -O2 -Wall -pthread -o target/peers/tunnel_rr scripts/peers/tunnel_rr.c
RR=target/peers/tunnel_rr

WORK=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

# port: a loopback TCP port that was free a moment ago.
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
