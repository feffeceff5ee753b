#!/usr/bin/env bash
# Builds kvd and kvctl of an old commit of this clone into a cache that outlives the clone, for
# the rolling-upgrade test (tests/upgrade.rs), and prints where they are:
#
#   tests/upgrade/build_old.sh 0.1.0        # a version from releases.tsv
#   tests/upgrade/build_old.sh fbcc6ed      # or any commit in this clone's history
#   eval "$(tests/upgrade/build_old.sh 0.1.0)"   # sets KVD_OLD_BIN and KVCTL_OLD_BIN
#
# stdout is only `KVD_OLD_BIN=<path>` and `KVCTL_OLD_BIN=<path>` (shell-quoted); cargo's output
# goes to stderr. Cached binaries are reused: a commit is built once per machine.
#
# Layout of the cache ($KVD_UPGRADE_CACHE, default /var/cache/kvd-upgrade, else
# ~/.cache/kvd-upgrade when that is not writable):
#   src/<commit>/          the commit's tree (git archive), kept so a rebuild is incremental
#   target/                one CARGO_TARGET_DIR for every commit: crates.io dependencies that
#                          did not change between two commits are compiled once
#   <commit>/<profile>/    kvd and kvctl, copied out of target/ once the build succeeded
#
# Environment: KVD_UPGRADE_PROFILE=dev (default) or release. The dev profile is enough for a
# correctness test and builds in a fraction of the time: release builds of some commits use fat
# LTO and one codegen unit (several minutes more on a loaded machine).
#
# Needs only git and a Rust toolchain; cargo fetches the commit's locked dependencies if the
# local registry lacks them. Builds run under `nice -n 10`: CI machines are shared. A lock
# keeps two runs on one machine from building into the same cache at once.
set -euo pipefail

if [ $# -ne 1 ]; then
    echo "usage: $0 VERSION_OR_COMMIT   (a version in releases.tsv, or a commit)" >&2
    exit 2
fi
ROOT=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
WANT=$1
PROFILE=${KVD_UPGRADE_PROFILE:-dev}
case "$PROFILE" in
    dev) PROFILE_DIR=debug; PROFILE_FLAG=() ;;
    release) PROFILE_DIR=release; PROFILE_FLAG=(--release) ;;
    *) echo "KVD_UPGRADE_PROFILE must be dev or release, not '$PROFILE'" >&2; exit 2 ;;
esac

# A version names the commit in releases.tsv's second column; "-" there is the tree itself,
# which has no old build to make.
REV=$WANT
if [ -f "$ROOT/releases.tsv" ]; then
    listed=$(awk -F'\t' -v v="$WANT" '!/^#/ && $1 == v { print $2 }' "$ROOT/releases.tsv")
    if [ "$listed" = "-" ]; then
        echo "releases.tsv: $WANT is this tree (no commit); nothing to build" >&2
        exit 2
    fi
    [ -n "$listed" ] && REV=$listed
fi
if ! COMMIT=$(git -C "$ROOT" rev-parse --verify --quiet "$REV^{commit}"); then
    echo "$WANT: no such commit in $ROOT's history" >&2
    if [ "$(git -C "$ROOT" rev-parse --is-shallow-repository)" = true ]; then
        echo "  (this clone is shallow: 'git fetch --unshallow' first)" >&2
    fi
    exit 2
fi

CACHE=${KVD_UPGRADE_CACHE:-/var/cache/kvd-upgrade}
if [ -z "${KVD_UPGRADE_CACHE:-}" ] && ! mkdir -p "$CACHE" 2>/dev/null; then
    CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/kvd-upgrade
fi
mkdir -p "$CACHE"
OUT=$CACHE/$COMMIT/$PROFILE

print_paths() {
    printf 'KVD_OLD_BIN=%q\nKVCTL_OLD_BIN=%q\n' "$OUT/kvd" "$OUT/kvctl"
}

if [ -x "$OUT/kvd" ] && [ -x "$OUT/kvctl" ]; then
    echo "build_old: $WANT ($COMMIT, $PROFILE) is cached in $OUT" >&2
    print_paths
    exit 0
fi

exec 9>"$CACHE/lock"
echo "build_old: waiting for the cache lock ($CACHE/lock)" >&2
flock 9
# Another run may have built it while this one waited.
if [ -x "$OUT/kvd" ] && [ -x "$OUT/kvctl" ]; then
    print_paths
    exit 0
fi

SRC=$CACHE/src/$COMMIT
if [ ! -f "$SRC/.extracted" ]; then
    rm -rf "$SRC"
    mkdir -p "$SRC"
    # -m: files get the extraction time, not the commit's. cargo decides freshness of path
    # crates by mtime, and a commit's older timestamps could make it keep another build's output.
    git -C "$ROOT" archive --format=tar "$COMMIT" | tar -x -m -C "$SRC"
    touch "$SRC/.extracted"
fi

echo "build_old: building $WANT ($COMMIT, $PROFILE profile) in $SRC" >&2
start=$(date +%s)
(
    cd "$SRC"
    # The commit's own .cargo/config.toml applies (cargo reads it from the working directory).
    CARGO_TARGET_DIR=$CACHE/target nice -n 10 cargo build --locked "${PROFILE_FLAG[@]}" \
        --bin kvd --bin kvctl
) >&2
mkdir -p "$OUT.tmp"
cp "$CACHE/target/$PROFILE_DIR/kvd" "$CACHE/target/$PROFILE_DIR/kvctl" "$OUT.tmp/"
git -C "$ROOT" log -1 --format='%H %s' "$COMMIT" >"$OUT.tmp/COMMIT"
rm -rf "$OUT"
mv "$OUT.tmp" "$OUT"
echo "build_old: built in $(($(date +%s) - start)) s" >&2
print_paths
