#!/usr/bin/env bash
# Backups between a REAL etcd 3.4 and kvd, both ways, with etcd's own tools on etcd's side:
#   etcd -> `etcdctl snapshot save` -> `kvctl snapshot restore` -> kvd
#   kvd  -> `etcdctl snapshot save` (from kvd) -> `etcdctl snapshot restore` -> etcd
# The same history is written to the source (overwrites, a delete, a lease holding a key, a
# 20 KB value, a compaction, writes after it). The restored store must answer every read at
# every revision from the compaction on exactly as the source does (keys, values,
# create/mod revisions, versions, leases; headers aside), refuse the compacted revision with
# etcd's error, keep the lease with its TTL, and take the next write at the next revision.
# `kvctl snapshot status` and `etcdctl snapshot status` print the same for both files, in
# every output format. Users, roles and the auth flag travel both ways too: a restored store
# enforces them as its source did.
# Exits non-zero on the first deviation; stops every process it started.
#
#   cargo build --release --bin kvd --bin kvctl
#   tests/etcdctl_diff/backup_roundtrip.sh
#
# Environment: KVD_BIN, KVCTL_BIN (default target/release/{kvd,kvctl}), ETCD (default etcd),
# ETCDCTL (default etcdctl), KEEP_OUT=1 keeps the work dir.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
KVD_BIN=${KVD_BIN:-$ROOT/target/release/kvd}
KVCTL_BIN=${KVCTL_BIN:-$ROOT/target/release/kvctl}
ETCD=${ETCD:-etcd}
ETCDCTL=${ETCDCTL:-etcdctl}
export ETCDCTL_API=3
unset ETCDCTL_ENDPOINTS ETCDCTL_WRITE_OUT

# shellcheck source=harness.sh
source "$HERE/harness.sh"

# history EP: writes the same history to any server; the compaction is at revision 30.
history() {
    local ep=$1 c=("$ETCDCTL" --endpoints "$1")
    for i in $(seq 0 59); do
        "${c[@]}" put "k$(printf %02d $((i % 15)))" "v$i" >/dev/null || fail "put on $ep"
    done
    "${c[@]}" del k03 >/dev/null || fail "del on $ep"
    local lease
    lease=$("${c[@]}" lease grant 600 | awk '{print $2}')
    head -c 20000 /dev/zero | tr '\0' 'z' >"$WORK/big"
    "${c[@]}" put leased --lease="$lease" <"$WORK/big" >/dev/null || fail "leased put on $ep"
    "${c[@]}" compact 30 --physical >/dev/null || fail "compact on $ep"
    for i in 0 1 2 3 4; do
        "${c[@]}" put "after$i" x >/dev/null || fail "put after on $ep"
    done
    echo "$lease"
}

# kvs EP REV: every key at REV, without the header.
kvs() {
    "$ETCDCTL" --endpoints "$1" get "" --prefix --rev="$2" -w json 2>&1 |
        python3 -c 'import json,sys; d=json.load(sys.stdin); print(json.dumps(d.get("kvs", []), sort_keys=True))'
}

# same EP_A EP_B LEASE: compares the two stores (see the header).
same() {
    local a=$1 b=$2 lease=$3 rev
    rev=$("$ETCDCTL" --endpoints "$a" get x -w json | python3 -c 'import json,sys; print(json.load(sys.stdin)["header"]["revision"])')
    for r in $(seq 30 "$rev"); do
        [[ "$(kvs "$a" "$r")" == "$(kvs "$b" "$r")" ]] || fail "revision $r differs: $(kvs "$a" "$r") vs $(kvs "$b" "$r")"
    done
    local ea eb
    ea=$("$ETCDCTL" --endpoints "$a" get k00 --rev=29 2>&1 | tail -1)
    eb=$("$ETCDCTL" --endpoints "$b" get k00 --rev=29 2>&1 | tail -1)
    [[ "$ea" == "$eb" && "$ea" == *"required revision has been compacted"* ]] || fail "compacted read: '$ea' vs '$eb'"
    local ta tb
    ta=$("$ETCDCTL" --endpoints "$a" lease timetolive "$lease" --keys | sed 's/remaining([0-9]*s)//')
    tb=$("$ETCDCTL" --endpoints "$b" lease timetolive "$lease" --keys | sed 's/remaining([0-9]*s)//')
    [[ "$ta" == "$tb" && "$ta" == *"granted with TTL(600s)"*"attached keys([leased])"* ]] || fail "lease: '$ta' vs '$tb'"
    local na nb
    na=$("$ETCDCTL" --endpoints "$a" put next 1 -w json | python3 -c 'import json,sys; print(json.load(sys.stdin)["header"]["revision"])')
    nb=$("$ETCDCTL" --endpoints "$b" put next 1 -w json | python3 -c 'import json,sys; print(json.load(sys.stdin)["header"]["revision"])')
    [[ "$na" == "$nb" && "$na" == $((rev + 1)) ]] || fail "next write at $na vs $nb (want $((rev + 1)))"
    echo "   $((rev - 29)) revisions, lease and next write agree" >&2
}

# statuses FILE: kvctl and etcdctl summarise FILE identically in every format.
statuses() {
    for w in simple json table fields; do
        local a b
        a=$("$ETCDCTL" snapshot status "$1" -w "$w" 2>&1)
        b=$("$KVCTL_BIN" snapshot status "$1" -w "$w" 2>&1)
        [[ "$a" == "$b" ]] || fail "snapshot status -w $w: etcdctl '$a' vs kvctl '$b'"
    done
}

step "etcd -> etcdctl snapshot save -> kvctl snapshot restore -> kvd"
start e1 "$ETCD" "$WORK/e1"
E1=$EP
L1=$(history "$E1")
"$ETCDCTL" --endpoints "$E1" snapshot save "$WORK/from-etcd.db" >/dev/null 2>&1 || fail "etcdctl snapshot save from etcd"
statuses "$WORK/from-etcd.db"
KP=$(free_port)
"$KVCTL_BIN" snapshot restore "$WORK/from-etcd.db" --name k2 --data-dir "$WORK/k2" \
    --initial-cluster "k2=http://127.0.0.1:$KP" --initial-advertise-peer-urls "http://127.0.0.1:$KP" 2>/dev/null ||
    fail "kvctl snapshot restore of etcd's file"
start k2 "$KVD_BIN" "$WORK/k2" "$KP"
K2=$EP
same "$E1" "$K2" "$L1"

step "kvd -> etcdctl snapshot save (from kvd) -> etcdctl snapshot restore -> etcd"
start k1 "$KVD_BIN" "$WORK/k1"
K1=$EP
L2=$(history "$K1")
"$ETCDCTL" --endpoints "$K1" snapshot save "$WORK/from-kvd.db" >/dev/null 2>&1 || fail "etcdctl snapshot save from kvd"
statuses "$WORK/from-kvd.db"
EPP=$(free_port)
"$ETCDCTL" snapshot restore "$WORK/from-kvd.db" --name e2 --data-dir "$WORK/e2" \
    --initial-cluster "e2=http://127.0.0.1:$EPP" --initial-advertise-peer-urls "http://127.0.0.1:$EPP" >/dev/null 2>&1 ||
    fail "etcdctl snapshot restore of kvd's file"
start e2 "$ETCD" "$WORK/e2" "$EPP"
E2=$EP
same "$K1" "$E2" "$L2"

# auth_setup EP: root, a user u with a role ro (read on prefix foo/, readwrite on k1), auth on.
auth_setup() {
    local c=("$ETCDCTL" --endpoints "$1")
    "${c[@]}" user add root:pw >/dev/null &&
        "${c[@]}" user grant-role root root >/dev/null &&
        "${c[@]}" user add u:p >/dev/null &&
        "${c[@]}" role add ro >/dev/null &&
        "${c[@]}" role grant-permission ro read foo/ --prefix >/dev/null &&
        "${c[@]}" role grant-permission ro readwrite k1 >/dev/null &&
        "${c[@]}" user grant-role u ro >/dev/null &&
        "${c[@]}" auth enable >/dev/null || fail "auth setup on $1"
}

# auth_view EP: what a client sees of the auth state (refusals, a user's rights, the lists),
# without etcdctl's retry warnings (they carry timestamps and client ids).
auth_view() {
    local c=("$ETCDCTL" --endpoints "$1")
    {
        "${c[@]}" put k1 v
        "${c[@]}" --user u:wrong get k1
        "${c[@]}" --user u:p put k1 v
        "${c[@]}" --user u:p get foo/a
        "${c[@]}" --user u:p put foo/a v
        "${c[@]}" --user root:pw user list
        "${c[@]}" --user root:pw user get u
        "${c[@]}" --user root:pw role get ro
    } 2>&1 | grep -v '^{"level"'
}

step "users and roles: etcd -> kvd and kvd -> etcd"
for dir in e2k k2e; do
    if [[ $dir == e2k ]]; then src_bin=$ETCD dst_bin=$KVD_BIN; else src_bin=$KVD_BIN dst_bin=$ETCD; fi
    start "$dir-src" "$src_bin" "$WORK/$dir-src"
    SRC=$EP
    auth_setup "$SRC"
    "$ETCDCTL" --endpoints "$SRC" --user root:pw snapshot save "$WORK/$dir.db" >/dev/null 2>&1 ||
        fail "$dir: etcdctl snapshot save with auth on"
    statuses "$WORK/$dir.db"
    P=$(free_port)
    restore_tool=$ETCDCTL
    [[ $dir == e2k ]] && restore_tool=$KVCTL_BIN
    "$restore_tool" snapshot restore "$WORK/$dir.db" --name "$dir-dst" --data-dir "$WORK/$dir-dst" \
        --initial-cluster "$dir-dst=http://127.0.0.1:$P" --initial-advertise-peer-urls "http://127.0.0.1:$P" \
        >/dev/null 2>&1 || fail "$dir: snapshot restore of a file with users"
    START_USER=root:pw start "$dir-dst" "$dst_bin" "$WORK/$dir-dst" "$P"
    DST=$EP
    a=$(auth_view "$SRC")
    b=$(auth_view "$DST")
    [[ "$a" == "$b" ]] || fail "$dir: the restored store's auth differs:
--- source
$a
--- restored
$b"
    [[ "$a" == *"permission denied"* && "$a" == *"user name is empty"* ]] ||
        fail "$dir: auth is not enforced on the source: $a"
    echo "   $dir: refusals, rights, users and roles agree" >&2
done

step "a damaged file is refused by both tools, and kvctl writes nothing"
cp "$WORK/from-kvd.db" "$WORK/flip.db"
printf '\xff' | dd of="$WORK/flip.db" bs=1 seek=9000 conv=notrunc 2>/dev/null
"$KVCTL_BIN" snapshot restore "$WORK/flip.db" --data-dir "$WORK/bad" >/dev/null 2>&1 && fail "kvctl restored a damaged file"
[[ -e "$WORK/bad" || -e "$WORK/bad.restoring" ]] && fail "kvctl left files behind for a damaged backup"
"$ETCDCTL" snapshot restore "$WORK/flip.db" --data-dir "$WORK/bad-etcd" >/dev/null 2>&1 && fail "etcdctl restored a damaged file"
echo "== backup round trips passed" >&2
