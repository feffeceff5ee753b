#!/usr/bin/env bash
# Lease storm, kvd and etcd 3.4 side by side: 100,000 leases of 30 s, 10,000
# holding a key, granted through the leader, expire together while another client puts one
# key at a time. The client is the ignored test `lease_storm_full` (tests/lease_storm.rs)
# pointed at each cluster's leader; it prints the worst put latency during the storm and the
# time from the last lease's expiry until every storm key was gone. This script adds the
# peak RSS of each member, sampled every 0.5 s while the test runs.
#
# Usage: benches/compare/lease_storm.sh [out-dir]
# Env:   SYSTEMS ("etcd kvd") KVD_BIN ETCD_BIN (see cluster.sh) SKIP_BUILD=1
set -euo pipefail
trap 'echo "$0: failed at line $LINENO" >&2' ERR

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
. "$ROOT/benches/compare/cluster.sh"
SYSTEMS=(${SYSTEMS:-etcd kvd})
OUT=${1:-$(mktemp -d /tmp/lease_storm.XXXXXX)}
mkdir -p "$OUT"
trap cleanup EXIT

if [[ -z ${SKIP_BUILD:-} ]]; then
  (cd "$ROOT" && cargo build --release --bin kvd && cargo test --test lease_storm --no-run)
fi

rss_kib() { awk '/^VmRSS/ { print $2 }' "/proc/$1/status" 2>/dev/null || echo 0; }

for sys in "${SYSTEMS[@]}"; do
  fresh_cluster "$sys" "$OUT/data" 21000 22000
  echo "$sys: leader m$LEADER at $EP" >&2
  declare -A PEAK=([0]=0 [1]=0 [2]=0)
  (cd "$ROOT" && STORM_ENDPOINT=$EP cargo test -q --test lease_storm -- --ignored \
    --exact lease_storm_full --nocapture) >"$OUT/$sys-client.log" 2>&1 &
  client=$!
  while kill -0 "$client" 2>/dev/null; do
    for i in 0 1 2; do
      r=$(rss_kib "${MPID[$sys,$i]}")
      ((r > PEAK[$i])) && PEAK[$i]=$r
    done
    sleep 0.5
  done
  wait "$client" && ok=passed || ok=FAILED
  line=$(grep '^STORM' "$OUT/$sys-client.log" || echo "STORM (no result)")
  warns=$(grep -c 'revoking expired lease' "$OUT/data/$sys-m$LEADER.log" || true)
  echo "$sys $line peak_rss_mib(m0,m1,m2)=$((PEAK[0] / 1024)),$((PEAK[1] / 1024)),$((PEAK[2] / 1024)) leader=m$LEADER revoke_warnings=$warns test=$ok" |
    tee -a "$OUT/results.txt"
  cleanup
  cp "$OUT"/data/*.log "$OUT/"
  rm -rf "$OUT/data"
done
echo "results in $OUT/results.txt" >&2
