#!/usr/bin/env bash
# A member down, side by side: what one unavailable follower costs the leader of a 3-member
# cluster, kvd against etcd 3.4, both with default flags (etcd's default logger and level).
# Scenarios: none (all up, the reference), kill (SIGKILL: connections refused), stop
# (SIGSTOP: connections accepted by the kernel, never answered).
# For each system and scenario, on a fresh cluster: fault the follower after the leader,
# wait SETTLE s, then over IDLE s with no client traffic measure the leader's CPU
# (utime+stime from /proc/PID/stat, % of one core) and how many bytes its log grew; then
# put throughput and p99 at 64 clients (kvbench, 16 connections, 256-byte values).
#
# A packet-dropping partition is not measured here: on one loopback address a port-based
# DROP only cuts the connections a member accepts, and etcd also sends to a member over the
# connections that member dials, so it would not partition etcd. tests/peer_down.rs covers
# a partition of kvd through its fault proxy.
#
# Usage: benches/compare/degraded.sh [out-dir]
# Env:   IDLE (10) SETTLE (2) TOTAL (10000 puts) SCENARIOS ("none kill stop")
#        SYSTEMS ("etcd kvd")
#        KVD_BIN KVBENCH_BIN ETCD_BIN (see cluster.sh) SKIP_BUILD=1 to use existing binaries
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
. "$ROOT/benches/compare/cluster.sh"
IDLE=${IDLE:-10}
SETTLE=${SETTLE:-2}
TOTAL=${TOTAL:-10000}
SCENARIOS=${SCENARIOS:-none kill stop}
SYSTEMS=${SYSTEMS:-etcd kvd}
OUT=${1:-$(mktemp -d /tmp/degraded.XXXXXX)}
mkdir -p "$OUT"
RAW=$OUT/degraded.tsv
export ETCD_LOG_ARGS=""

[[ $SYSTEMS != *etcd* ]] || command -v "$ETCD_BIN" >/dev/null || { echo "$ETCD_BIN not found (apt-get install -y etcd-server)" >&2; exit 1; }
if [[ -z ${SKIP_BUILD:-} ]]; then
  (cd "$ROOT" && cargo build --release --bin kvd --bin kvbench)
fi
trap 'for p in "${PIDS[@]}"; do kill -CONT "$p" 2>/dev/null || true; done; cleanup' EXIT

ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
size() { stat -c %s "$1"; }

# one SYSTEM SCENARIO BASE: a fresh cluster at ports BASE.., one raw line.
one() {
  local sys=$1 sc=$2 base=$3 dir="$OUT/$1-$2" bin l f pid log
  if [[ $sys == etcd ]]; then bin=$ETCD_BIN; else bin=$KVD_BIN; fi
  mkdir -p "$dir"
  start_cluster "$sys" "$bin" "$base" "$dir"
  wait_leader "$sys"
  sleep 1
  l=$(leader_now "$sys")
  f=$(((l + 1) % 3))
  pid=${MPID[$sys,$l]}
  log="$dir/$sys-m$l.log"
  case $sc in
    kill) kill -KILL "${MPID[$sys,$f]}" ;;
    stop) kill -STOP "${MPID[$sys,$f]}" ;;
  esac
  sleep "$SETTLE"
  local c0 s0 c1 s1 hz
  hz=$(getconf CLK_TCK)
  c0=$(ticks "$pid"); s0=$(size "$log")
  sleep "$IDLE"
  c1=$(ticks "$pid"); s1=$(size "$log")
  local j="$dir/put.json"
  "$KVBENCH_BIN" --endpoints "${CLIENT[$sys,$l]}" --json put --key-size 8 --val-size 256 \
    --key-space-size 100000 --clients 64 --conns 16 --total "$TOTAL" >"$j"
  python3 - "$j" "$sys" "$sc" "$((c1 - c0))" "$hz" "$IDLE" "$((s1 - s0))" >>"$RAW" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
sysname, sc, ticks, hz, idle, grew = sys.argv[2:8]
cpu = int(ticks) / int(hz) / float(idle) * 100
print("\t".join(map(str, [sysname, sc, round(cpu, 1), grew, round(j["qps"]),
                          j["latency_ms"]["p99"], j["errors"]])))
PY
  echo "  $sys $sc: $(tail -1 "$RAW")" >&2
  [[ $sc == stop ]] && kill -CONT "${MPID[$sys,$f]}"
  cleanup
  rm -rf "$dir"/*.data
}

echo "output: $OUT" >&2
: >"$RAW"
for sc in $SCENARIOS; do
  for sys in $SYSTEMS; do
    if [[ $sys == etcd ]]; then one etcd "$sc" 25890; else one kvd "$sc" 29890; fi
  done
done

python3 - "$RAW" "$IDLE" <<'PY'
import sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
print(f"| follower | system | leader CPU idle (% of a core) | leader log growth (bytes / {sys.argv[2]} s idle) | put-64 qps | put-64 p99 (ms) | errors |")
print("|---|---|---:|---:|---:|---:|---:|")
for r in rows:
    print(f"| {r[1]} | {r[0]} | {r[2]} | {r[3]} | {r[4]} | {r[5]} | {r[6]} |")
PY
