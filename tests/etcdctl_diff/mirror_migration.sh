#!/usr/bin/env bash
# Live migration between a REAL etcd 3.4 and kvd with `make-mirror`, both ways:
#   etcd -> kvd with `kvctl make-mirror` and with etcd's own `etcdctl make-mirror`;
#   kvd  -> etcd with `kvctl make-mirror`.
# The source holds keys before the mirror starts (more than one page of the first copy, binary
# bytes, a key on a lease, keys outside the prefix) and changes while it runs (a txn of puts
# and a delete, overwrites, a delete of 300 keys in one revision). Each destination must end
# with exactly the source's keys and values under the prefix (rewritten to --dest-prefix), and
# nothing else; the two tools must agree key for key where both run.
# Exits non-zero on the first deviation; stops every process it started.
#
#   cargo build --release --bin kvd --bin kvctl
#   tests/etcdctl_diff/mirror_migration.sh
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

# mirror NAME CTL SRC DST [ARGS...]: runs CTL make-mirror in the background.
mirror() {
    local n=$1 ctl=$2 src=$3 dst=$4
    shift 4
    "$ctl" --endpoints "$src" make-mirror "$@" "$dst" >"$WORK/$n.log" 2>&1 &
    PID[$n]=$!
}

# dump EP PREFIX: every key under PREFIX (the prefix cut off) and its value, base64, sorted.
dump() {
    "$ETCDCTL" --endpoints "$1" get "$2" --prefix -w json |
        python3 -c '
import base64, json, sys
p = sys.argv[1].encode()
kvs = json.load(sys.stdin).get("kvs", [])
out = sorted((base64.b64decode(k["key"])[len(p):], base64.b64decode(k.get("value", ""))) for k in kvs)
print(json.dumps([[base64.b64encode(k).decode(), base64.b64encode(v).decode()] for k, v in out]))
' "$2"
}

# converge SRC DST PREFIX WHAT: waits (30 s) until DST holds under PREFIX exactly SRC's
# /registry/ keys.
converge() {
    local want got
    for _ in $(seq 1 150); do
        want=$(dump "$1" /registry/)
        got=$(dump "$2" "$3")
        [[ "$want" == "$got" ]] && return 0
        sleep 0.2
    done
    fail "$4: $3 on $2 never matched /registry/ on $1 ($(echo "$want" | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))') vs $(echo "$got" | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))') keys)"
}

# load EP: the keys present before the mirrors start.
load() {
    local c=("$ETCDCTL" --endpoints "$1")
    python3 - "$WORK/txn" <<'PY'
import sys
with open(sys.argv[1], "w") as f:
    for chunk in range(12):
        f.write("\n")
        for i in range(100):
            n = chunk * 100 + i
            f.write(f'put /registry/k{n:04d} v{n}\n')
        f.write("\n\n")
PY
    # One txn per block of 100 puts (etcdctl txn reads one txn from stdin).
    python3 - "$WORK/txn" "$WORK" <<'PY'
import sys
blocks = open(sys.argv[1]).read().split("\n\n\n")
for i, b in enumerate(x for x in blocks if x.strip()):
    open(f"{sys.argv[2]}/txn.{i}", "w").write(b.strip("\n").join(["\n", "\n\n\n"]))
PY
    for f in "$WORK"/txn.*; do
        "${c[@]}" txn <"$f" >/dev/null || fail "load txn on $1"
    done
    "${c[@]}" put /registry/$'\x01bin\xff' $'\x00\x02' >/dev/null || fail "binary put on $1"
    local lease
    lease=$("${c[@]}" lease grant 600 | awk '{print $2}')
    "${c[@]}" put /registry/leased x --lease="$lease" >/dev/null || fail "leased put on $1"
    "${c[@]}" put /elsewhere not-mirrored >/dev/null || fail "put on $1"
}

# change EP: what happens on the source while the mirrors run.
change() {
    local c=("$ETCDCTL" --endpoints "$1")
    printf '\nput /registry/t1 a\nput /registry/k0001 changed\ndel /registry/k0002\n\n\n' |
        "${c[@]}" txn >/dev/null || fail "txn on $1"
    for i in $(seq 0 19); do
        "${c[@]}" put "/registry/k00$((10 + i))" "again$i" >/dev/null || fail "put on $1"
    done
    "${c[@]}" del /registry/k0100 /registry/k0400 >/dev/null || fail "delete range on $1"
}

step "etcd -> kvd: kvctl make-mirror and etcdctl make-mirror side by side"
start etcd "$ETCD" "$WORK/etcd.data"
SRC=$EP
start kvd "$KVD_BIN" "$WORK/kvd.data"
DST=$EP
load "$SRC"
mirror kvctl-mirror "$KVCTL_BIN" "$SRC" "$DST" --prefix /registry/ --dest-prefix /by-kvctl/
mirror etcdctl-mirror "$ETCDCTL" "$SRC" "$DST" --prefix /registry/ --dest-prefix /by-etcdctl/
converge "$SRC" "$DST" /by-kvctl/ "kvctl's first copy"
converge "$SRC" "$DST" /by-etcdctl/ "etcdctl's first copy"
# etcdctl 3.4 sends one txn per source revision, and a destination refuses more than 128
# operations in one txn: stop it before the 300-key delete (kvctl splits such a revision).
kill "${PID[etcdctl-mirror]}" 2>/dev/null
change "$SRC"
converge "$SRC" "$DST" /by-kvctl/ "kvctl after the changes"
[[ -z $("$ETCDCTL" --endpoints "$DST" get /elsewhere --prefix --keys-only) ]] || fail "a key outside the prefix was mirrored"
[[ -z $("$ETCDCTL" --endpoints "$DST" get /by-kvctl/leased -w json | python3 -c 'import json,sys; print([k.get("lease") for k in json.load(sys.stdin)["kvs"] if k.get("lease")] or "")') ]] || fail "a lease was mirrored"
echo "   $(dump "$SRC" /registry/ | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))') keys mirrored; both tools agreed on the first copy" >&2
kill "${PID[kvctl-mirror]}" 2>/dev/null

step "kvd -> etcd: kvctl make-mirror back to the root of a fresh etcd"
start etcd2 "$ETCD" "$WORK/etcd2.data"
BACK=$EP
mirror back "$KVCTL_BIN" "$DST" "$BACK" --prefix /by-kvctl/ --dest-prefix /registry/
converge "$SRC" "$BACK" /registry/ "back to etcd"
"$ETCDCTL" --endpoints "$DST" put /by-kvctl/late 1 >/dev/null || fail "put on kvd"
"$ETCDCTL" --endpoints "$SRC" put /registry/late 1 >/dev/null || fail "put on etcd"
converge "$SRC" "$BACK" /registry/ "a write on kvd after the copy"
echo "== mirror migration: both ways agree" >&2
