#!/usr/bin/env bash
# Issue 49's cost-at-scale figures at several sizes, side by side with etcd 3.4: for each N in
# SIZES, the benches below in turn (one after another: they share the machine), each one's
# output kept as OUT/<bench>-<N>.log, then OUT/goals.tsv (goals_tsv.py) for scale_plot.py.
#   compaction   3 members, N puts of 1 KiB over N keys, `compaction --physical`, a 1-client
#                writer at 200 puts/s through it (benches/compare/compaction.sh)
#   list_single  one member, N puts over N random keys, full listings and single pages of 500
#                (benches/compare/list_single.sh)
#   replace      3 members, N keys of 1 KiB, a follower replaced by an empty learner promoted as
#                soon as allowed, a writer on the leader (benches/compare/replace.sh)
#   backup       3 members, N puts over N keys, a backup saved from a follower under puts,
#                then restored (benches/compare/backup.sh)
#   defrag       one member, N puts over N/2 keys, `compaction --physical`, defragment
#                (benches/compare/defrag.sh)
# A bench whose log already ends with "RC=0" is not run again, so an interrupted run resumes.
#
# Usage: benches/compare/goals.sh OUT
# Env:   SIZES ("100000 300000 1000000") BENCHES ("compaction list_single replace backup
#        defrag") and what the benches take (KVD_BIN, ETCD_BIN, ...); builds unless SKIP_BUILD=1
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${1:?usage: goals.sh OUT}
SIZES=${SIZES:-100000 300000 1000000}
BENCHES=${BENCHES:-compaction list_single replace backup defrag}
mkdir -p "$OUT"
if [[ -z ${SKIP_BUILD:-} ]]; then
  (cd "$ROOT" && cargo build --release --bin kvd --bin kvctl --bin kvbench) || exit 1
fi
export SKIP_BUILD=1
TD=${CARGO_TARGET_DIR:-$ROOT/target}

run() { # bench n command...
  local log="$OUT/$1-$2.log"
  if [[ -f $log ]] && tail -1 "$log" | grep -qx 'RC=0'; then
    echo "$1 at $2: done before, kept" >&2
    return
  fi
  echo "$1 at $2: started $(date -u +%H:%M:%S) UTC" >&2
  shift 2
  "$@" >"$log" 2>&1
  echo "RC=$?" >>"$log"
}

for n in $SIZES; do
  during=6000
  ((n > 300000)) && during=10000
  for b in $BENCHES; do
    case $b in
      compaction)
        run "$b" "$n" env PHYSICAL=1 VAL=1024 PUTS="$n" KEYS="$n" DURING_RATE=200 \
          DURING_PUTS="$during" "$ROOT/benches/compare/compaction.sh" "$OUT/$b-$n" ;;
      list_single)
        run "$b" "$n" env ORDER=random N="$n" PAGES=500 KVBENCH_BIN="$TD/release/kvbench" \
          SYSTEMS="etcd=${ETCD_BIN:-etcd} kvd=${KVD_BIN:-$TD/release/kvd}" \
          "$ROOT/benches/compare/list_single.sh" ;;
      replace)
        run "$b" "$n" env KEYS="$n" "$ROOT/benches/compare/replace.sh" "$OUT/$b-$n" ;;
      backup)
        run "$b" "$n" env PUTS="$n" KEYS="$n" "$ROOT/benches/compare/backup.sh" "$OUT/$b-$n" ;;
      defrag)
        run "$b" "$n" env PUTS="$n" KEYS=$((n / 2)) "$ROOT/benches/compare/defrag.sh" "$OUT/$b-$n" ;;
      *) echo "unknown bench $b" >&2; exit 2 ;;
    esac
  done
done
python3 "$ROOT/benches/compare/goals_tsv.py" "$OUT" >"$OUT/goals.tsv"
echo "table: $OUT/goals.tsv" >&2
