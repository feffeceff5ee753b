#!/usr/bin/env bash
# One member of each system, N sequential keys of 1 KiB (64 clients), then a full paginated
# listing three times (pages of 500 pinned to the first page's revision, as an API server
# lists: `kvbench list`), and the member's RSS. A quick check; benches/compare/scale.sh is the
# 3-member run.
# Usage: SYSTEMS="etcd=etcd kvd=target/release/kvd" benches/compare/list_single.sh
# Env:   N (200000) KVBENCH_BIN (target/release/kvbench) PORT (45379; system k uses PORT+1000k)
set -u
N=${N:-200000}
B=${KVBENCH_BIN:-target/release/kvbench}
SYSTEMS=${SYSTEMS:-"etcd=etcd kvd=target/release/kvd"}
PORT=${PORT:-45379}
run() {
  local name=$1 port=$2; shift 2
  local d=/tmp/lb-$name; rm -rf $d; mkdir -p $d
  "$@" --name $name --data-dir $d/data --listen-client-urls http://127.0.0.1:$port --advertise-client-urls http://127.0.0.1:$port --listen-peer-urls http://127.0.0.1:$((port+1)) --initial-advertise-peer-urls http://127.0.0.1:$((port+1)) --initial-cluster $name=http://127.0.0.1:$((port+1)) >$d/log 2>&1 &
  local pid=$!
  sleep 3
  $B put --endpoints 127.0.0.1:$port --clients 64 --conns 16 --key-size 16 --val-size 1024 --key-space-size $N --sequential-keys --total $N --json > $d/put.json
  for i in 1 2 3; do
    echo "$name list $i: $($B list --endpoints 127.0.0.1:$port --page 500 2>&1 | tail -1)"
  done
  echo "$name rss_kb $(awk '/VmRSS/{print $2}' /proc/$pid/status)"
  kill $pid; wait $pid 2>/dev/null; rm -rf $d
}
k=0
for s in $SYSTEMS; do
  run "${s%%=*}" $((PORT + 1000 * k)) "${s#*=}"
  k=$((k + 1))
done
