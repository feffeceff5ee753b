# Shared by the side-by-side scripts (source it): start, find and stop 3-member clusters of
# kvd or etcd on loopback. Member i of a cluster at BASE listens for clients on BASE+10*i,
# for peers on +1 and for metrics on +2; both systems export etcd's metric names, so the
# leader is found the same way for both. Set ROOT (the repository) before sourcing.

# Binaries, overridable from the environment.
TD=${CARGO_TARGET_DIR:-$ROOT/target}
KVD_BIN=${KVD_BIN:-$TD/release/kvd}
KVBENCH_BIN=${KVBENCH_BIN:-$TD/release/kvbench}
ETCD_BIN=${ETCD_BIN:-etcd}
ETCDCTL=${ETCDCTL:-etcdctl}

PIDS=()
declare -A MPID CLIENT METRICS

# cleanup: stops every member started so far (SIGTERM) and waits for them.
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  PIDS=()
}

# start_cluster SYSTEM BIN BASEPORT DIR: members m0..m2, data dirs and logs in DIR.
# Ports BASEPORT..BASEPORT+22. Callers keep them below 32768, Linux's ephemeral range: a
# client connection's local port once took a member's and the member could not start.
start_cluster() {
  local sys=$1 bin=$2 base=$3 dir=$4 ic="" i
  for i in 0 1 2; do
    ic+="${ic:+,}m$i=http://127.0.0.1:$((base + 10 * i + 1))"
  done
  for i in 0 1 2; do
    local c=$((base + 10 * i)) p=$((base + 10 * i + 1)) m=$((base + 10 * i + 2))
    local extra=()
    # ETCD_LOG_ARGS: etcd's logging flags (default: quiet JSON, as for throughput runs).
    [[ $sys == etcd ]] && read -ra extra <<<"${ETCD_LOG_ARGS---logger=zap --log-level=warn}"
    "$bin" --name "m$i" --data-dir "$dir/$sys-m$i.data" \
      --listen-client-urls "http://127.0.0.1:$c" --advertise-client-urls "http://127.0.0.1:$c" \
      --listen-peer-urls "http://127.0.0.1:$p" --initial-advertise-peer-urls "http://127.0.0.1:$p" \
      --listen-metrics-urls "http://127.0.0.1:$m" \
      --initial-cluster "$ic" --initial-cluster-state new --initial-cluster-token "bench-$sys" \
      "${extra[@]}" >"$dir/$sys-m$i.log" 2>&1 &
    PIDS+=($!)
    MPID[$sys,$i]=$!
    CLIENT[$sys,$i]="127.0.0.1:$c"
    METRICS[$sys,$i]="http://127.0.0.1:$m/metrics"
  done
}

# metric URL NAME: the value of an unlabelled metric.
metric() { curl -sf --max-time 1 "$1" | awk -v n="$2" '$1 == n { print $2 }'; }

# leader SYSTEM: index of the member that reports etcd_server_is_leader 1.
leader() {
  local i
  for i in 0 1 2; do
    [[ $(metric "${METRICS[$1,$i]}" etcd_server_is_leader 2>/dev/null) == 1 ]] && { echo "$i"; return 0; }
  done
  return 1
}

# wait_leader SYSTEM: waits up to 30 s for a leader, or exits.
wait_leader() {
  local t
  for t in $(seq 1 150); do
    if leader "$1" >/dev/null; then return 0; fi
    sleep 0.2
  done
  echo "$1: no leader after 30 s; logs in $OUT" >&2
  exit 1
}

# leader_now SYSTEM: the leader's index, waiting up to 30 s for one: leadership can move right
# after a cluster starts, between `wait_leader` and the next look, and a script under `set -e`
# would stop there without a word.
leader_now() {
  local t
  for t in $(seq 1 150); do
    leader "$1" && return 0
    sleep 0.2
  done
  echo "$1: no leader for 30 s; logs in $OUT" >&2
  return 1
}

# fresh_cluster SYSTEM DIR ETCD_BASE KVD_BASE: starts SYSTEM's cluster (ports from ETCD_BASE or
# KVD_BASE) with its data in DIR, waits for a leader, and sets LEADER (its index) and EP (its
# client address).
fresh_cluster() {
  local sys=$1 dir=$2 bin base
  if [[ $sys == etcd ]]; then bin=$ETCD_BIN base=$3; else bin=$KVD_BIN base=$4; fi
  mkdir -p "$dir"
  start_cluster "$sys" "$bin" "$base" "$dir"
  wait_leader "$sys"
  LEADER=$(leader_now "$sys")
  EP=${CLIENT[$sys,$LEADER]}
}

# require_etcd: exits unless etcd and etcdctl are found.
require_etcd() {
  local b
  for b in "$ETCD_BIN" "$ETCDCTL"; do
    command -v "$b" >/dev/null || { echo "$b not found (apt-get install -y etcd-server etcd-client)" >&2; exit 1; }
  done
}

# secs T0 T1: T1 - T0 (seconds, as `date +%s.%N` prints them), to two decimals.
secs() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.2f}')" "$1" "$2"; }

# peak_rss PID: samples VmRSS (KiB) every 50 ms until the file $OUT/stop exists; prints MiB.
peak_rss() {
  local pid=$1 peak=0 r
  while [[ ! -e $OUT/stop ]]; do
    r=$(awk '/VmRSS/ {print $2}' "/proc/$pid/status" 2>/dev/null || echo 0)
    ((r > peak)) && peak=$r
    sleep 0.05
  done
  echo $((peak / 1024))
}

# rss_mib PID [FIELD]: the process's VmRSS (or FIELD of /proc/PID/status, e.g. VmHWM) in MiB.
rss_mib() { echo $(($(awk -v f="${2:-VmRSS}:" '$1 == f {print $2}' "/proc/$1/status") / 1024)); }

# cpu_secs PID: the CPU time (user + system) the process has used so far, in seconds.
cpu_secs() {
  awk -v hz="$(getconf CLK_TCK)" '{ sub(/^.*\) /, ""); printf "%.2f\n", ($12 + $13) / hz }' "/proc/$1/stat"
}

# written_mib PID: the bytes the process has caused to be written to storage, in MiB.
written_mib() { echo $(($(awk '$1 == "write_bytes:" {print $2}' "/proc/$1/io") / 1048576)); }

# revision ENDPOINT: the store revision the member at ENDPOINT serves (empty if it does not).
revision() {
  "$ETCDCTL" --endpoints "$1" --command-timeout=2s endpoint status -w json 2>/dev/null |
    python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["Status"]["header"]["revision"])' 2>/dev/null || true
}

# prepare BIN...: exits unless etcd and etcdctl are found, builds the release BINs (kvd,
# kvbench, ...) unless SKIP_BUILD is set, and stops every member started when the script exits.
prepare() {
  require_etcd
  if [[ -z ${SKIP_BUILD:-} ]]; then
    local b args=()
    for b in "$@"; do args+=(--bin "$b"); done
    (cd "$ROOT" && cargo build --release "${args[@]}")
  fi
  trap cleanup EXIT
}
