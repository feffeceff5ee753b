#!/usr/bin/env bash
# Many-watchers benchmark: on ONE member of a 3-member cluster, put throughput at
# 64 clients with no watchers, then with WATCHERS watchers (plus one stalled stream whose
# client never reads) on the keys being written; the watchers' event latency; and the
# member's RSS before/after opening the watches. Runs kvd and etcd 3.4 side by side,
# alternating which goes first each round, with a fresh cluster per system per round (so
# each round's RSS delta starts from a fresh process); the table reports medians.
#
# Usage: benches/compare/watch_bench.sh [out-dir]
# Env:   ROUNDS (3) WATCHERS (10000) STREAMS (100) WCONNS (10, watch connections)
#        PUTS (20000) CLIENTS (64) PCONNS (16, put connections) KEYSPACE (1000: each put
#        is seen by WATCHERS/KEYSPACE watchers) STALLED (1) WARMUP (10000 puts) SYSTEMS ("etcd kvd")
#        KVD_BIN KVBENCH_BIN (default: $CARGO_TARGET_DIR or target, release/)
#        ETCD_BIN (etcd)  SKIP_BUILD=1 to use existing binaries
set -euo pipefail
trap 'echo "$0: failed at line $LINENO" >&2' ERR

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
. "$ROOT/benches/compare/cluster.sh"
ROUNDS=${ROUNDS:-3}
WATCHERS=${WATCHERS:-10000}
STREAMS=${STREAMS:-100}
WCONNS=${WCONNS:-10}
PUTS=${PUTS:-20000}
CLIENTS=${CLIENTS:-64}
PCONNS=${PCONNS:-16}
KEYSPACE=${KEYSPACE:-1000}
STALLED=${STALLED:-1}
WARMUP=${WARMUP:-10000}
SYSTEMS=(${SYSTEMS:-etcd kvd})
OUT=${1:-$(mktemp -d /tmp/watch_bench.XXXXXX)}
mkdir -p "$OUT"

if [[ " ${SYSTEMS[*]} " == *" etcd "* ]]; then
  command -v "$ETCD_BIN" >/dev/null || { echo "etcd not found (apt-get install -y etcd-server)" >&2; exit 1; }
fi
if [[ -z ${SKIP_BUILD:-} ]]; then
  (cd "$ROOT" && cargo build --release --bin kvd --bin kvbench)
fi

trap cleanup EXIT

KEYS=(--key-size 8 --val-size 256 --key-space-size "$KEYSPACE")
# one SYSTEM ROUND: fresh cluster, warm-up, then the measured run on the leader: RSS, open the
# watches, RSS, puts with watchers, close the watches, the same puts without (kvbench --baseline).
one() {
  local sys=$1 round=$2
  local dir="$OUT/r$round-$sys"
  fresh_cluster "$sys" "$dir" 24790 28790
  local l=$LEADER ep=$EP
  "$KVBENCH_BIN" --endpoints "$ep" --json put "${KEYS[@]}" --clients "$CLIENTS" \
    --conns "$PCONNS" --total "$WARMUP" >/dev/null
  echo "  $sys r$round: load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
  "$KVBENCH_BIN" --endpoints "$ep" --json --clients "$CLIENTS" --conns "$WCONNS" --timeout 30 \
    watch-latency "${KEYS[@]}" --watchers "$WATCHERS" --streams "$STREAMS" \
    --stalled-watchers "$STALLED" --baseline --put-total "$PUTS" --put-rate 0 \
    --put-conns "$PCONNS" --rss-pid "${MPID[$sys,$l]}" >"$dir/result.json" \
    || echo "  $sys r$round: kvbench failed (see $dir/result.json)" >&2
  python3 - "$dir/result.json" "$sys" "$round" >>"$OUT/raw.tsv" <<'PY'
import json, sys
try:
    j = json.load(open(sys.argv[1]))
except Exception:
    sys.exit(0)
w = j["watch"]["latency_ms"]
print("\t".join(map(str, [sys.argv[2], sys.argv[3], round(j["baseline_put"]["qps"], 1),
    round(j["put"]["qps"], 1), round(j["put_qps_ratio"], 3), w["p50"], w["p99"], w["max"],
    j["rss_before_bytes"], j["rss_after_bytes"], round(j["rss_bytes_per_watch"]),
    j["events_received"], j["events_expected"]])))
PY
  tail -1 "$OUT/raw.tsv" | sed 's/^/  /' >&2
  cleanup
  rm -rf "$dir"/*.data
}

echo "output: $OUT" >&2
: >"$OUT/raw.tsv"
for r in $(seq 1 "$ROUNDS"); do
  order=("${SYSTEMS[@]}")
  if (( r % 2 == 0 )); then order=($(printf '%s\n' "${SYSTEMS[@]}" | tac)); fi
  for sys in "${order[@]}"; do
    echo "round $r: $sys" >&2
    one "$sys" "$r"
  done
done

python3 - "$OUT" "$WATCHERS" "$STALLED" "$KEYSPACE" "$CLIENTS" "$PUTS" "$ROUNDS" <<'PY' | tee "$OUT/table.md"
import statistics, sys, collections
out, watchers, stalled, keyspace, clients, puts, rounds = sys.argv[1:8]
rows = collections.defaultdict(list)
for line in open(f"{out}/raw.tsv"):
    f = line.rstrip("\n").split("\t")
    rows[f[0]].append([float(x) for x in f[2:]])
med = lambda xs: statistics.median(xs)
print(f"Put at {clients} clients ({puts} puts, 8-byte keys over {keyspace} keys, 256-byte values) "
      f"on one member, without watchers and with {watchers} watchers on those keys + {stalled} "
      f"stalled stream; medians of {rounds} rounds.\n")
print("| system | put qps, no watchers | put qps, with watchers | ratio | event latency p50 / p99 / max (ms) "
      "| RSS before / after (MiB) | bytes per watch | events received / expected |")
print("|---|---|---|---|---|---|---|---|")
for sysname in sorted(rows):
    r = list(zip(*rows[sysname]))
    c = [med(x) for x in r]
    ok = all(a == b for a, b in zip(r[9], r[10]))
    print(f"| {sysname} | {c[0]:.0f} | {c[1]:.0f} | {c[2]:.3f} | {c[3]:.1f} / {c[4]:.1f} / {c[5]:.1f} "
          f"| {c[6] / 2**20:.0f} / {c[7] / 2**20:.0f} | {c[8]:.0f} | "
          f"{'all' if ok else 'MISSING'} ({c[9]:.0f} / {c[10]:.0f}) |")
PY
