#!/usr/bin/env bash
# The cost of TLS: put throughput of a 3-member kvd cluster and a 3-member etcd cluster, each
# without TLS and with client and peer mutual TLS (the same CA and certificates for both
# systems), driven by kvbench against the leader. Fresh clusters per run; the four
# configurations alternate within each round.
#
# Usage: benches/compare/bench_tls.sh [out-dir]
# Env:   ROUNDS (2) TOTAL (20000) CLIENTS (64) CONNS (16), and cluster.sh's binaries.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
. "$ROOT/benches/compare/cluster.sh"
ROUNDS=${ROUNDS:-2}
TOTAL=${TOTAL:-20000}
CLIENTS=${CLIENTS:-64}
CONNS=${CONNS:-16}
OUT=${1:-$(mktemp -d /tmp/bench_tls.XXXXXX)}
mkdir -p "$OUT"
trap cleanup EXIT

# One CA; one certificate for every member and the client (CN root), valid for 127.0.0.1.
P=$OUT/pki
mkdir -p "$P"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 7 -subj /CN=bench-ca \
  -keyout "$P/ca-key.pem" -out "$P/ca.pem" 2>/dev/null
for n in member client; do
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=${n/client/root}" \
    -keyout "$P/$n-key.pem" -out "$P/$n.csr" 2>/dev/null
  openssl x509 -req -in "$P/$n.csr" -CA "$P/ca.pem" -CAkey "$P/ca-key.pem" -CAcreateserial \
    -days 7 -out "$P/$n.pem" \
    -extfile <(printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n') \
    2>/dev/null
done

# start SYSTEM TLS(0|1) BASE DIR
start() {
  local sys=$1 tls=$2 base=$3 dir=$4 ic="" i s=http bin=$KVD_BIN
  [[ $sys == etcd ]] && bin=$ETCD_BIN
  [[ $tls == 1 ]] && s=https
  for i in 0 1 2; do ic+="${ic:+,}m$i=$s://127.0.0.1:$((base + 10 * i + 1))"; done
  for i in 0 1 2; do
    local c=$((base + 10 * i)) p=$((base + 10 * i + 1)) m=$((base + 10 * i + 2)) extra=()
    [[ $sys == etcd ]] && extra+=(--logger=zap --log-level=warn)
    [[ $tls == 1 ]] && extra+=(
      --cert-file "$P/member.pem" --key-file "$P/member-key.pem" --trusted-ca-file "$P/ca.pem"
      --client-cert-auth --peer-cert-file "$P/member.pem" --peer-key-file "$P/member-key.pem"
      --peer-trusted-ca-file "$P/ca.pem" --peer-client-cert-auth)
    "$bin" --name "m$i" --data-dir "$dir/m$i.data" \
      --listen-client-urls "$s://127.0.0.1:$c" --advertise-client-urls "$s://127.0.0.1:$c" \
      --listen-peer-urls "$s://127.0.0.1:$p" --initial-advertise-peer-urls "$s://127.0.0.1:$p" \
      --listen-metrics-urls "http://127.0.0.1:$m" \
      --initial-cluster "$ic" --initial-cluster-state new --initial-cluster-token "bench-$sys" \
      "${extra[@]}" >"$dir/m$i.log" 2>&1 &
    PIDS+=($!)
    MPID[$sys,$i]=$!
    CLIENT[$sys,$i]="$s://127.0.0.1:$c"
    METRICS[$sys,$i]="http://127.0.0.1:$m/metrics"
  done
}

printf 'system\ttls\tround\tqps\tp50_ms\tp99_ms\terrors\n' >"$OUT/raw.tsv"
for r in $(seq 1 "$ROUNDS"); do
  for cfg in "etcd 0" "kvd 0" "etcd 1" "kvd 1"; do
    read -r sys tls <<<"$cfg"
    dir=$OUT/$sys-tls$tls-r$r
    mkdir -p "$dir"
    start "$sys" "$tls" 23100 "$dir"
    wait_leader "$sys"
    l=""
    for _ in $(seq 1 50); do l=$(leader "$sys") && break; sleep 0.2; done
    ep=${CLIENT[$sys,$l]}
    args=(--endpoints "$ep" --cacert "$P/ca.pem" --cert "$P/client.pem" --key "$P/client-key.pem")
    "$KVBENCH_BIN" "${args[@]}" put --key-size 8 --val-size 256 --key-space-size 100000 \
      --clients "$CLIENTS" --conns "$CONNS" --total 2000 >/dev/null 2>&1
    "$KVBENCH_BIN" "${args[@]}" --json put --key-size 8 --val-size 256 --key-space-size 100000 \
      --clients "$CLIENTS" --conns "$CONNS" --total "$TOTAL" >"$dir/put.json"
    python3 - "$dir/put.json" "$sys" "$tls" "$r" >>"$OUT/raw.tsv" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
print("\t".join(map(str, sys.argv[2:5] + [round(j["qps"]), j["latency_ms"]["p50"],
                                          j["latency_ms"]["p99"], j["errors"]])))
PY
    tail -1 "$OUT/raw.tsv" >&2
    cleanup
    rm -rf "$dir"/m*.data
  done
done
echo "raw: $OUT/raw.tsv" >&2
