#!/usr/bin/env bash
# Failover side by side: how long a 3-member cluster is without a leader, and without
# writes, after its leader freezes (SIGSTOP, as a stalled VM or a long pause would do it).
# kvd and etcd 3.4 run at the same time with default flags; the systems alternate within
# each round. From the SIGSTOP, the script measures:
#   elected: when a surviving member first reports itself leader (metrics, polled);
#   write:   when a put through a surviving member first succeeds (etcdctl, each attempt
#            with a 300 ms timeout, alternating between the two survivors).
# Then it resumes the old leader (SIGCONT) and waits until the cluster is whole again.
#
# Usage: benches/compare/failover.sh [out-dir]
# Env:   ROUNDS (5) KVD_BIN (default: $CARGO_TARGET_DIR or target, release/kvd)
#        ETCD_BIN (etcd) ETCDCTL (etcdctl) SKIP_BUILD=1 to use an existing kvd
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
. "$ROOT/benches/compare/cluster.sh"
ROUNDS=${ROUNDS:-5}
OUT=${1:-$(mktemp -d /tmp/failover.XXXXXX)}
mkdir -p "$OUT"
RAW=$OUT/failover.tsv

for b in "$ETCD_BIN" "$ETCDCTL"; do
  command -v "$b" >/dev/null || { echo "$b not found (apt-get install -y etcd-server etcd-client)" >&2; exit 1; }
done
if [[ -z ${SKIP_BUILD:-} ]]; then
  (cd "$ROOT" && cargo build --release --bin kvd)
fi

# A stopped member cannot be stopped by SIGTERM: resume everything first.
trap 'for p in "${PIDS[@]}"; do kill -CONT "$p" 2>/dev/null || true; done; cleanup' EXIT

# since T0: seconds from T0 (an $EPOCHREALTIME) to now, to the millisecond.
since() { python3 -c "print(round($EPOCHREALTIME - $1, 3))"; }

put() { ETCDCTL_API=3 "$ETCDCTL" --endpoints "$1" --command-timeout=300ms put failover "$2" >/dev/null 2>&1; }

# one SYSTEM ROUND: freeze the leader, time the election and the first write, resume it.
one() {
  local sys=$1 round=$2 l i
  l=$(leader_now "$sys")
  local survivors=()
  for i in 0 1 2; do [[ $i == "$l" ]] || survivors+=("$i"); done
  put "${CLIENT[$sys,${survivors[0]}]}" "before-$round" || true
  # The two probes run side by side, so a put waiting out its timeout does not delay
  # noticing the election; each writes the seconds since the freeze to its file.
  local el="$OUT/$sys-r$round.elected" wr="$OUT/$sys-r$round.write"
  rm -f "$el" "$wr"
  local t0=$EPOCHREALTIME
  kill -STOP "${MPID[$sys,$l]}"
  (
    while (( ${EPOCHREALTIME%.*} - ${t0%.*} < 30 )); do
      for i in "${survivors[@]}"; do
        if [[ $(metric "${METRICS[$sys,$i]}" etcd_server_is_leader 2>/dev/null) == 1 ]]; then
          since "$t0" >"$el"; exit 0
        fi
      done
      sleep 0.02
    done
  ) &
  local pe=$!
  (
    local n=0
    while (( ${EPOCHREALTIME%.*} - ${t0%.*} < 30 )); do
      if put "${CLIENT[$sys,${survivors[$((n % 2))]}]}" "r$round-$n"; then
        since "$t0" >"$wr"; exit 0
      fi
      n=$((n + 1))
      sleep 0.02
    done
  ) &
  local pw=$!
  wait "$pe" "$pw" || true
  local elected wrote
  elected=$(cat "$el" 2>/dev/null || echo NA)
  wrote=$(cat "$wr" 2>/dev/null || echo NA)
  kill -CONT "${MPID[$sys,$l]}"
  printf '%s\t%s\tm%s\t%s\t%s\n' "$sys" "$round" "$l" "$elected" "$wrote" >>"$RAW"
  echo "  $sys r$round: leader m$l frozen; new leader after $elected s, first write after $wrote s" >&2
  # Let the old leader rejoin as a follower before the next round.
  for i in $(seq 1 100); do
    [[ $(metric "${METRICS[$sys,$l]}" etcd_server_has_leader 2>/dev/null) == 1 ]] && break
    sleep 0.1
  done
  sleep 2
}

echo "output: $OUT" >&2
: >"$RAW"
start_cluster etcd "$ETCD_BIN" 25790 "$OUT"
start_cluster kvd "$KVD_BIN" 29790 "$OUT"
wait_leader etcd
wait_leader kvd
sleep 2
for r in $(seq 1 "$ROUNDS"); do
  if (( r % 2 )); then order=(etcd kvd); else order=(kvd etcd); fi
  for sys in "${order[@]}"; do one "$sys" "$r"; done
done

python3 - "$RAW" <<'PY'
import statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
print("| system | rounds | new leader after, median (min-max) s | first write after, median (min-max) s |")
print("|---|---:|---|---|")
for s in ("kvd", "etcd"):
    r = [x for x in rows if x[0] == s]
    cell = []
    for col in (3, 4):
        v = sorted(float(x[col]) for x in r if x[col] != "NA")
        missing = len(r) - len(v)
        txt = f"{statistics.median(v):.2f} ({v[0]:.2f}-{v[-1]:.2f})" if v else "NA"
        cell.append(txt + (f", {missing} never" if missing else ""))
    print(f"| {s} | {len(r)} | {cell[0]} | {cell[1]} |")
PY
