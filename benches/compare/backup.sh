#!/usr/bin/env bash
# Backups, side by side: fill a fresh 3-member cluster with PUTS puts of VAL-byte values over
# KEYS keys (64 clients), then take a backup from a follower with etcd's own
# `etcdctl snapshot save` while one client keeps putting, and restore it into a data dir
# (`etcdctl snapshot restore` for etcd, `kvctl snapshot restore` for kvd). Reports the save's
# time, file size, the follower's peak RSS during the save, the concurrent puts' p99, the
# restore's time and peak RSS, and HashKV's time. kvd and etcd 3.4 in turn, ROUNDS times.
#
# Usage: benches/compare/backup.sh [out-dir]
# Env:   ROUNDS (1) PUTS (100000) KEYS (100000) VAL (1024) KVD_BIN KVCTL_BIN KVBENCH_BIN
#        (default: $CARGO_TARGET_DIR or target, release/) ETCD_BIN (etcd) ETCDCTL (etcdctl)
#        SKIP_BUILD=1
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
. "$ROOT/benches/compare/cluster.sh"
KVCTL_BIN=${KVCTL_BIN:-$TD/release/kvctl}
ROUNDS=${ROUNDS:-1}
PUTS=${PUTS:-100000}
KEYS=${KEYS:-100000}
VAL=${VAL:-1024}
OUT=${1:-$(mktemp -d /tmp/backup.XXXXXX)}
mkdir -p "$OUT"
export ETCDCTL_API=3

for b in "$ETCD_BIN" "$ETCDCTL"; do
  command -v "$b" >/dev/null || { echo "$b not found (apt-get install -y etcd-server etcd-client)" >&2; exit 1; }
done
if [[ -z ${SKIP_BUILD:-} ]]; then
  (cd "$ROOT" && cargo build --release --bin kvd --bin kvctl --bin kvbench)
fi
trap cleanup EXIT

one() {
  local sys=$1 round=$2
  local dir="$OUT/r$round-$sys"
  fresh_cluster "$sys" "$dir" 26790 30790
  local ep=$EP f=$(((LEADER + 1) % 3))
  local fep=${CLIENT[$sys,$f]}
  "$KVBENCH_BIN" --endpoints "$ep" --json put --key-size 16 --val-size "$VAL" \
    --key-space-size "$KEYS" --sequential-keys --clients 64 --conns 16 --total "$PUTS" >/dev/null
  local rss0
  rss0=$(($(awk '/VmRSS/ {print $2}' "/proc/${MPID[$sys,$f]}/status") / 1024))
  "$KVBENCH_BIN" --endpoints "$ep" --json put --key-size 16 --val-size 256 --clients 1 --conns 1 \
    --total 4000 >"$dir/during.json" &
  local kb=$!
  sleep 1
  rm -f "$OUT/stop"
  peak_rss "${MPID[$sys,$f]}" >"$dir/save_rss" &
  local pr=$!
  local t0 t1
  t0=$(date +%s.%N)
  "$ETCDCTL" --endpoints "$fep" snapshot save "$dir/backup.db" >/dev/null 2>&1
  t1=$(date +%s.%N)
  touch "$OUT/stop"
  wait "$pr"
  wait "$kb"
  local h0 h1
  h0=$(date +%s.%N)
  "$ETCDCTL" --endpoints "$fep" endpoint hashkv >/dev/null 2>&1
  h1=$(date +%s.%N)
  cleanup
  local restore=("$KVCTL_BIN")
  [[ $sys == etcd ]] && restore=("$ETCDCTL")
  local r0 r1
  r0=$(date +%s.%N)
  /usr/bin/time -f '%M' -o "$dir/restore_rss" "${restore[@]}" snapshot restore "$dir/backup.db" \
    --name m0 --initial-cluster m0=http://127.0.0.1:2380 \
    --initial-advertise-peer-urls http://127.0.0.1:2380 --data-dir "$dir/restored" >/dev/null 2>&1
  r1=$(date +%s.%N)
  local p99
  p99=$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d.get("p99_ms", d.get("latency_ms", {}).get("p99", "?")))' "$dir/during.json" 2>/dev/null || echo "?")
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$sys" "$round" "$(secs "$t0" "$t1")" \
    "$(($(stat -c %s "$dir/backup.db") / 1048576))" "$rss0" "$(cat "$dir/save_rss")" "$p99" \
    "$(secs "$r0" "$r1")/$(($(cat "$dir/restore_rss") / 1024))" "$(secs "$h0" "$h1")"
  rm -rf "$dir"/*.data "$dir/restored" "$dir/backup.db"
}

printf 'system\tround\tsave_s\tfile_MiB\tfollower_rss_MiB\tpeak_rss_during_save_MiB\tconcurrent_put_p99\trestore_s/peak_MiB\thashkv_s\n'
for round in $(seq 1 "$ROUNDS"); do
  for sys in etcd kvd; do
    one "$sys" "$round"
  done
done
