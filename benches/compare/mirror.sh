#!/usr/bin/env bash
# Live migration, side by side: a 3-member etcd 3.4 source holding KEYS keys of VAL-byte
# values (written by kvbench, 64 clients), mirrored with `make-mirror` into a fresh 3-member
# destination, for each tool (etcd's own etcdctl, kvctl) and each destination system (etcd,
# kvd). Reports the time until the destination holds every key (the first copy), then the
# time until it holds CHANGES more keys written to the source one by one while the mirror
# runs (the follow phase), ROUNDS times.
#
# Usage: benches/compare/mirror.sh [out-dir]
# Env:   ROUNDS (1) KEYS (20000) VAL (256) CHANGES (2000) KVD_BIN KVCTL_BIN KVBENCH_BIN
#        (default: $CARGO_TARGET_DIR or target, release/) ETCD_BIN (etcd) ETCDCTL (etcdctl)
#        SKIP_BUILD=1
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
. "$ROOT/benches/compare/cluster.sh"
KVCTL_BIN=${KVCTL_BIN:-$TD/release/kvctl}
ROUNDS=${ROUNDS:-1}
KEYS=${KEYS:-20000}
VAL=${VAL:-256}
CHANGES=${CHANGES:-2000}
OUT=${1:-$(mktemp -d /tmp/mirror.XXXXXX)}
mkdir -p "$OUT"
export ETCDCTL_API=3

for b in "$ETCD_BIN" "$ETCDCTL"; do
  command -v "$b" >/dev/null || { echo "$b not found (apt-get install -y etcd-server etcd-client)" >&2; exit 1; }
done
if [[ -z ${SKIP_BUILD:-} ]]; then
  (cd "$ROOT" && cargo build --release --bin kvd --bin kvctl --bin kvbench)
fi
trap cleanup EXIT

now() { date +%s.%N; }

# count EP PREFIX: keys under PREFIX (a range's count does not depend on its limit).
count() {
  "$ETCDCTL" --endpoints "$1" get "$2" --prefix --limit 1 -w json 2>/dev/null |
    python3 -c 'import json,sys; print(json.load(sys.stdin).get("count", 0))' 2>/dev/null || echo 0
}

# wait_count EP PREFIX N: waits (10 min at most) until EP holds N keys under PREFIX.
wait_count() {
  for _ in $(seq 1 6000); do
    (($(count "$1" "$2") >= $3)) && return 0
    sleep 0.1
  done
  echo "timed out waiting for $3 keys under $2 on $1" >&2
  exit 1
}

echo "round,tool,destination,keys,first_copy_s,changes,follow_s" >"$OUT/mirror.csv"
for round in $(seq 1 "$ROUNDS"); do
  fresh_cluster etcd "$OUT/r$round-src" 26790 30790
  SRC=$EP
  SRC_PIDS=("${PIDS[@]}")
  "$KVBENCH_BIN" put --endpoints "$SRC" --clients 64 --conns 16 --key-size 16 --val-size "$VAL" \
    --key-space-size "$KEYS" --sequential-keys --total "$KEYS" --json >"$OUT/r$round-load.json"
  # The keys kvbench wrote: sequential keys, all distinct, under no common prefix.
  have=$(count "$SRC" "")
  n=0
  for tool in etcdctl kvctl; do
    for dest in etcd kvd; do
      n=$((n + 1))
      ctl=$ETCDCTL
      [[ $tool == kvctl ]] && ctl=$KVCTL_BIN
      fresh_cluster "$dest" "$OUT/r$round-$tool-$dest" 27790 31790
      DST=$EP
      t0=$(now)
      "$ctl" --endpoints "$SRC" make-mirror --dest-prefix "/m$n/" "$DST" >"$OUT/r$round-$tool-$dest.mirror.log" 2>&1 &
      mpid=$!
      wait_count "$DST" "/m$n/" "$have"
      t1=$(now)
      # New keys one at a time (one etcdctl per put would time etcdctl's start); a key size
      # of its own per run keeps them distinct from every earlier run's.
      "$KVBENCH_BIN" put --endpoints "$SRC" --clients 1 --key-size $((20 + n)) --val-size 16 \
        --key-space-size "$CHANGES" --sequential-keys --total "$CHANGES" --json >/dev/null
      t2=$(now)
      wait_count "$DST" "/m$n/" $((have + CHANGES))
      t3=$(now)
      kill "$mpid" 2>/dev/null || true
      wait "$mpid" 2>/dev/null || true
      echo "$round,$tool,$dest,$have,$(secs "$t0" "$t1"),$CHANGES,$(secs "$t2" "$t3")" | tee -a "$OUT/mirror.csv"
      # Stop the destination, keep the source.
      for p in "${PIDS[@]}"; do
        [[ " ${SRC_PIDS[*]} " == *" $p "* ]] || { kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; }
      done
      PIDS=("${SRC_PIDS[@]}")
      rm -rf "$OUT/r$round-$tool-$dest"/*.data
      have=$(count "$SRC" "")
    done
  done
  cleanup
  rm -rf "$OUT/r$round-src"/*.data
done
echo "results in $OUT/mirror.csv"
