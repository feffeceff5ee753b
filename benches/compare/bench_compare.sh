#!/usr/bin/env bash
# Side-by-side benchmark: a 3-member etcd cluster and a 3-member kvd cluster on loopback,
# both driven by kvbench with identical settings. The systems alternate within each round
# (etcd then kvd, or the reverse on odd rounds) so drift on a shared machine hits both;
# the table reports medians over the rounds.
#
# Usage: benches/compare/bench_compare.sh [out-dir]
# Env:   ROUNDS (3) TOTAL (10000) TOTAL_SEQ (1000, for the 1-client put) CONNS (16)
#        KVD_BIN KVBENCH_BIN (default: $CARGO_TARGET_DIR or target, release/)
#        ETCD_BIN (etcd)  SKIP_BUILD=1 to use existing binaries
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
. "$ROOT/benches/compare/cluster.sh"
ROUNDS=${ROUNDS:-3}
TOTAL=${TOTAL:-10000}
TOTAL_SEQ=${TOTAL_SEQ:-1000}
CONNS=${CONNS:-16}
OUT=${1:-$(mktemp -d /tmp/bench_compare.XXXXXX)}
mkdir -p "$OUT"
RAW=$OUT/raw.tsv

command -v "$ETCD_BIN" >/dev/null || { echo "etcd not found (apt-get install -y etcd-server etcd-client)" >&2; exit 1; }
if [[ -z ${SKIP_BUILD:-} ]]; then
  (cd "$ROOT" && cargo build --release --bin kvd --bin kvbench)
fi

trap cleanup EXIT

# rss_mib_tenths PID: VmRSS in MiB, to a tenth.
rss_mib_tenths() { awk '/^VmRSS/ { printf "%.1f", $2 / 1024 }' "/proc/$1/status"; }

# cpu_ticks SYSTEM: user + system CPU time of the three members, in clock ticks.
cpu_ticks() {
  local i t=0
  for i in 0 1 2; do
    t=$((t + $(awk '{ print $14 + $15 }' "/proc/${MPID[$1,$i]}/stat")))
  done
  echo "$t"
}

# bench SYSTEM ROUND TEST kvbench-args...: one kvbench run, one raw line.
bench() {
  local sys=$1 round=$2 test=$3; shift 3
  local l; l=$(leader_now "$sys")
  local ep=${CLIENT[$sys,$l]} mu=${METRICS[$sys,$l]}
  local f0; f0=$(metric "$mu" etcd_disk_wal_fsync_duration_seconds_count)
  local c0; c0=$(cpu_ticks "$sys")
  local j="$OUT/$sys-r$round-$test.json"
  "$KVBENCH_BIN" --endpoints "$ep" --json "$@" >"$j"
  local c1; c1=$(cpu_ticks "$sys")
  local f1; f1=$(metric "$mu" etcd_disk_wal_fsync_duration_seconds_count)
  python3 - "$j" "$sys" "$round" "$test" "$f0" "$f1" "$((c1 - c0))" "$(getconf CLK_TCK)" >>"$RAW" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
sysname, rnd, test, f0, f1, ticks, hz = sys.argv[2:9]
fpw = (float(f1) - float(f0)) / j["ok"] if j["ok"] else 0.0
cpu_us = int(ticks) / int(hz) * 1e6 / j["ok"] if j["ok"] else 0.0
print("\t".join(map(str, [sysname, rnd, test, round(j["qps"], 1), j["latency_ms"]["p50"],
                          j["latency_ms"]["p99"], j["errors"], round(fpw, 3), round(cpu_us)])))
PY
  echo "  $sys r$round $test: $(tail -1 "$RAW" | cut -f4-9)" >&2
}

KEYS=(--key-size 8 --val-size 256 --key-space-size 100000)
run_suite() {
  local sys=$1 round=$2
  bench "$sys" "$round" put-1 put "${KEYS[@]}" --clients 1 --conns 1 --total "$TOTAL_SEQ"
  bench "$sys" "$round" put-64 put "${KEYS[@]}" --clients 64 --conns "$CONNS" --total "$TOTAL"
  bench "$sys" "$round" put-256 put "${KEYS[@]}" --clients 256 --conns "$CONNS" --total "$TOTAL"
  bench "$sys" "$round" range-l-64 range rangekey --consistency l --clients 64 --conns "$CONNS" --total "$TOTAL"
  bench "$sys" "$round" range-s-64 range rangekey --consistency s --clients 64 --conns "$CONNS" --total "$TOTAL"
  local i
  for i in 0 1 2; do
    printf '%s\t%s\trss-m%s\t%s\n' "$sys" "$round" "$i" "$(rss_mib_tenths "${MPID[$sys,$i]}")" >>"$OUT/rss.tsv"
  done
}

echo "output: $OUT" >&2
: >"$RAW"; : >"$OUT/rss.tsv"
start_cluster etcd "$ETCD_BIN" 23790 "$OUT"
start_cluster kvd "$KVD_BIN" 27790 "$OUT"
wait_leader etcd
wait_leader kvd

echo "warm-up" >&2
for sys in etcd kvd; do
  l=$(leader_now $sys)
  # The range key: 8 bytes with a 256-byte value, like the put tests' keys.
  ETCDCTL_API=3 etcdctl --endpoints "${CLIENT[$sys,$l]}" put rangekey "$(printf 'v%.0s' $(seq 256))" >/dev/null
  "$KVBENCH_BIN" --endpoints "${CLIENT[$sys,$l]}" --json put "${KEYS[@]}" --clients 64 \
    --conns "$CONNS" --total 2000 >/dev/null
  "$KVBENCH_BIN" --endpoints "${CLIENT[$sys,$l]}" --json range rangekey --clients 64 \
    --conns "$CONNS" --total 2000 >/dev/null
done
for r in $(seq 1 "$ROUNDS"); do
  if (( r % 2 )); then order=(etcd kvd); else order=(kvd etcd); fi
  for sys in "${order[@]}"; do
    echo "round $r: $sys" >&2
    run_suite "$sys" "$r"
  done
done

"$KVBENCH_BIN" fsync --dir "$OUT" --count 500 --json >"$OUT/fsync.json"
python3 "$ROOT/benches/compare/bench_table.py" "$OUT"
