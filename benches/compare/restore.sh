#!/usr/bin/env bash
# Restores of one backup file, side by side: each tool in TOOLS restores BACKUP into a new data
# dir in turn (a `sync` before each), ROUNDS times. Reports each restore's wall time, peak RSS,
# bytes written (getrusage's block output, counted when pages are dirtied) and the data dir's
# size. Make BACKUP with `etcdctl snapshot save` from a loaded member (kvd's or etcd's; e.g.
# a one-member kvd after `kvbench put --key-size 16 --val-size 1024 --key-space-size 100000
# --sequential-keys --clients 64 --conns 16 --total 100000`).
#
# Usage: benches/compare/restore.sh BACKUP [out-dir]
# Env:   ROUNDS (3) TOOLS ("etcd=etcdctl kvd=$TD/release/kvctl"; NAME=BIN per tool, for A/B
#        runs: TOOLS="etcd=etcdctl old=/tmp/kvctl-old new=/tmp/kvctl-new")
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TD=${CARGO_TARGET_DIR:-$ROOT/target}
BACKUP=${1:?usage: $0 BACKUP [out-dir]}
OUT=${2:-$(mktemp -d /tmp/restore.XXXXXX)}
ROUNDS=${ROUNDS:-3}
TOOLS=${TOOLS:-etcd=etcdctl kvd=$TD/release/kvctl}
mkdir -p "$OUT"
export ETCDCTL_API=3
trap 'rm -rf "$OUT/data"' EXIT

for round in $(seq 1 "$ROUNDS"); do
  for t in $TOOLS; do
    name=${t%%=*} bin=${t#*=}
    rm -rf "$OUT/data"
    sync
    /usr/bin/time -o "$OUT/time" -f '%e %M %O' "$bin" snapshot restore "$BACKUP" --name m1 \
      --initial-cluster m1=http://127.0.0.1:2380 \
      --initial-advertise-peer-urls http://127.0.0.1:2380 \
      --data-dir "$OUT/data" >"$OUT/$name.out" 2>&1 ||
      { echo "$name: restore failed: $(tail -3 "$OUT/$name.out")" >&2; exit 1; }
    read -r secs kib blocks <"$OUT/time"
    printf '%s round %s: %s s, peak RSS %s MiB, written %s MiB, data dir %s MiB\n' \
      "$name" "$round" "$secs" $((kib / 1024)) $((blocks / 2048)) \
      "$(du -sm "$OUT/data" | cut -f1)" | tee -a "$OUT/results.txt"
  done
done
echo "results in $OUT/results.txt"
