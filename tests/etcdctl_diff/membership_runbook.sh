#!/usr/bin/env bash
# The replace-a-dead-member runbook (docs/operations.md) driven by the REAL etcdctl 3.4
# against a three-member kvd cluster this script starts itself:
#   kill one member; removing a healthy member and adding a voter are refused ("unhealthy
#   cluster"); removing the dead member succeeds; `member add --learner`, starting the new
#   member with the printed ETCD_* settings and `member promote` succeed; a write through the
#   new member is readable on the leader; `member list` shows three started voters.
# Exits non-zero on the first deviation; stops every process it started.
#
#   cargo build --bin kvd
#   KVD_BIN=target/debug/kvd tests/etcdctl_diff/membership_runbook.sh
#
# Environment: KVD_BIN (default target/release/kvd), ETCDCTL (default etcdctl), KEEP_OUT=1
# keeps the work dir (member logs) for inspection.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
KVD_BIN=${KVD_BIN:-$ROOT/target/release/kvd}
ETCDCTL=${ETCDCTL:-etcdctl}
export ETCDCTL_API=3
unset ETCDCTL_ENDPOINTS ETCDCTL_WRITE_OUT

# shellcheck source=harness.sh
source "$HERE/harness.sh"
declare -A CLIENT PEER

ctl() { "$ETCDCTL" --command-timeout=5s "$@"; }

# start NAME [env assignments...]: starts kvd for NAME with its ports; extra ETCD_* settings
# come from the environment assignments (the new member's printed settings).
start() {
    local n=$1
    shift
    env "$@" "$KVD_BIN" --data-dir "$WORK/$n.kvd" \
        --listen-client-urls "http://${CLIENT[$n]}" --advertise-client-urls "http://${CLIENT[$n]}" \
        --listen-peer-urls "${PEER[$n]}" \
        >>"$WORK/$n.log" 2>&1 &
    PID[$n]=$!
}

# wait_up NAME CHECK: until `etcdctl endpoint CHECK` succeeds on NAME (a learner answers
# `status` but, in etcd, not `health`, which reads a key).
wait_up() {
    local n=$1 check=$2
    for _ in $(seq 1 100); do
        kill -0 "${PID[$n]}" 2>/dev/null || fail "$n exited"
        "$ETCDCTL" --endpoints="${CLIENT[$n]}" --command-timeout=1s endpoint "$check" \
            >/dev/null 2>&1 && return 0
        sleep 0.2
    done
    fail "$n not up ($check)"
}

# member_id NAME -> hex id from `member list` (simple format: id, status, name, peers, clients, learner)
member_id() {
    ctl --endpoints="$EPS" member list | awk -F', ' -v n="$1" '$3 == n { print $1 }'
}

if [[ ! -x $KVD_BIN ]]; then
    echo "kvd binary not found: $KVD_BIN (set KVD_BIN)" >&2
    exit 2
fi

for n in m1 m2 m3; do
    CLIENT[$n]=127.0.0.1:$(free_port)
    PEER[$n]=http://127.0.0.1:$(free_port)
done
INITIAL="m1=${PEER[m1]},m2=${PEER[m2]},m3=${PEER[m3]}"
for n in m1 m2 m3; do
    start "$n" ETCD_NAME="$n" ETCD_INITIAL_CLUSTER="$INITIAL" \
        ETCD_INITIAL_ADVERTISE_PEER_URLS="${PEER[$n]}" ETCD_INITIAL_CLUSTER_STATE=new \
        ETCD_INITIAL_CLUSTER_TOKEN=runbook
done
for n in m1 m2 m3; do wait_up "$n" health; done
EPS="${CLIENT[m1]},${CLIENT[m2]}"
ctl --endpoints="$EPS" put before-kill 1 >/dev/null || fail "first put"
M2=$(member_id m2)
M3=$(member_id m3)
[[ -n $M2 && -n $M3 ]] || fail "member ids not listed"
# etcd counts a peer as active once its link has been up for 5 s.
sleep 6

step "kill m3 ($M3)"
kill -9 "${PID[m3]}"
wait "${PID[m3]}" 2>/dev/null
unset 'PID[m3]'
sleep 2

step "removing healthy m2 is refused"
out=$(ctl --endpoints="${CLIENT[m1]}" member remove "$M2" 2>&1) && fail "remove of a healthy member succeeded: $out"
[[ $out == *"unhealthy cluster"* ]] || fail "unexpected refusal: $out"

step "adding a voter is refused"
NEW_PEER=http://127.0.0.1:$(free_port)
out=$(ctl --endpoints="${CLIENT[m2]}" member add m4 --peer-urls="$NEW_PEER" 2>&1) && fail "voter add succeeded: $out"
[[ $out == *"unhealthy cluster"* ]] || fail "unexpected refusal: $out"

step "removing the dead m3 succeeds"
out=$(ctl --endpoints="$EPS" member remove "$M3" 2>&1) || fail "remove dead member: $out"
[[ $out == "Member "*"$M3 removed from cluster "* ]] || fail "unexpected output: $out"

step "member add --learner m4"
out=$(ctl --endpoints="$EPS" member add m4 --peer-urls="$NEW_PEER" --learner 2>&1) || fail "learner add: $out"
echo "$out" >&2
# etcdctl 3.4 prints "added to cluster" for a learner too; `member list` says it is one.
[[ $out == "Member "*" added to cluster "* ]] || fail "unexpected output: $out"
SETTINGS=()
while IFS= read -r line; do
    [[ $line == ETCD_*=* ]] || continue
    k=${line%%=*}
    v=${line#*=}
    v=${v#\"}
    v=${v%\"}
    SETTINGS+=("$k=$v")
done <<<"$out"
[[ ${#SETTINGS[@]} -eq 4 ]] || fail "expected 4 ETCD_* lines, got: ${SETTINGS[*]}"
[[ " ${SETTINGS[*]} " == *" ETCD_INITIAL_CLUSTER_STATE=existing "* ]] || fail "state not existing"
M4=$(echo "$out" | awk 'NR == 1 { print $2 }')

learner=$(ctl --endpoints="$EPS" member list | awk -F', ' -v id="$M4" '$1 == id { print $6 }')
[[ $learner == true ]] || fail "m4 is not listed as a learner: '$learner'"

step "start m4 with the printed settings"
CLIENT[m4]=127.0.0.1:$(free_port)
PEER[m4]=$NEW_PEER
start m4 "${SETTINGS[@]}"
wait_up m4 status

step "member promote $M4"
ok=
for _ in $(seq 1 60); do
    if out=$(ctl --endpoints="$EPS" member promote "$M4" 2>&1); then
        ok=1
        break
    fi
    [[ $out == *"in sync with leader"* || $out == *"unhealthy cluster"* ]] || fail "promote: $out"
    sleep 0.5
done
[[ -n $ok ]] || fail "promote never succeeded: $out"
[[ $out == "Member "*"$M4 promoted in cluster "* ]] || fail "unexpected output: $out"

step "a write through m4 is readable on the leader"
ctl --endpoints="${CLIENT[m4]}" put via-m4 hello >/dev/null || fail "put through m4"
LEADER=$(ctl --endpoints="${CLIENT[m1]},${CLIENT[m2]},${CLIENT[m4]}" endpoint status |
    awk -F', ' '$5 == "true" { print $1 }')
[[ -n $LEADER ]] || fail "no leader in endpoint status"
got=$(ctl --endpoints="$LEADER" get via-m4 --print-value-only) || fail "get on leader"
[[ $got == hello ]] || fail "leader $LEADER read '$got'"
got=$(ctl --endpoints="${CLIENT[m4]}" get before-kill --print-value-only)
[[ $got == 1 ]] || fail "m4 missed data written before it joined: '$got'"

step "member list shows three started voters"
ok=
for _ in $(seq 1 50); do
    list=$(ctl --endpoints="$EPS" member list) || fail "member list"
    if [[ $(echo "$list" | wc -l) -eq 3 ]] &&
        echo "$list" | awk -F', ' '$2 != "started" || $3 == "" || $6 != "false" { bad = 1 } END { exit bad }'; then
        ok=1
        break
    fi
    sleep 0.2
done
[[ -n $ok ]] || fail "member list: $list"
echo "$list" >&2
echo "membership runbook: OK" >&2
