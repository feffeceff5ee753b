#!/usr/bin/env bash
# CI step: the rolling-upgrade test (tests/upgrade.rs) from the previous release to this tree.
# Builds the newest releases.tsv entry that has a commit (cached between runs on one machine,
# see build_old.sh), then runs the ignored test against it.
#
#   bash tests/upgrade/ci.sh
#
# Environment: KVD_UPGRADE_FROM (a version or commit to upgrade from instead), and the test's
# knobs (KVD_UPGRADE_WRITES, KVD_UPGRADE_CLIENTS, KVD_UPGRADE_LEASES, KVD_UPGRADE_KEEP; see
# docs/testing.md). Exits non-zero if the build or the test fails; no kvd it started outlives it.
set -euo pipefail
cd "$(dirname "$0")/../.."

FROM=${KVD_UPGRADE_FROM:-$(awk -F'\t' '!/^#/ && NF >= 2 && $2 != "-" { v = $1 } END { print v }' releases.tsv)}
if [ -z "$FROM" ]; then
    echo "releases.tsv lists no release with a commit to upgrade from" >&2
    exit 1
fi
# The old build's log format, when it is a release (the test checks the mixed cluster at it).
OLD_FORMAT=$(awk -F'\t' -v v="$FROM" '!/^#/ && $1 == v { print $3 }' releases.tsv)
if [ -n "$OLD_FORMAT" ]; then
    export KVD_OLD_LOG_FORMAT=$OLD_FORMAT
fi

# The old commit comes from this clone's history; a shallow clone has to fetch it first.
COMMIT=$(awk -F'\t' -v v="$FROM" '!/^#/ && $1 == v { print $2 }' releases.tsv)
COMMIT=${COMMIT:-$FROM}
if ! git rev-parse --verify --quiet "$COMMIT^{commit}" >/dev/null \
    && [ "$(git rev-parse --is-shallow-repository)" = true ]; then
    echo "== rolling upgrade: shallow clone, fetching the history for $COMMIT"
    git fetch --quiet --unshallow || git fetch --quiet origin "$COMMIT" || true
fi

echo "== rolling upgrade: building $FROM"
eval "$(bash tests/upgrade/build_old.sh "$FROM")"
export KVD_OLD_BIN

# The members' data dirs are under this directory (the test's temp dirs), so that whatever
# happens to the test process (a panic unwinds and kills them; a signal does not), no member
# started here is left running: any process whose data dir is in it is killed on exit.
WORK=$(mktemp -d)
cleanup() {
    local p
    for p in /proc/[0-9]*; do
        if tr '\0' '\n' <"$p/cmdline" 2>/dev/null | grep -q "^--data-dir=$WORK/"; then
            kill -9 "${p#/proc/}" 2>/dev/null || true
        fi
    done
    rm -rf "$WORK"
}
trap cleanup EXIT

echo "== rolling upgrade: $FROM ($KVD_OLD_BIN) -> this tree"
TMPDIR=$WORK cargo test --test upgrade -- --ignored --nocapture
