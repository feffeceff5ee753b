#!/usr/bin/env bash
# Memory and scale, side by side: for each size N in SIZES, a fresh 3-member
# cluster of etcd and of kvd in turn gets N puts of VAL-byte values over N random keys of
# 16 bytes (64 clients; about 0.63 N distinct keys, as in docs/benchmarks.md's memory tables). Then, per system:
#   load_qps       the load's throughput
#   rss_load       each member's RSS (MiB) SETTLE seconds after the load
#   disk           each member's data dir (MiB)
#   list_s         a full paginated listing (pages of 500, pinned to the first page's
#                  revision, as Kubernetes' API server lists), `kvbench list`
#   rss_serve      each member's peak RSS while 64 clients put SERVE_PUTS more values
#   restart_s      all members stopped (SIGTERM) and started again, until a linearizable get
#                  succeeds
#   rss_restart    each member's RSS SETTLE seconds after the restart
# One line per system and size in OUT/scale.tsv and a Markdown table on stdout (kvd/etcd
# ratios). Each member's /proc smaps_rollup after the load is kept in OUT for breakdowns.
#
# Usage: benches/compare/scale.sh [out-dir]
# Plot:  benches/compare/scale_plot.py OUT.svg out-dir/scale.tsv [more scale.tsv ...]
# Env:   SIZES ("100000 300000") VAL (1024) SERVE_PUTS (30000) SETTLE (10) SYSTEMS ("etcd kvd")
#        ETCD_PORT (28100) KVD_PORT (28500): each cluster's first port (it uses 23 from there)
#        KVD_ARGS (extra kvd flags) KVD_BIN KVBENCH_BIN (default: $CARGO_TARGET_DIR or target,
#        release/) ETCD_BIN (etcd) ETCDCTL (etcdctl) SKIP_BUILD=1 KEEP=1 (keep data dirs)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
. "$ROOT/benches/compare/cluster.sh"
SIZES=${SIZES:-100000 300000}
VAL=${VAL:-1024}
SERVE_PUTS=${SERVE_PUTS:-30000}
SETTLE=${SETTLE:-10}
ETCD_PORT=${ETCD_PORT:-28100}
KVD_PORT=${KVD_PORT:-28500}
SYSTEMS=${SYSTEMS:-etcd kvd}
OUT=${1:-$(mktemp -d /tmp/scale.XXXXXX)}
mkdir -p "$OUT"
export ETCDCTL_API=3

command -v "$ETCD_BIN" >/dev/null || { echo "etcd not found (apt-get install -y etcd-server etcd-client)" >&2; exit 1; }
if [[ -z ${SKIP_BUILD:-} ]]; then
  (cd "$ROOT" && cargo build --release --bin kvd --bin kvbench)
fi
trap cleanup EXIT

# kvd's extra flags go through start_cluster's per-system arguments.
if [[ -n ${KVD_ARGS:-} ]]; then
  real_kvd=$KVD_BIN
  KVD_BIN=$OUT/kvd-with-args
  printf '#!/bin/sh\nexec %q %s "$@"\n' "$real_kvd" "$KVD_ARGS" >"$KVD_BIN"
  chmod +x "$KVD_BIN"
fi

rss_kib() { awk '/^VmRSS/ { print $2 }' "/proc/$1/status"; }
# rss_all SYSTEM: the three members' RSS in MiB, comma-separated.
rss_all() {
  local i out=""
  for i in 0 1 2; do out+="${out:+,}$(($(rss_kib "${MPID[$1,$i]}") / 1024))"; done
  echo "$out"
}

# peak_rss_members SYSTEM: samples the members' RSS every 100 ms until $OUT/stop exists; prints the
# peaks in MiB, comma-separated.
peak_rss_members() {
  local sys=$1 i r
  local -a peak=(0 0 0)
  while [[ ! -e $OUT/stop ]]; do
    for i in 0 1 2; do
      r=$(rss_kib "${MPID[$sys,$i]}" 2>/dev/null || echo 0)
      ((r > peak[i])) && peak[i]=$r
    done
    sleep 0.1
  done
  echo "$((peak[0] / 1024)),$((peak[1] / 1024)),$((peak[2] / 1024))"
}

# linearizable_get SYSTEM: retries a linearizable get on every member until one succeeds.
linearizable_get() {
  local sys=$1 t eps="${CLIENT[$sys,0]},${CLIENT[$sys,1]},${CLIENT[$sys,2]}"
  for t in $(seq 1 600); do
    "$ETCDCTL" --endpoints "$eps" --command-timeout=1s get probe >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "$sys: no linearizable read 60 s after the restart; logs in $OUT" >&2
  exit 1
}

one() {
  local sys=$1 n=$2 dir="$OUT/$sys-$n" i
  echo "$sys $n: load" >&2
  fresh_cluster "$sys" "$dir" "$ETCD_PORT" "$KVD_PORT"
  "$KVBENCH_BIN" --endpoints "$EP" --json put --key-size 16 --val-size "$VAL" \
    --key-space-size "$n" --clients 64 --conns 16 --total "$n" >"$dir/load.json"
  sleep "$SETTLE"
  local rss_load; rss_load=$(rss_all "$sys")
  for i in 0 1 2; do cat "/proc/${MPID[$sys,$i]}/smaps_rollup" >"$dir/m$i.smaps_rollup"; done
  local disk="" ; for i in 0 1 2; do disk+="${disk:+,}$(du -sm "$dir/$sys-m$i.data" | cut -f1)"; done
  echo "$sys $n: list" >&2
  "$KVBENCH_BIN" --endpoints "$EP" --json list --page 500 >"$dir/list.json"
  echo "$sys $n: serve" >&2
  rm -f "$OUT/stop"
  peak_rss_members "$sys" >"$dir/serve_rss" &
  local pr=$!
  "$KVBENCH_BIN" --endpoints "$EP" --json put --key-size 16 --val-size "$VAL" \
    --key-space-size "$n" --clients 64 --conns 16 --total "$SERVE_PUTS" >"$dir/serve.json"
  touch "$OUT/stop"
  wait "$pr"
  echo "$sys $n: restart" >&2
  cleanup
  local t0 t1 bin=$KVD_BIN base=$KVD_PORT
  [[ $sys == etcd ]] && bin=$ETCD_BIN base=$ETCD_PORT
  t0=$(date +%s.%N)
  start_cluster "$sys" "$bin" "$base" "$dir"
  linearizable_get "$sys"
  t1=$(date +%s.%N)
  sleep "$SETTLE"
  local rss_restart; rss_restart=$(rss_all "$sys")
  cleanup
  python3 - "$dir" "$sys" "$n" "$rss_load" "$disk" "$(cat "$dir/serve_rss")" "$(secs "$t0" "$t1")" \
    "$rss_restart" >>"$OUT/scale.tsv" <<'PY'
import json, sys
d, sysname, n, rss_load, disk, rss_serve, restart, rss_restart = sys.argv[1:9]
load = json.load(open(f"{d}/load.json"))
lst = json.load(open(f"{d}/list.json"))
serve = json.load(open(f"{d}/serve.json"))
print("\t".join(map(str, [sysname, n, round(load["qps"]), rss_load, disk, lst["keys"],
                          round(lst["seconds"], 2), rss_serve, round(serve["qps"]), restart,
                          rss_restart])))
PY
  echo "  $(tail -1 "$OUT/scale.tsv")" >&2
  [[ -n ${KEEP:-} ]] || rm -rf "$dir"/*.data
}

echo "output: $OUT" >&2
: >"$OUT/scale.tsv"
for n in $SIZES; do
  for sys in $SYSTEMS; do
    one "$sys" "$n"
  done
done
python3 "$ROOT/benches/compare/scale_table.py" "$OUT/scale.tsv"
