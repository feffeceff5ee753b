#!/usr/bin/env bash
# A new member catching up by snapshot, side by side: a one-member cluster is filled with
# KEYS puts of VAL-byte values over KEYS keys (64 clients), with --snapshot-count SNAP so that
# its log is purged well past the start; then a second member is added (`etcdctl member add`,
# for both systems) and started, and must catch up by a snapshot. Reports the time from the
# new member's start until it serves the leader's revision, the leader's peak RSS during the
# catch-up (VmRSS sampled every 50 ms) against its RSS before, the new member's peak RSS
# (VmHWM) against its RSS once started and once caught up, and the leader's data dir. kvd and
# etcd 3.4 in turn, ROUNDS times; the data dirs are removed after each run.
#
# Usage: benches/compare/catchup.sh [out-dir]
# Env:   ROUNDS (1) KEYS (1000000) VAL (1024) SNAP (10000) SYSTEMS ("kvd etcd"; NAME=BIN runs
#        a kvd build under its own name, for A/B runs: SYSTEMS="etcd old=/tmp/kvd-old kvd")
#        KVD_BIN KVBENCH_BIN (default: $CARGO_TARGET_DIR or target, release/) ETCD_BIN (etcd)
#        ETCDCTL (etcdctl) SKIP_BUILD=1 KEEP=1 (keep the data dirs)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
. "$ROOT/benches/compare/cluster.sh"
ROUNDS=${ROUNDS:-1}
KEYS=${KEYS:-1000000}
VAL=${VAL:-1024}
SNAP=${SNAP:-10000}
SYSTEMS=${SYSTEMS:-kvd etcd}
OUT=${1:-$(mktemp -d /tmp/catchup.XXXXXX)}
mkdir -p "$OUT"
export ETCDCTL_API=3

prepare kvd kvbench

# member SYSTEM NAME DIR CLIENT PEER STATE CLUSTER: starts one member in the background.
member() {
  local sys=$1 name=$2 dir=$3 c=$4 p=$5 state=$6 ic=$7 bin=$KVD_BIN extra=()
  if [[ $sys == etcd ]]; then
    bin=$ETCD_BIN
    extra=(--logger=zap --log-level=warn)
  fi
  "$bin" --name "$name" --data-dir "$dir/$sys-$name.data" \
    --listen-client-urls "http://127.0.0.1:$c" --advertise-client-urls "http://127.0.0.1:$c" \
    --listen-peer-urls "http://127.0.0.1:$p" --initial-advertise-peer-urls "http://127.0.0.1:$p" \
    --initial-cluster "$ic" --initial-cluster-state "$state" --initial-cluster-token "catchup-$sys" \
    --snapshot-count "$SNAP" --quota-backend-bytes 17179869184 \
    "${extra[@]}" >"$dir/$sys-$name.log" 2>&1 &
  PIDS+=($!)
  MPID[$sys,$name]=$!
}

one() {
  local sys=${1%%=*} round=$2 base=27100
  [[ $1 == *=* ]] && KVD_BIN=${1#*=}
  [[ $sys == etcd ]] && base=27200
  local dir="$OUT/r$round-$sys"
  mkdir -p "$dir"
  local ep="127.0.0.1:$base" ep1="127.0.0.1:$((base + 10))"
  local ic0="m0=http://127.0.0.1:$((base + 1))"
  local ic1="$ic0,m1=http://127.0.0.1:$((base + 11))"
  member "$sys" m0 "$dir" "$base" $((base + 1)) new "$ic0"
  local t
  for t in $(seq 1 150); do [[ -n $(revision "$ep") ]] && break; sleep 0.2; done
  local l0 l1
  l0=$(date +%s.%N)
  "$KVBENCH_BIN" --endpoints "$ep" --json put --key-size 16 --val-size "$VAL" \
    --key-space-size "$KEYS" --sequential-keys --clients 64 --conns 16 --total "$KEYS" >"$dir/load.json"
  l1=$(date +%s.%N)
  local rev leader_rss
  for t in $(seq 1 50); do rev=$(revision "$ep"); [[ -n $rev ]] && break; sleep 0.2; done
  if [[ -z $rev ]]; then
    echo "$sys: the leader did not report its revision after the load" >&2
    return 1
  fi
  leader_rss=$(rss_mib "${MPID[$sys,m0]}" VmRSS)
  # In the background, as before: both answer at once (the change commits, for kvd, only
  # once the new member answers; see src/server/membership.rs).
  "$ETCDCTL" --endpoints "$ep" --command-timeout=600s member add m1 \
    --peer-urls "http://127.0.0.1:$((base + 11))" >"$dir/member_add.out" 2>&1 &
  local ma=$!
  sleep 1
  rm -f "$OUT/stop"
  peak_rss "${MPID[$sys,m0]}" >"$dir/leader_peak" &
  local pr=$!
  local c0 c1
  c0=$(date +%s.%N)
  member "$sys" m1 "$dir" $((base + 10)) $((base + 11)) existing "$ic1"
  sleep 0.3
  local new_rss0
  new_rss0=$(rss_mib "${MPID[$sys,m1]}" VmRSS)
  local ok=0
  for t in $(seq 1 6000); do
    if [[ $(revision "$ep1") == "$rev" ]]; then ok=1; break; fi
    sleep 0.1
  done
  c1=$(date +%s.%N)
  touch "$OUT/stop"
  wait "$pr"
  wait "$ma" || echo "$sys: member add failed: $(cat "$dir/member_add.out")" >&2
  local new_hwm new_end snap_mib
  new_hwm=$(rss_mib "${MPID[$sys,m1]}" VmHWM)
  new_end=$(rss_mib "${MPID[$sys,m1]}" VmRSS)
  snap_mib=$(du -sm "$dir/$sys-m0.data" | awk '{print $1}')
  ((ok)) || echo "$sys: the new member did not reach revision $rev; logs in $dir" >&2
  printf '%s round %s: load %ss (%s keys x %s B); catch-up %ss; leader RSS %s -> peak %s MiB; new member RSS %s -> peak %s MiB, %s MiB once caught up; leader data dir %s MiB\n' \
    "$sys" "$round" "$(secs "$l0" "$l1")" "$KEYS" "$VAL" "$(secs "$c0" "$c1")" \
    "$leader_rss" "$(cat "$dir/leader_peak")" "$new_rss0" "$new_hwm" "$new_end" "$snap_mib" | tee -a "$OUT/results.txt"
  cleanup
  [[ -n ${KEEP:-} ]] || rm -rf "$dir"
}

for round in $(seq 1 "$ROUNDS"); do
  for sys in $SYSTEMS; do one "$sys" "$round"; done
done
echo "results in $OUT/results.txt"
