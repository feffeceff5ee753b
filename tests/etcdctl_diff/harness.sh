# Sourced by the etcdctl scripts that start their own servers: a work dir, the processes they
# start (PID[name]=pid, each logging to $WORK/name.log), and what stops and reports them.
#   cleanup  kills every process in PID and removes $WORK (kept with KEEP_OUT=1); runs on exit
#   fail MSG prints MSG and the last lines of every log, then exits 1
#   step MSG prints a heading
#   start NAME BIN DATA_DIR [PEER_PORT] starts a one-member etcd or kvd (needs ETCDCTL)
# Also sources ports.sh (free_port).
WORK=$(mktemp -d)
declare -A PID
cleanup() {
    for n in "${!PID[@]}"; do
        kill -9 "${PID[$n]}" 2>/dev/null
    done
    for n in "${!PID[@]}"; do
        wait "${PID[$n]}" 2>/dev/null
    done
    if [[ ${KEEP_OUT:-} == 1 ]]; then
        echo "work dir kept: $WORK" >&2
    else
        rm -rf "$WORK"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

fail() {
    echo "FAIL: $*" >&2
    for n in "${!PID[@]}"; do
        echo "--- log of $n (last 15 lines)" >&2
        tail -n 15 "$WORK/$n.log" >&2
    done
    exit 1
}
step() { echo "== $*" >&2; }

# shellcheck source=ports.sh
source "$(dirname "${BASH_SOURCE[0]}")/ports.sh"

# start NAME BIN DATA_DIR [PEER_PORT]: a one-member server (etcd or kvd, same flags) on a fresh
# client port and PEER_PORT (fresh if not given: a restored member must use the peer URL its
# restore was given); sets EP to its client endpoint once it answers. Not to be called in
# $(...): the PID it records must reach cleanup.
start() {
    local n=$1 bin=$2 dir=$3 pp=${4:-}
    local cp
    cp=$(free_port)
    [[ -n $pp ]] || pp=$(free_port)
    "$bin" --name "$n" --data-dir "$dir" \
        --listen-client-urls "http://127.0.0.1:$cp" --advertise-client-urls "http://127.0.0.1:$cp" \
        --listen-peer-urls "http://127.0.0.1:$pp" --initial-advertise-peer-urls "http://127.0.0.1:$pp" \
        --initial-cluster "$n=http://127.0.0.1:$pp" >"$WORK/$n.log" 2>&1 &
    PID[$n]=$!
    local ep="127.0.0.1:$cp" ready=("$ETCDCTL" --endpoints "127.0.0.1:$cp" --command-timeout=1s)
    # START_USER: the user to log in as when the store has auth on.
    [[ -n ${START_USER:-} ]] && ready+=(--user "$START_USER")
    for _ in $(seq 1 100); do
        "${ready[@]}" get __none >/dev/null 2>&1 && break
        sleep 0.1
    done
    "${ready[@]}" get __none >/dev/null 2>&1 || fail "$n did not start"
    EP=$ep
}
