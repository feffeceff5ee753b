#!/usr/bin/env bash
# Puts at several concurrencies against several 3-member clusters side by side: etcd against
# kvd, or one kvd build against another (an A/B of a change). The clusters run for the whole
# comparison; each round runs every system once, in an order that rotates from round to round,
# so drift on a shared machine hits every system alike. The table reports medians over rounds.
#
# Usage: benches/compare/bench_puts.sh [out-dir]
# Env:   SYSTEMS  space-separated NAME=BINARY pairs (default "etcd=etcd kvd=$KVD_BIN"); the
#                 name "etcd" gets etcd's quiet logging flags (cluster.sh)
#        CLIENTS  concurrencies (default "1 64 256 1024"); 1 client uses 1 connection
#        ROUNDS (2) TOTAL (40000) TOTAL_SEQ (2000, for 1 client) CONNS (16)
#        PORT     first port (31000); system k uses PORT + 100*k .. + 22
#        TARGET   leader (default), follower, or all: the member the load tool talks to (a
#                 follower forwards each put to the leader and answers once it has applied it);
#                 all lists the three members in order, and the load tool spreads its
#                 connections over them as etcd clients and API servers given every member do
#                 (1 client: the first member, leader or not)
#        VAL (256) value bytes; KEYSPACE (100000) keys, 8 bytes each
#        KVBENCH_BIN (default: $CARGO_TARGET_DIR or target, release/)
# Output: raw.tsv (system, round, test, qps, p50, p99, errors, leader fsyncs per put, CPU us of
#         the three members per put, bytes a member sent to its disk per put, WAL and engine:
#         /proc/PID/io write_bytes of the three, read 1 s after the run so that the engine's
#         background flush (sled's every 500 ms, bbolt's every 100 ms) is counted, divided by
#         3) and the medians table on stdout; for 1 client, each run's
#         latency log (SYS-rROUND-put-1.lat: start and latency in us per put) and the share of
#         puts over 1, 2, 3 and 5 ms per system, all rounds pooled (where the tail starts).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
. "$ROOT/benches/compare/cluster.sh"
SYSTEMS=${SYSTEMS:-"etcd=$ETCD_BIN kvd=$KVD_BIN"}
CLIENTS=${CLIENTS:-"1 64 256 1024"}
ROUNDS=${ROUNDS:-2}
TOTAL=${TOTAL:-40000}
TOTAL_SEQ=${TOTAL_SEQ:-2000}
CONNS=${CONNS:-16}
PORT=${PORT:-31000}
TARGET=${TARGET:-leader}
OUT=${1:-$(mktemp -d /tmp/bench_puts.XXXXXX)}
mkdir -p "$OUT"
RAW=$OUT/raw.tsv
trap cleanup EXIT

# sum_members SYS FILE PROGRAM: the sum over SYS's three members of what the awk PROGRAM
# prints for /proc/PID/FILE.
sum_members() {
  local i t=0
  for i in 0 1 2; do
    t=$((t + $(awk "$3" "/proc/${MPID[$1,$i]}/$2")))
  done
  echo "$t"
}
cpu_ticks() { sum_members "$1" stat '{ print $14 + $15 }'; }
written_bytes() { sum_members "$1" io '$1 == "write_bytes:" { print $2 }'; }

KEYS=(--key-size 8 --val-size "${VAL:-256}" --key-space-size "${KEYSPACE:-100000}")
bench() {
  local sys=$1 round=$2 c=$3 n=$TOTAL conns=$CONNS
  ((c == 1)) && n=$TOTAL_SEQ conns=1
  local l; l=$(leader_now "$sys")
  local t=$l
  [[ $TARGET == follower ]] && t=$(((l + 1) % 3))
  local ep=${CLIENT[$sys,$t]} mu=${METRICS[$sys,$l]}
  [[ $TARGET == all ]] && ep="${CLIENT[$sys,0]},${CLIENT[$sys,1]},${CLIENT[$sys,2]}"
  local f0 c0 w0 f1 c1 w1 j="$OUT/$sys-r$round-put-$c.json"
  f0=$(metric "$mu" etcd_disk_wal_fsync_duration_seconds_count)
  c0=$(cpu_ticks "$sys")
  w0=$(written_bytes "$sys")
  local log=()
  ((c == 1)) && log=(--latency-log "$OUT/$sys-r$round-put-1.lat")
  "$KVBENCH_BIN" --endpoints "$ep" --json "${log[@]}" put "${KEYS[@]}" --clients "$c" \
    --conns "$conns" --total "$n" >"$j"
  c1=$(cpu_ticks "$sys")
  f1=$(metric "$mu" etcd_disk_wal_fsync_duration_seconds_count)
  sleep 1
  w1=$(written_bytes "$sys")
  python3 - "$j" "$sys" "$round" "put-$c" "$f0" "$f1" "$((c1 - c0))" "$(getconf CLK_TCK)" \
    "$((w1 - w0))" >>"$RAW" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
name, rnd, test, f0, f1, ticks, hz, written = sys.argv[2:10]
ok = j["ok"]
fpw = (float(f1) - float(f0)) / ok if ok else 0.0
cpu = int(ticks) / int(hz) * 1e6 / ok if ok else 0.0
wpp = int(written) / 3 / ok if ok else 0.0
print("\t".join(map(str, [name, rnd, test, round(j["qps"], 1), j["latency_ms"]["p50"],
                          j["latency_ms"]["p99"], j["errors"], round(fpw, 3), round(cpu),
                          round(wpp)])))
PY
  echo "  $sys r$round put-$c: $(tail -1 "$RAW" | cut -f4-10)  load $(cut -d' ' -f1 /proc/loadavg)" >&2
}

echo "output: $OUT" >&2
: >"$RAW"
names=()
k=0
for s in $SYSTEMS; do
  name=${s%%=*} bin=${s#*=}
  names+=("$name")
  start_cluster "$name" "$bin" $((PORT + 100 * k)) "$OUT"
  k=$((k + 1))
done
for n in "${names[@]}"; do wait_leader "$n"; done
echo "warm-up" >&2
for n in "${names[@]}"; do
  l=$(leader_now "$n")
  "$KVBENCH_BIN" --endpoints "${CLIENT[$n,$l]}" --json put "${KEYS[@]}" --clients 64 \
    --conns "$CONNS" --total 4000 >/dev/null
done
for r in $(seq 1 "$ROUNDS"); do
  # Rotate the order: round r starts with system (r-1) mod count.
  order=("${names[@]:$(((r - 1) % ${#names[@]}))}" "${names[@]:0:$(((r - 1) % ${#names[@]}))}")
  for c in $CLIENTS; do
    for n in "${order[@]}"; do bench "$n" "$r" "$c"; done
  done
done

python3 - "$RAW" "${names[@]}" <<'PY'
import statistics, sys
from collections import defaultdict
raw, names = sys.argv[1], sys.argv[2:]
runs = defaultdict(list)
tests = []
for line in open(raw):
    s, _r, t, qps, p50, p99, err, fpw, cpu, wpp = line.rstrip("\n").split("\t")
    runs[(s, t)].append((float(qps), float(p50), float(p99), int(err), float(fpw), float(cpu),
                         float(wpp)))
    if t not in tests:
        tests.append(t)
base = names[0]
print(f"Medians over rounds; ratios are to {base}.\n")
print("| test | system | puts/s | p50 ms | p99 ms | errors | fsyncs/put | CPU us/put | written B/put/member | puts/s ratio | p99 ratio | CPU ratio | written ratio |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
med = lambda s, t, k: statistics.median(r[k] for r in runs[(s, t)])
for t in tests:
    for s in names:
        q, p50, p99, fpw, cpu, wpp = (med(s, t, k) for k in (0, 1, 2, 4, 5, 6))
        err = sum(r[3] for r in runs[(s, t)])
        rq, r99, rc, rw = (f"{med(s, t, k) / med(base, t, k):.2f}" if med(base, t, k) else "-"
                           for k in (0, 2, 5, 6))
        print(f"| {t} | {s} | {q:.0f} | {p50:.2f} | {p99:.2f} | {err} | {fpw:.3f} | {cpu:.0f} | {wpp:.0f} | {rq} | {r99} | {rc} | {rw} |")
PY

if [[ " $CLIENTS " == *" 1 "* ]]; then
  python3 - "$OUT" "${names[@]}" <<'PY'
import glob, sys
out, names = sys.argv[1], sys.argv[2:]
print("\n1 client, share of puts slower than (all rounds):\n")
print("| system | puts | > 1 ms | > 2 ms | > 3 ms | > 5 ms |")
print("|---|---:|---:|---:|---:|---:|")
for s in names:
    lat = [int(l.split()[1]) for f in sorted(glob.glob(f"{out}/{s}-r*-put-1.lat")) for l in open(f)]
    if lat:
        shares = (f"{100 * sum(x > ms * 1000 for x in lat) / len(lat):.2f}%" for ms in (1, 2, 3, 5))
        print(f"| {s} | {len(lat)} | " + " | ".join(shares) + " |")
PY
fi
