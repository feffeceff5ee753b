# Sourced by the etcdctl scripts that start their own servers: a work dir, the processes they
# start (PID[name]=pid, each logging to $WORK/name.log), and what stops and reports them.
#   cleanup  kills every process in PID and removes $WORK (kept with KEEP_OUT=1); runs on exit
#   fail MSG prints MSG and the last lines of every log, then exits 1
#   step MSG prints a heading
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
