#!/usr/bin/env bash
# Lease revokes on a member holding many keys, one member of each system
# side by side: KEYS keys of VAL bytes (no lease), then while a steady writer puts at RATE/s
# (its latencies summarised by kvbench), REVOKES grant+revoke pairs of leases with no keys
# through etcdctl, timed. A baseline writer run without revokes comes first, so the writer's
# p99 during the loop can be compared with its usual one.
#
# Usage: benches/compare/lease_revoke_loop.sh [out-dir]
# Env:   SYSTEMS ("kvd etcd") KEYS (100000) VAL (1024) REVOKES (20) RATE (200) WRITER_SECS (15)
#        PORT (27600) KVD_BIN KVBENCH_BIN (default: $CARGO_TARGET_DIR or target, release/)
#        ETCD_BIN (etcd) ETCDCTL_BIN (etcdctl) SKIP_BUILD=1
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
KVD_BIN=${KVD_BIN:-$TARGET/release/kvd}
KVBENCH_BIN=${KVBENCH_BIN:-$TARGET/release/kvbench}
ETCD_BIN=${ETCD_BIN:-etcd}
ETCDCTL_BIN=${ETCDCTL_BIN:-etcdctl}
SYSTEMS=${SYSTEMS:-kvd etcd}
KEYS=${KEYS:-100000}
VAL=${VAL:-1024}
REVOKES=${REVOKES:-20}
RATE=${RATE:-200}
WRITER_SECS=${WRITER_SECS:-15}
PORT=${PORT:-27600}
OUT=${1:-$(mktemp -d /tmp/revoke.XXXXXX)}
mkdir -p "$OUT"

if [[ -z ${SKIP_BUILD:-} ]]; then
  (cd "$ROOT" && cargo build --release --bin kvd --bin kvbench)
fi
PID=
trap '[[ -n $PID ]] && kill "$PID" 2>/dev/null; true' EXIT

ctl() { ETCDCTL_API=3 "$ETCDCTL_BIN" --endpoints "127.0.0.1:$PORT" "$@"; }
# The writer: RATE puts a second on keys of its own, for WRITER_SECS; prints kvbench's JSON.
writer() {
  "$KVBENCH_BIN" --endpoints "127.0.0.1:$PORT" --json put --clients 8 --conns 2 \
    --rate "$RATE" --total $((RATE * WRITER_SECS)) --key-space-size 1000 --key-size 12 \
    --val-size 128
}
p99() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); l=d["latency_ms"]; print("%.1f (max %.1f, %d errors)" % (l["p99"], l["max"], d["errors"]))' "$1"; }

for sys in $SYSTEMS; do
  dir="$OUT/$sys"
  rm -rf "$dir"
  mkdir -p "$dir"
  bin=$KVD_BIN
  [[ $sys == etcd ]] && bin=$ETCD_BIN
  "$bin" --name m0 --data-dir "$dir/data" \
    --listen-client-urls "http://127.0.0.1:$PORT" --advertise-client-urls "http://127.0.0.1:$PORT" \
    --listen-peer-urls "http://127.0.0.1:$((PORT + 1))" \
    --initial-advertise-peer-urls "http://127.0.0.1:$((PORT + 1))" \
    --initial-cluster "m0=http://127.0.0.1:$((PORT + 1))" \
    --quota-backend-bytes 17179869184 >"$dir/log" 2>&1 &
  PID=$!
  sleep 2
  "$KVBENCH_BIN" --endpoints "127.0.0.1:$PORT" put --total "$KEYS" --clients 64 --conns 16 \
    --key-space-size "$KEYS" --sequential-keys --val-size "$VAL" --key-size 16 >"$dir/load.txt" 2>&1
  writer >"$dir/baseline.json"
  writer >"$dir/during.json" &
  WPID=$!
  sleep 1
  t0=$(date +%s.%N)
  for _ in $(seq "$REVOKES"); do
    id=$(ctl lease grant 600 | awk '{print $2}')
    ctl lease revoke "$id" >/dev/null
  done
  t1=$(date +%s.%N)
  wait "$WPID"
  printf '%s: %s keys of %s B; %s grant+revoke pairs took %.2f s; writer p99 %s ms alone, %s ms during the loop; RSS %s MiB\n' \
    "$sys" "$KEYS" "$VAL" "$REVOKES" "$(python3 -c "print($t1 - $t0)")" \
    "$(p99 "$dir/baseline.json")" "$(p99 "$dir/during.json")" \
    "$(awk '/VmRSS/ {print int($2 / 1024)}' "/proc/$PID/status")" | tee -a "$OUT/results.txt"
  kill "$PID"
  wait "$PID" 2>/dev/null || true
  PID=
  rm -rf "$dir/data"
done
echo "results in $OUT/results.txt"
