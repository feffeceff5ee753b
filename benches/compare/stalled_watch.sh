#!/usr/bin/env bash
# RSS of a single kvd member while 300 values of 1 MB are written, with a watcher on every key
# whose client has stopped reading (etcdctl, SIGSTOPped), or without one.
# usage: benches/compare/stalled_watch.sh KVD_BIN KVBENCH_BIN watch|none
set -u
BIN=$1; BENCH=$2; MODE=$3; DIR=$(mktemp -d /tmp/stalled_watch.XXXX)
"$BIN" --data-dir "$DIR/d" --listen-client-urls http://127.0.0.1:42379 --advertise-client-urls http://127.0.0.1:42379 \
  --listen-peer-urls http://127.0.0.1:42380 --initial-advertise-peer-urls http://127.0.0.1:42380 \
  --initial-cluster default=http://127.0.0.1:42380 > "$DIR/log" 2>&1 &
KP=$!; sleep 3
rss() { awk '/VmRSS/{print int($2/1024)}' "/proc/$KP/status"; }
if [ "$MODE" = watch ]; then
  ETCDCTL_API=3 etcdctl --endpoints 127.0.0.1:42379 watch --prefix '' > /dev/null 2>&1 &
  WP=$!; sleep 1; kill -STOP $WP
fi
R0=$(rss)
"$BENCH" put --endpoints 127.0.0.1:42379 --val-size 1000000 --total 300 --clients 4 \
  --key-space-size 300 --sequential-keys --json > "$DIR/bench.json" 2>/dev/null
sleep 2; R1=$(rss)
echo "$MODE $(basename "$BIN"): RSS ${R0} MiB -> ${R1} MiB"
if [ "$MODE" = watch ]; then kill -CONT $WP; kill $WP; fi
kill $KP; wait $KP 2>/dev/null; rm -rf "$DIR"
