#!/usr/bin/env bash
# Differential test of authentication, RBAC and client TLS: the same scenario runs
# against a fresh TLS + mTLS server for each side, and the normalised transcripts are diffed.
#
#   MODE=etcd-vs-kvctl tests/etcdctl_diff/auth_tls_diff.sh   # etcdctl vs kvctl, both on etcd
#   MODE=etcd-vs-kvd   tests/etcdctl_diff/auth_tls_diff.sh   # etcdctl on etcd vs on kvd
#   MODE=all           tests/etcdctl_diff/auth_tls_diff.sh   # both diffs, and kvctl on kvd
#
# Environment: MODE (default etcd-vs-kvctl), KVD_BIN (default target/release/kvd; started with
# etcd's flag names), ETCD_BIN (default etcd), ETCDCTL (default etcdctl), KVCTL (default
# target/debug/kvctl), KEEP_OUT=1 keeps the transcripts (their directory is printed).
#
# Certificates are made with openssl: a CA, a server certificate for 127.0.0.1/localhost,
# client certificates with CN=root, CN=alice and CN=nobody (not a user), and a certificate
# with CN=root signed by an untrusted CA. The server runs with --cert-file --key-file
# --trusted-ca-file --client-cert-auth --auth-token-ttl=2 on an https client URL (plain http
# between peers: a single member). Every server is fresh, so revisions compare; member and cluster ids, raft
# terms, header revisions and ports are masked. Exit status: 0 when every diff is empty, 1
# otherwise (the diff is printed), 2 when a server does not start.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
MODE=${MODE:-etcd-vs-kvctl}
KVD_BIN=${KVD_BIN:-$ROOT/target/release/kvd}
ETCD_BIN=${ETCD_BIN:-etcd}
ETCDCTL=${ETCDCTL:-etcdctl}
KVCTL=${KVCTL:-$ROOT/target/debug/kvctl}
export ETCDCTL_API=3
unset ETCDCTL_ENDPOINTS ETCDCTL_WRITE_OUT ETCDCTL_HEX ETCDCTL_USER ETCDCTL_PASSWORD \
    ETCDCTL_CACERT ETCDCTL_CERT ETCDCTL_KEY ETCDCTL_INSECURE_TRANSPORT \
    ETCDCTL_INSECURE_SKIP_TLS_VERIFY

case $MODE in
    etcd-vs-kvctl | etcd-vs-kvd | all) ;;
    *)
        echo "MODE must be etcd-vs-kvctl, etcd-vs-kvd or all" >&2
        exit 2
        ;;
esac

WORK=$(mktemp -d)
SERVER_PID=
cleanup() {
    if [[ -n $SERVER_PID ]]; then
        kill "$SERVER_PID" 2>/dev/null
        wait "$SERVER_PID" 2>/dev/null
    fi
    if [[ ${KEEP_OUT:-} == 1 ]]; then
        echo "transcripts kept in $WORK" >&2
    else
        rm -rf "$WORK"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# shellcheck source=ports.sh
source "$HERE/ports.sh"

CERTS=$WORK/certs

# gen_certs DIR: the CAs and certificates described above.
gen_certs() {
    mkdir -p "$1"
    (
        cd "$1" || exit 1
        ca() {
            openssl req -x509 -newkey rsa:2048 -nodes -keyout "$1-key.pem" -out "$1.pem" \
                -days 2 -subj "/CN=$2" >/dev/null 2>&1
        }
        leaf() { # NAME CN CA EXTENSIONS
            openssl req -newkey rsa:2048 -nodes -keyout "$1-key.pem" -out "$1.csr" \
                -subj "/CN=$2" >/dev/null 2>&1
            printf '%s\n' "$4" >"$1.ext"
            openssl x509 -req -in "$1.csr" -CA "$3.pem" -CAkey "$3-key.pem" -CAcreateserial \
                -out "$1.pem" -days 2 -extfile "$1.ext" >/dev/null 2>&1
            rm -f "$1.csr" "$1.ext"
        }
        local eku="extendedKeyUsage=serverAuth,clientAuth"
        ca ca kvd-test-ca
        ca other-ca untrusted-ca
        leaf server localhost ca "subjectAltName=IP:127.0.0.1,DNS:localhost
$eku"
        leaf root root ca "$eku"
        leaf alice alice ca "$eku"
        leaf nobody nobody ca "$eku"
        leaf untrusted root other-ca "$eku"
    ) || return 1
    [[ -s $1/untrusted.pem ]]
}

# start_server NAME BINARY: a fresh single member with client TLS and mTLS; sets EP.
start_server() {
    local name=$1 bin=$2 client peer
    client=$(free_port)
    peer=$(free_port)
    mkdir -p "$WORK/$name"
    "$bin" --name node1 --data-dir "$WORK/$name/data" \
        --listen-client-urls "https://127.0.0.1:$client" \
        --advertise-client-urls "https://127.0.0.1:$client" \
        --listen-peer-urls "http://127.0.0.1:$peer" \
        --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
        --initial-cluster "node1=http://127.0.0.1:$peer" \
        --cert-file "$CERTS/server.pem" --key-file "$CERTS/server-key.pem" \
        --trusted-ca-file "$CERTS/ca.pem" --client-cert-auth --auth-token-ttl=2 \
        >"$WORK/$name/log" 2>&1 &
    SERVER_PID=$!
    EP=https://127.0.0.1:$client
    for _ in $(seq 1 60); do
        if ! kill -0 "$SERVER_PID" 2>/dev/null; then
            echo "$name ($bin) exited before becoming ready; its log:" >&2
            tail -n 30 "$WORK/$name/log" >&2
            SERVER_PID=
            return 1
        fi
        if "$ETCDCTL" --endpoints="$EP" --cacert "$CERTS/ca.pem" --cert "$CERTS/root.pem" \
            --key "$CERTS/root-key.pem" --command-timeout=1s endpoint health >/dev/null 2>&1; then
            return 0
        fi
        sleep 0.2
    done
    echo "$name ($bin) at $EP did not become ready; its log:" >&2
    tail -n 30 "$WORK/$name/log" >&2
    return 1
}

stop_server() {
    kill "$SERVER_PID" 2>/dev/null
    wait "$SERVER_PID" 2>/dev/null
    SERVER_PID=
}

# Identities: which certificate (and CA) a step connects with.
identity() {
    local c=$CERTS
    case $1 in
        root) echo "--cacert $c/ca.pem --cert $c/root.pem --key $c/root-key.pem" ;;
        alice) echo "--cacert $c/ca.pem --cert $c/alice.pem --key $c/alice-key.pem" ;;
        nobody) echo "--cacert $c/ca.pem --cert $c/nobody.pem --key $c/nobody-key.pem" ;;
        nocert) echo "--cacert $c/ca.pem" ;;
        untrusted) echo "--cacert $c/ca.pem --cert $c/untrusted.pem --key $c/untrusted-key.pem" ;;
        wrongca) echo "--cacert $c/other-ca.pem --cert $c/root.pem --key $c/root-key.pem" ;;
        none) ;;
        mismatch) echo "--cacert $c/ca.pem --cert $c/root.pem --key $c/alice-key.pem" ;;
        keyonly) echo "--cacert $c/ca.pem --key $c/alice-key.pem" ;;
        skipverify) echo "--insecure-skip-tls-verify --cacert $c/other-ca.pem --cert $c/root.pem --key $c/root-key.pem" ;;
        *) echo "unknown identity $1" >&2 ;;
    esac
}

# protobuf_body FILE: a protobuf response in hex, without its header (field 1, whose ids and
# terms differ between servers; it is always shorter than 128 bytes).
protobuf_body() {
    local hex len
    hex=$(od -An -v -tx1 "$1" | tr -d ' \n')
    if [[ ${hex:0:2} == 0a ]]; then
        len=$((16#${hex:2:2}))
        hex=${hex:$((4 + 2 * len))}
    fi
    echo "protobuf without header: $hex"
}

# run [-i STDIN] [-t SECONDS] [-e ENDPOINT] IDENTITY ARGS...: one step, recorded in $T.
run() {
    local input= limit=20 ep=$EP
    while :; do
        case $1 in
            -i) input=$2; shift 2 ;;
            -t) limit=$2; shift 2 ;;
            -e) ep=$2; shift 2 ;;
            *) break ;;
        esac
    done
    local who=$1
    shift
    local -a flags
    read -r -a flags <<<"$(identity "$who")"
    printf '### [%s] %s\n' "$who" "$*" >>"$T"
    printf '%s' "$input" | timeout -s INT "$limit" "$CTL" --endpoints="$ep" "${flags[@]}" "$@" \
        >"$WORK/o" 2>"$WORK/e"
    local rc=$?
    if [[ " $* " == *" protobuf "* ]]; then
        protobuf_body "$WORK/o" >>"$T"
    else
        cat "$WORK/o" >>"$T"
    fi
    echo "--- stderr" >>"$T"
    # etcdctl's retry warnings are JSON log lines; they are not part of the interface.
    grep -v '^{"level"' "$WORK/e" >>"$T"
    echo "--- rc=$rc" >>"$T"
}

# The scenario. Refused connections use short timeouts: they end in "context deadline
# exceeded" after --command-timeout.
FAIL="--dial-timeout=1s --command-timeout=2s"
scenario() {
    # Auth off: user list is empty, auth disable succeeds, --user is ignored
    # (clientv3 drops "authentication is not enabled" from Authenticate).
    run root user list
    run root auth disable
    run root --user nobody:x put /ro/a 1
    run root --user nobody --password x get /ro/a
    run root auth enable
    # Users, roles, permissions.
    run root user add root --new-user-password=rootpw
    run root user add root --new-user-password=rootpw
    run root auth enable extra
    run root role add root
    run root user grant-role root root
    run root role add ro
    run root role grant-permission ro read /ro/ --prefix
    run root role grant-permission ro write /rw/ /rx
    run root role grant-permission ro readwrite /from --from-key
    run root role grant-permission ro readwrite /exact
    run root role grant-permission ro bogus /ro/
    run root role grant-permission ro read /ro/ --prefix --from-key
    run root role grant-permission ro read /ro/ /ro9 --prefix
    run root role grant-permission ro read
    run root role get ro
    run root role get ro -w json
    run root role get ro -w fields
    run root role get ro -w protobuf
    run root role get missing
    run root role list
    run root role list -w json
    run root role list -w fields
    run root role revoke-permission ro /rw/ /rx
    run root role revoke-permission ro /from --from-key
    run root role revoke-permission ro /exact
    run root role revoke-permission ro /nothing
    run root user add alice:alicepw
    run root user add :pw
    run root user add
    run -i $'bobpw\n' root user add bob --interactive=false
    run root user add carol --no-password
    run root user grant-role alice ro
    run root user grant-role alice missing
    run root user get alice
    run root user get alice --detail
    run root user get alice --detail -w json
    run root user get alice -w json
    run root user get alice -w fields
    run root user get missing
    run root user list
    run root user list -w json
    run root user list -w table
    run root user delete bob
    run root user delete bob
    run root put /ro/a 1
    run root put /other x
    # Auth on.
    run root auth enable
    run root auth enable
    run nobody get /ro/a
    run nobody --user alice:wrong get /ro/a
    run nobody --user missing:pw get /ro/a
    run nobody --user alice:alicepw get /ro/a
    run nobody --user alice:alicepw get /ro/ --prefix -w json
    run nobody --user alice:alicepw get /other
    run nobody --user alice:alicepw get "" --from-key
    run nobody --user alice:alicepw put /ro/b 2
    run nobody --user alice:alicepw put /other y
    run nobody --user alice:alicepw del /ro/a
    run -i $'value("/ro/a") = "1"\n\nget /ro/a\n\nget /ro/b\n' nobody --user alice:alicepw txn
    run -i $'value("/ro/a") = "1"\n\nget /ro/a\n\nget /other\n' nobody --user alice:alicepw txn
    run -i $'value("/other") = "x"\n\nget /ro/a\n\n' nobody --user alice:alicepw txn
    run -i $'value("/ro/a") = "1"\n\nput /ro/a 2\n\n' nobody --user alice:alicepw txn
    run -t 2 nobody --user alice:alicepw watch /ro/a --rev=1
    run -t 2 nobody --user alice:alicepw watch /other
    run -t 2 nobody --user alice:alicepw watch /ro/ --prefix --rev=1
    run nobody --user alice:alicepw user list
    # A user may read their own entry and the roles they hold, nothing else.
    run nobody --user alice:alicepw user get alice
    run nobody --user alice:alicepw user get alice --detail
    run nobody --user alice:alicepw role get ro
    run nobody --user alice:alicepw user get root
    run nobody --user alice:alicepw role get root
    run nobody --user alice:alicepw auth disable
    run nobody --user root:rootpw user list
    run nobody --user root --password rootpw role list
    # A certificate's CN is the user when no --user is given.
    run alice get /ro/a
    run alice get /other
    run alice put /ro/c 3
    run root user list
    run root get /other
    # Role revocation.
    run root role revoke-permission ro /ro/ --prefix
    run nobody --user alice:alicepw get /ro/a
    run alice get /ro/a
    run -t 2 nobody --user alice:alicepw watch /ro/a --rev=1
    run root user revoke-role alice ro
    run root user revoke-role alice ro
    run root role grant-permission ro read /ro/ --prefix
    run alice get /ro/a
    run root user grant-role alice ro
    run alice get /ro/a
    run nobody --user alice:alicepw get /ro/a
    # A token that expires while the command runs (--auth-token-ttl=2): the unlock after the
    # sleep is refused with "invalid auth token", the client authenticates again and retries.
    run -t 10 nobody --user root:rootpw lock l sleep 3
    run -t 10 nobody --user alice:alicepw lock /ro/l sleep 3
    # Password change.
    run -i $'newpw\n' root user passwd alice --interactive=false
    run nobody --user alice:alicepw get /ro/a
    run nobody --user alice:newpw get /ro/a
    # TLS refusals and server verification.
    run nocert $FAIL get /ro/a
    run untrusted $FAIL get /ro/a
    run wrongca $FAIL get /ro/a
    run skipverify get /other
    run -e "${EP#https://}" root get /other
    run -e "${EP#https://}" none --insecure-transport=false $FAIL get /other
    run -e "${EP#https://}" none --insecure-transport=false --insecure-skip-tls-verify $FAIL get /other
    run none --insecure-skip-tls-verify $FAIL get /other
    run -e "http://${EP#https://}" root $FAIL get /other
    run mismatch get /other
    run keyonly get /other
    # The root user must keep the root role to enable auth.
    run root user revoke-role root root
    run root auth disable
    run root user revoke-role root root
    run root auth enable
    run root user get root
    run root role delete root
    run root auth enable
    run root user get root
    run root auth disable
    # Auth off again: users stay, --user is ignored, even with a wrong password.
    run root auth disable
    run root user list
    run root role list
    # No deadline on user and role requests (etcdctl's context.TODO()): stopped after 3 s.
    run -t 3 nocert $FAIL user list
    run nobody --user alice:wrong get /ro/a
    run nobody get /other
    run root role delete ro
    run root role delete ro
    run root user delete alice
    run root user delete carol
    run root user list
}

# transcript NAME SERVER_BINARY CLIENT: runs the scenario on a fresh server; sets T.
transcript() {
    T=$WORK/$1.raw
    : >"$T"
    start_server "$1" "$2" || exit 2
    CTL=$3
    scenario
    stop_server
    sed -E \
        -e 's/"(cluster_id|member_id|raft_term|revision)":[0-9]+/"\1":N/g' \
        -e 's/^"(ClusterID|MemberID|RaftTerm|Revision)" : [0-9]+$/"\1" : N/' \
        -e 's/127\.0\.0\.1:[0-9]+/127.0.0.1:PORT/g' \
        -e "s#$WORK#WORK#g" \
        "$T" >"$WORK/$1.txt"
}

compare() {
    if diff -a -u "$WORK/$1.txt" "$WORK/$2.txt" >"$WORK/$1-vs-$2.diff"; then
        echo "PASS $1 vs $2 ($(grep -c '^###' "$WORK/$1.txt") steps)"
        return 0
    fi
    echo "FAIL $1 vs $2:"
    cat "$WORK/$1-vs-$2.diff"
    return 1
}

gen_certs "$CERTS" || {
    echo "openssl could not make the certificates" >&2
    exit 2
}
status=0
transcript etcd-etcdctl "$ETCD_BIN" "$ETCDCTL"
if [[ $MODE == etcd-vs-kvctl || $MODE == all ]]; then
    transcript etcd-kvctl "$ETCD_BIN" "$KVCTL"
    compare etcd-etcdctl etcd-kvctl || status=1
fi
if [[ $MODE == etcd-vs-kvd || $MODE == all ]]; then
    transcript kvd-etcdctl "$KVD_BIN" "$ETCDCTL"
    compare etcd-etcdctl kvd-etcdctl || status=1
fi
if [[ $MODE == all ]]; then
    transcript kvd-kvctl "$KVD_BIN" "$KVCTL"
    compare etcd-etcdctl kvd-kvctl || status=1
fi
exit $status
