#!/usr/bin/env bash
# Replacing a member, side by side, as the seeds' runbook does it by hand: a 3-member cluster
# gets KEYS puts of VAL bytes over KEYS keys (64 clients, sequential keys); a follower is
# removed (`etcdctl member remove`) and stopped; a new member is added as a learner
# (`member add --learner`), started empty, and promoted (`member promote`, retried every
# 100 ms) as soon as the leader allows it. Reports the time from the new member's start until
# the promotion succeeds, the new member's peak RSS (VmHWM), RSS, bytes written (write_bytes
# in /proc/PID/io) and CPU time once promoted, the leader's peak RSS while it sends (VmRSS
# sampled every 50 ms) and the CPU time it used from the new member's start until the
# promotion (less noisy than the time on a shared machine), and the p99 / max latency of a 1-client writer putting to the leader at 100 puts/s
# for 30 s from one second before the new member starts. kvd and etcd 3.4 in turn, ROUNDS
# times; data dirs removed after each run.
#
# Usage: benches/compare/replace.sh [out-dir]
# Env:   ROUNDS (1) KEYS (1000000) VAL (1024) SYSTEMS ("kvd etcd"; NAME=BIN runs a kvd build
#        under its own name) KVD_BIN KVBENCH_BIN (default: $CARGO_TARGET_DIR or target,
#        release/) ETCD_BIN (etcd) ETCDCTL (etcdctl) SKIP_BUILD=1 KEEP=1 (keep each run's
#        logs and data dirs)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
. "$ROOT/benches/compare/cluster.sh"
ROUNDS=${ROUNDS:-1}
KEYS=${KEYS:-1000000}
VAL=${VAL:-1024}
SYSTEMS=${SYSTEMS:-kvd etcd}
OUT=${1:-$(mktemp -d /tmp/replace.XXXXXX)}
mkdir -p "$OUT"
export ETCDCTL_API=3

prepare kvd kvbench

# member_id ENDPOINT NAME: the hex ID of the started member NAME.
member_id() {
  "$ETCDCTL" --endpoints "$1" member list -w json |
    python3 -c 'import json,sys
for m in json.load(sys.stdin)["members"]:
    if m.get("name") == sys.argv[1]:
        print("%x" % m["ID"])' "$2"
}

one() {
  local sys=${1%%=*} round=$2 bin=$KVD_BIN base=27500
  [[ $1 == *=* ]] && bin=${1#*=}
  if [[ $sys == etcd ]]; then bin=$ETCD_BIN base=27600; fi
  local dir="$OUT/r$round-$sys"
  mkdir -p "$dir"
  start_cluster "$sys" "$bin" "$base" "$dir"
  wait_leader "$sys"
  local l
  l=$(leader_now "$sys")
  local ep=${CLIENT[$sys,$l]}
  "$KVBENCH_BIN" --endpoints "$ep" --json put --key-size 16 --val-size "$VAL" \
    --key-space-size "$KEYS" --sequential-keys --clients 64 --conns 16 --total "$KEYS" >"$dir/load.json"
  # The follower replaced: the first member that is not the leader.
  local v=0
  [[ $l == 0 ]] && v=1
  local vid
  vid=$(member_id "$ep" "m$v")
  # Both refuse a removal until every member has been connected for 5 s ("unhealthy cluster").
  local t
  for t in $(seq 1 60); do
    "$ETCDCTL" --endpoints "$ep" --command-timeout=30s member remove "$vid" >/dev/null 2>&1 && break
    sleep 0.5
  done
  kill "${MPID[$sys,$v]}"
  wait "${MPID[$sys,$v]}" 2>/dev/null || true
  local c=$((base + 30)) p=$((base + 31)) ic="" i
  for i in 0 1 2; do
    [[ $i == "$v" ]] && continue
    ic+="${ic:+,}m$i=http://127.0.0.1:$((base + 10 * i + 1))"
  done
  ic+=",m3=http://127.0.0.1:$p"
  "$ETCDCTL" --endpoints "$ep" --command-timeout=30s member add m3 --learner \
    --peer-urls "http://127.0.0.1:$p" >"$dir/member_add.out"
  rm -f "$OUT/stop"
  peak_rss "${MPID[$sys,$l]}" >"$dir/leader_peak" &
  local pr=$!
  "$KVBENCH_BIN" --endpoints "$ep" --json put --key-size 16 --val-size "$VAL" \
    --key-space-size "$KEYS" --clients 1 --rate 100 --total 3000 >"$dir/writer.json" &
  local wr=$!
  sleep 1
  local extra=()
  [[ $sys == etcd ]] && extra=(--logger=zap --log-level=warn)
  local t0 t1 lcpu0
  lcpu0=$(cpu_secs "${MPID[$sys,$l]}")
  t0=$(date +%s.%N)
  "$bin" --name m3 --data-dir "$dir/$sys-m3.data" \
    --listen-client-urls "http://127.0.0.1:$c" --advertise-client-urls "http://127.0.0.1:$c" \
    --listen-peer-urls "http://127.0.0.1:$p" --initial-advertise-peer-urls "http://127.0.0.1:$p" \
    --initial-cluster "$ic" --initial-cluster-state existing --initial-cluster-token "bench-$sys" \
    "${extra[@]}" >"$dir/$sys-m3.log" 2>&1 &
  local m3=$!
  PIDS+=("$m3")
  local nid ok=0
  # From `member add`'s answer: an unstarted member has no name in the member list.
  nid=$(awk '/^Member / {print $2; exit}' "$dir/member_add.out")
  for t in $(seq 1 3000); do
    if "$ETCDCTL" --endpoints "$ep" --command-timeout=5s member promote "$nid" >/dev/null 2>"$dir/promote.err"; then
      ok=1
      break
    fi
    sleep 0.1
  done
  t1=$(date +%s.%N)
  touch "$OUT/stop"
  wait "$pr"
  ((ok)) || echo "$sys: m3 was not promoted ($(tail -1 "$dir/promote.err")); logs in $dir" >&2
  local hwm now wr_mib cpu lcpu
  cpu=$(cpu_secs "$m3")
  lcpu=$(python3 -c 'import sys; print(f"{float(sys.argv[2]) - float(sys.argv[1]):.2f}")' "$lcpu0" "$(cpu_secs "${MPID[$sys,$l]}")")
  hwm=$(rss_mib "$m3" VmHWM)
  now=$(rss_mib "$m3" VmRSS)
  wr_mib=$(written_mib "$m3")
  wait "$wr" || echo "$sys: the writer failed" >&2
  local lat
  lat=$(python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print(j["latency_ms"]["p99"], j["latency_ms"]["max"], j["errors"])' "$dir/writer.json")
  read -r p99 mx errs <<<"$lat"
  printf '%s round %s: %s keys x %s B; promoted %ss after the start; new member peak %s MiB, %s MiB once promoted, wrote %s MiB, CPU %ss; leader peak %s MiB, CPU %ss meanwhile; writer p99 %s ms, max %s ms, errors %s\n' \
    "$sys" "$round" "$KEYS" "$VAL" "$(secs "$t0" "$t1")" "$hwm" "$now" "$wr_mib" "$cpu" "$(cat "$dir/leader_peak")" \
    "$lcpu" "$p99" "$mx" "$errs" | tee -a "$OUT/results.txt"
  cleanup
  [[ ${KEEP:-} == 1 ]] || rm -rf "$dir"
}

for round in $(seq 1 "$ROUNDS"); do
  for sys in $SYSTEMS; do one "$sys" "$round"; done
done
echo "results in $OUT/results.txt"
