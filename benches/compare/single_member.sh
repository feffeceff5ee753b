#!/usr/bin/env bash
# One member of each system, side by side: PUTS puts of VAL-byte values over PUTS keys (64
# clients, 16 connections) with --snapshot-count SNAP, then the member's RSS SETTLE seconds
# after the load (and its peak), and its data dir. Shows what the snapshot count costs a
# member in memory and disk (docs/benchmarks.md, "Snapshots read live from the engine").
#
# Usage: benches/compare/single_member.sh [out-dir]
# Env:   SNAPS ("10000 100000") SYSTEMS ("kvd etcd") PUTS (300000) VAL (1024) SETTLE (10)
#        PORT (27400) KVD_BIN KVBENCH_BIN (default: $CARGO_TARGET_DIR or target, release/)
#        ETCD_BIN (etcd) SKIP_BUILD=1 KEEP=1 (keep the data dirs)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
KVD_BIN=${KVD_BIN:-$TARGET/release/kvd}
KVBENCH_BIN=${KVBENCH_BIN:-$TARGET/release/kvbench}
ETCD_BIN=${ETCD_BIN:-etcd}
SNAPS=${SNAPS:-10000 100000}
SYSTEMS=${SYSTEMS:-kvd etcd}
PUTS=${PUTS:-300000}
VAL=${VAL:-1024}
SETTLE=${SETTLE:-10}
PORT=${PORT:-27400}
OUT=${1:-$(mktemp -d /tmp/single.XXXXXX)}
mkdir -p "$OUT"

if [[ -z ${SKIP_BUILD:-} ]]; then
  (cd "$ROOT" && cargo build --release --bin kvd --bin kvbench)
fi
PID=
trap '[[ -n $PID ]] && kill "$PID" 2>/dev/null; true' EXIT

mib() { awk "/$2/ {print int(\$2 / 1024)}" "/proc/$1/status"; }

for snap in $SNAPS; do
  for sys in $SYSTEMS; do
    dir="$OUT/$sys-$snap"
    rm -rf "$dir"
    mkdir -p "$dir"
    bin=$KVD_BIN
    [[ $sys == etcd ]] && bin=$ETCD_BIN
    "$bin" --name m0 --data-dir "$dir/data" \
      --listen-client-urls "http://127.0.0.1:$PORT" --advertise-client-urls "http://127.0.0.1:$PORT" \
      --listen-peer-urls "http://127.0.0.1:$((PORT + 1))" \
      --initial-advertise-peer-urls "http://127.0.0.1:$((PORT + 1))" \
      --initial-cluster "m0=http://127.0.0.1:$((PORT + 1))" \
      --snapshot-count "$snap" --quota-backend-bytes 17179869184 >"$dir/log" 2>&1 &
    PID=$!
    sleep 2
    t0=$(date +%s.%N)
    "$KVBENCH_BIN" --endpoints "127.0.0.1:$PORT" put --total "$PUTS" --clients 64 --conns 16 \
      --key-space-size "$PUTS" --val-size "$VAL" --key-size 16 >"$dir/bench.txt" 2>&1
    t1=$(date +%s.%N)
    sleep "$SETTLE"
    printf '%s --snapshot-count %s: load %.1f s; RSS %s s after %s MiB (peak %s); data dir %s MiB\n' \
      "$sys" "$snap" "$(python3 -c "print($t1 - $t0)")" "$SETTLE" "$(mib "$PID" VmRSS)" \
      "$(mib "$PID" VmHWM)" "$(du -sm "$dir/data" | awk '{print $1}')" | tee -a "$OUT/results.txt"
    kill "$PID"
    wait "$PID" 2>/dev/null || true
    PID=
    [[ -n ${KEEP:-} ]] || rm -rf "$dir/data"
  done
done
echo "results in $OUT/results.txt"
