#!/usr/bin/env bash
# Starts a fresh etcd and a fresh kvd on free loopback ports, waits until both answer, runs
# run.sh against them (etcd is side A, kvd side B) and stops both.
#
#   KVD_BIN=target/release/kvd tests/etcdctl_diff/start_pair.sh
#
# Environment: KVD_BIN (default target/release/kvd; kvd accepts etcd's flags, so
# KVD_BIN=$(command -v etcd) compares two etcds, which validates the script itself),
# ETCD_BIN (default etcd), ETCDCTL (default etcdctl, used for the readiness check), and
# CTL_A/CTL_B/COMMANDS/KEEP_OUT as for run.sh; RUN (default run.sh) is the script run against
# the pair, e.g. RUN=$HERE/gateway_diff.sh for the JSON gateway's differential test.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
KVD_BIN=${KVD_BIN:-$ROOT/target/release/kvd}
ETCD_BIN=${ETCD_BIN:-etcd}
ETCDCTL=${ETCDCTL:-etcdctl}
export ETCDCTL_API=3

WORK=$(mktemp -d)
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do
        kill "$pid" 2>/dev/null
    done
    for pid in "${PIDS[@]}"; do
        wait "$pid" 2>/dev/null
    done
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# shellcheck source=ports.sh
source "$HERE/ports.sh"

# start NAME BINARY -> sets CLIENT_URL and SERVER_PID
start() {
    local name=$1 bin=$2 client peer
    client=$(free_port)
    peer=$(free_port)
    USED+="$client $peer "
    mkdir -p "$WORK/$name"
    "$bin" --name node1 --data-dir "$WORK/$name/data" \
        --listen-client-urls "http://127.0.0.1:$client" \
        --advertise-client-urls "http://127.0.0.1:$client" \
        --listen-peer-urls "http://127.0.0.1:$peer" \
        --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
        --initial-cluster "node1=http://127.0.0.1:$peer" \
        >"$WORK/$name/log" 2>&1 &
    SERVER_PID=$!
    PIDS+=("$SERVER_PID")
    CLIENT_URL=127.0.0.1:$client
}

wait_ready() {
    local name=$1 ep=$2 pid=$3
    for _ in $(seq 1 60); do
        if ! kill -0 "$pid" 2>/dev/null; then
            echo "$name exited before becoming ready; its log:" >&2
            tail -n 30 "$WORK/$name/log" >&2
            exit 2
        fi
        if "$ETCDCTL" --endpoints="$ep" --command-timeout=1s endpoint health >/dev/null 2>&1; then
            return 0
        fi
        sleep 0.2
    done
    echo "$name at $ep did not become ready; its log:" >&2
    tail -n 30 "$WORK/$name/log" >&2
    exit 2
}

if [[ ! -x $KVD_BIN ]] && ! command -v "$KVD_BIN" >/dev/null; then
    echo "kvd binary not found: $KVD_BIN (set KVD_BIN)" >&2
    exit 2
fi
start etcd "$ETCD_BIN"
EP_A=$CLIENT_URL
PID_A=$SERVER_PID
start kvd "$KVD_BIN"
EP_B=$CLIENT_URL
PID_B=$SERVER_PID
wait_ready etcd "$EP_A" "$PID_A"
wait_ready kvd "$EP_B" "$PID_B"
echo "etcd at $EP_A, kvd ($KVD_BIN) at $EP_B" >&2
"${RUN:-$HERE/run.sh}" "$EP_A" "$EP_B"
