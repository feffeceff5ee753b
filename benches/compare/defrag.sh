#!/usr/bin/env bash
# Defragmentation of a large store, side by side: a one-member cluster gets PUTS puts of VAL
# bytes over KEYS keys (64 clients, sequential keys), the history is compacted away at the
# last revision (`compaction --physical`), then `etcdctl defrag` runs against the member.
# Reports the defrag's wall time, the member's RSS before -> peak during (VmRSS sampled every
# 50 ms) -> after, the bytes it wrote (/proc/PID/io) and the data dir before and after (and
# after, per entry of its member/ directory: WAL, snapshots, engine). kvd
# and etcd 3.4 in turn, ROUNDS times; the data dirs are removed after each run.
#
# Usage: benches/compare/defrag.sh [out-dir]
# Env:   ROUNDS (1) PUTS (1000000) KEYS (500000) VAL (1024) SYSTEMS ("kvd etcd"; NAME=BIN runs
#        a kvd build under its own name, for A/B runs: SYSTEMS="etcd old=/tmp/kvd-old kvd")
#        KVD_BIN KVBENCH_BIN (default: $CARGO_TARGET_DIR or target, release/) ETCD_BIN (etcd)
#        ETCDCTL (etcdctl) SKIP_BUILD=1
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
. "$ROOT/benches/compare/cluster.sh"
ROUNDS=${ROUNDS:-1}
PUTS=${PUTS:-1000000}
KEYS=${KEYS:-500000}
VAL=${VAL:-1024}
SYSTEMS=${SYSTEMS:-kvd etcd}
OUT=${1:-$(mktemp -d /tmp/defrag.XXXXXX)}
mkdir -p "$OUT"
export ETCDCTL_API=3

prepare kvd kvbench

one() {
  local sys=${1%%=*} round=$2 base=27300 bin=$KVD_BIN extra=()
  [[ $1 == *=* ]] && bin=${1#*=}
  if [[ $sys == etcd ]]; then
    base=27400 bin=$ETCD_BIN
    extra=(--logger=zap --log-level=warn)
  fi
  local dir="$OUT/r$round-$sys" ep="127.0.0.1:$base"
  mkdir -p "$dir"
  "$bin" --name m0 --data-dir "$dir/data" \
    --listen-client-urls "http://$ep" --advertise-client-urls "http://$ep" \
    --listen-peer-urls "http://127.0.0.1:$((base + 1))" \
    --initial-advertise-peer-urls "http://127.0.0.1:$((base + 1))" \
    --initial-cluster "m0=http://127.0.0.1:$((base + 1))" --initial-cluster-state new \
    --quota-backend-bytes 17179869184 "${extra[@]}" >"$dir/member.log" 2>&1 &
  local pid=$!
  PIDS+=("$pid")
  local t
  for t in $(seq 1 150); do [[ -n $(revision "$ep") ]] && break; sleep 0.2; done
  "$KVBENCH_BIN" --endpoints "$ep" --json put --key-size 16 --val-size "$VAL" \
    --key-space-size "$KEYS" --sequential-keys --clients 64 --conns 16 --total "$PUTS" >"$dir/load.json"
  local rev
  rev=$(revision "$ep")
  "$ETCDCTL" --endpoints "$ep" --command-timeout=600s compaction --physical "$rev" >/dev/null
  sleep 2
  local disk0 rss0 w0
  disk0=$(du -sm "$dir/data" | awk '{print $1}')
  rss0=$(rss_mib "$pid")
  w0=$(written_mib "$pid")
  rm -f "$OUT/stop"
  peak_rss "$pid" >"$dir/peak" &
  local pr=$! d0 d1
  d0=$(date +%s.%N)
  "$ETCDCTL" --endpoints "$ep" --command-timeout=600s defrag >"$dir/defrag.out" 2>&1 ||
    echo "$sys: defrag failed: $(cat "$dir/defrag.out")" >&2
  d1=$(date +%s.%N)
  touch "$OUT/stop"
  wait "$pr"
  sleep 1
  local parts
  parts=$(cd "$dir/data" && du -sm member/* | awk '{ printf "%s%s %s", (NR > 1 ? ", " : ""), $2, $1 }')
  printf '%s round %s: %s puts over %s keys x %s B; defrag %ss; RSS %s -> peak %s -> %s MiB; wrote %s MiB; data dir %s -> %s MiB (%s)\n' \
    "$sys" "$round" "$PUTS" "$KEYS" "$VAL" "$(secs "$d0" "$d1")" "$rss0" "$(cat "$dir/peak")" \
    "$(rss_mib "$pid")" "$(($(written_mib "$pid") - w0))" "$disk0" \
    "$(du -sm "$dir/data" | awk '{print $1}')" "$parts" | tee -a "$OUT/results.txt"
  cleanup
  rm -rf "$dir"
}

for round in $(seq 1 "$ROUNDS"); do
  for sys in $SYSTEMS; do one "$sys" "$round"; done
done
echo "results in $OUT/results.txt"
