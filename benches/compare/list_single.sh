#!/usr/bin/env bash
# One member of each system, N puts of 1 KiB over N keys (64 clients), then a full paginated
# listing three times (pages of 500 pinned to the first page's revision, as an API server
# lists: `kvbench list`), and the member's RSS. A quick check; benches/compare/scale.sh is the
# 3-member run. Then single pages of 500, one client, PAGES requests each (p50/p99 in ms):
#   first  the first page of the whole key space (its count covers all N keys, as the first
#          page of every listing and of `kubectl get --chunk-size=500`)
#   last   the page that starts 500 keys before the end of the key space
# while a writer puts WRITE_RATE values a second over the same keys (so that each page reads
# at a new revision, as on a live cluster: an idle one would let kvd reuse a remembered
# count), and the same pages with no writer ("idle").
# ORDER=sequential (the default) writes each key once in key order; ORDER=random writes random
# keys (about 63% of the key space ends up live, each key's value at a random place in the
# history, as after an API server's churn), so the last page then holds about 315 keys.
# Usage: SYSTEMS="etcd=etcd kvd=target/release/kvd" benches/compare/list_single.sh
# Env:   N (200000) PAGES (1000) WRITE_RATE (200) KVBENCH_BIN (target/release/kvbench)
#        ORDER (sequential|random)
#        PORT (45379; system k uses PORT+1000k)
set -u
N=${N:-200000}
PAGES=${PAGES:-1000}
WRITE_RATE=${WRITE_RATE:-200}
B=${KVBENCH_BIN:-target/release/kvbench}
SYSTEMS=${SYSTEMS:-"etcd=etcd kvd=target/release/kvd"}
PORT=${PORT:-45379}
case ${ORDER:-sequential} in
  sequential) ORDER_FLAG=--sequential-keys ;;
  random) ORDER_FLAG= ;;
  *) echo "ORDER must be sequential or random" >&2; exit 2 ;;
esac
run() {
  local name=$1 port=$2; shift 2
  local d=/tmp/lb-$name; rm -rf $d; mkdir -p $d
  "$@" --name $name --data-dir $d/data --listen-client-urls http://127.0.0.1:$port --advertise-client-urls http://127.0.0.1:$port --listen-peer-urls http://127.0.0.1:$((port+1)) --initial-advertise-peer-urls http://127.0.0.1:$((port+1)) --initial-cluster $name=http://127.0.0.1:$((port+1)) >$d/log 2>&1 &
  local pid=$!
  sleep 3
  $B put --endpoints 127.0.0.1:$port --clients 64 --conns 16 --key-size 16 --val-size 1024 --key-space-size $N $ORDER_FLAG --total $N --json > $d/put.json
  for i in 1 2 3; do
    echo "$name list $i: $($B list --endpoints 127.0.0.1:$port --page 500 2>&1 | tail -1)"
  done
  # kvbench's keys are 16 bytes: N in big-endian at the end, zeros before.
  local last
  last=$(printf '%032x' $((N - 500)))
  local w writer
  for w in writes idle; do
    writer=
    if [[ $w == writes ]]; then
      $B put --endpoints 127.0.0.1:$port --key-size 16 --val-size 1024 --key-space-size $N \
        --rate "$WRITE_RATE" --total 100000000 >/dev/null 2>&1 &
      writer=$!
    fi
    for page in "first 00 01" "last $last 01"; do
      set -- $page
      echo "$name page $1 ($w): $($B range --hex "$2" "$3" --limit 500 --endpoints 127.0.0.1:$port \
        --clients 1 --conns 1 --total "$PAGES" --json |
        python3 -c 'import json,sys; l=json.load(sys.stdin)["latency_ms"]; print("p50 %.2f p99 %.2f ms" % (l["p50"], l["p99"]))')"
    done
    [[ -n $writer ]] && kill "$writer" && wait "$writer" 2>/dev/null
  done
  echo "$name rss_kb $(awk '/VmRSS/{print $2}' /proc/$pid/status)"
  kill $pid; wait $pid 2>/dev/null; rm -rf $d
}
k=0
for s in $SYSTEMS; do
  run "${s%%=*}" $((PORT + 1000 * k)) "${s#*=}"
  k=$((k + 1))
done
