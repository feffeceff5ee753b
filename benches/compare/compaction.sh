#!/usr/bin/env bash
# Compaction stall, side by side: fill a fresh 3-member cluster with PUTS puts over KEYS keys
# (64 clients), then compact at the current revision while one client keeps putting. Reports
# how long the Compact call took, the concurrent puts' p99 and max latency (all of them, and
# those that started while the call ran), and the leader changes it caused. kvd and etcd 3.4
# in turn, each on a fresh cluster, ROUNDS times.
#
# Usage: benches/compare/compaction.sh [out-dir]
# Env:   ROUNDS (1) PUTS (200000) KEYS (50000) VAL (256, value bytes) COMPACT (1; 0 = the same
#        run without the Compact call, the baseline the latencies compare with) PHYSICAL=1
#        (`compact --physical`: the call returns once the history is deleted)
#        DURING_PUTS (3000) DURING_RATE (0 = unlimited): the 1-client writer started 2 s before
#        the call; with PHYSICAL=1 give it a rate and enough puts to outlast the call (e.g.
#        200 and 6000), so that "p99 while the call ran" counts puts
#        SYSTEMS ("etcd kvd"; NAME=BIN runs a kvd build under its own name, for A/B runs:
#        "etcd kvdbase=/tmp/kvd-base kvd=target/release/kvd") KVD_BIN KVBENCH_BIN
#        (default: $CARGO_TARGET_DIR or target, release/) ETCD_BIN (etcd) ETCDCTL (etcdctl)
#        SKIP_BUILD=1
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
. "$ROOT/benches/compare/cluster.sh"
ROUNDS=${ROUNDS:-1}
PUTS=${PUTS:-200000}
KEYS=${KEYS:-50000}
VAL=${VAL:-256}
DURING_PUTS=${DURING_PUTS:-3000}
DURING_RATE=${DURING_RATE:-0}
SYSTEMS=${SYSTEMS:-etcd kvd}
PHYSICAL_FLAG=()
[[ ${PHYSICAL:-} == 1 ]] && PHYSICAL_FLAG=(--physical)
OUT=${1:-$(mktemp -d /tmp/compaction.XXXXXX)}
mkdir -p "$OUT"

for b in "$ETCD_BIN" "$ETCDCTL"; do
  command -v "$b" >/dev/null || { echo "$b not found (apt-get install -y etcd-server etcd-client)" >&2; exit 1; }
done
if [[ -z ${SKIP_BUILD:-} ]]; then
  (cd "$ROOT" && cargo build --release --bin kvd --bin kvbench)
fi
trap cleanup EXIT

leader_changes() {
  local i s=0
  for i in 0 1 2; do s=$((s + $(metric "${METRICS[$1,$i]}" etcd_server_leader_changes_seen_total))); done
  echo "$s"
}

one() {
  local sys=${1%%=*} round=$2
  [[ $1 == *=* ]] && KVD_BIN=${1#*=}
  local dir="$OUT/r$round-$sys"
  fresh_cluster "$sys" "$dir" 26790 30790
  local ep=$EP
  local k=(--key-size 8 --val-size "$VAL" --key-space-size "$KEYS")
  "$KVBENCH_BIN" --endpoints "$ep" --json put "${k[@]}" --clients 64 --conns 16 --total "$PUTS" >/dev/null
  local rev
  rev=$(ETCDCTL_API=3 "$ETCDCTL" --endpoints "$ep" get x -w json |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["header"]["revision"])')
  local lc0; lc0=$(leader_changes "$sys")
  local tw=$EPOCHREALTIME
  "$KVBENCH_BIN" --endpoints "$ep" --json put "${k[@]}" --clients 1 --conns 1 \
    --total "$DURING_PUTS" --rate "$DURING_RATE" --latency-log "$dir/during.lat" \
    >"$dir/during.json" &
  local kb=$!
  sleep 2
  local t0=$EPOCHREALTIME
  if [ "${COMPACT:-1}" != 0 ]; then
    ETCDCTL_API=3 "$ETCDCTL" --endpoints "$ep" --command-timeout=300s compact "${PHYSICAL_FLAG[@]}" "$rev" >/dev/null
  fi
  local t1=$EPOCHREALTIME
  wait "$kb"
  local lc1; lc1=$(leader_changes "$sys")
  python3 - "$dir/during.json" "$sys" "$round" "$t0" "$t1" "$((lc1 - lc0))" "$tw" "$dir/during.lat" \
    >>"$OUT/compaction.tsv" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
s, r, t0, t1, lc, tw, lat = sys.argv[2:9]
# The writer's puts that started while the Compact call ran (its log: start and latency in
# microseconds since the writer began, which is within milliseconds of tw).
lo, hi = (float(t0) - float(tw)) * 1e6, (float(t1) - float(tw)) * 1e6
during = sorted(int(l.split()[1]) / 1000 for l in open(lat) if lo <= int(l.split()[0]) <= hi)
p99 = round(during[min(len(during) - 1, int(len(during) * 0.99))], 3) if during else "-"
mx = round(during[-1], 3) if during else "-"
print("\t".join(map(str, [s, r, round(float(t1) - float(t0), 3), j["latency_ms"]["p99"],
                          j["latency_ms"]["max"], p99, mx, len(during), j["errors"], lc])))
PY
  echo "  $(tail -1 "$OUT/compaction.tsv")" >&2
  cleanup
  rm -rf "$dir"/*.data
}

echo "output: $OUT" >&2
: >"$OUT/compaction.tsv"
for r in $(seq 1 "$ROUNDS"); do
  for sys in $SYSTEMS; do one "$sys" "$r"; done
done
echo "| system | round | compact call (s) | 1-client put p99 (ms) | max (ms) | p99 while the call ran (ms) | max | puts while it ran | errors | leader changes (sum over members) |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
awk -F'\t' '{ printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5, $6, $7, $8, $9, $10 }' "$OUT/compaction.tsv"
