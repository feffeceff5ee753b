#!/usr/bin/env bash
# Fails when the release library or a release binary contains test-only code: the
# linearizability checker (the kvd-testkit crate) or the WAL's simulated file system (kvd's
# `testkit` feature). Release builds keep line tables (`debug = 1`), so code compiled from
# those files leaves its source path behind; the fault tests' peer dial override (raft/net/dial_override.rs)
# also leaves its environment variable's name. Snapshot files written, received and installed
# as older releases did (raft/sm/snapshot_file_install.rs, raft/sm/install_file.rs) are tests'
# only: kvd stages what it receives. sled's test hooks (third_party/sled/src/kvd_test_hooks.rs,
# enabled by the `testkit` feature) leave their module's name in the symbols. The linker already drops unreferenced functions
# from a binary, so the library is the stricter check: it holds every function compiled.
#
# Usage: tests/no_test_code_in_binary.sh [target-dir]   (default: target; build first with
#        cargo build --release --bin kvd --bin kvctl --bin kvbench)
set -euo pipefail
dir=${1:-target}/release
lib=$(ls -t "$dir"/deps/libkvd-*.rlib 2>/dev/null | head -1 || true)
[ -n "$lib" ] || { echo "FAIL: no release libkvd in $dir/deps"; exit 1; }
status=0
# check FILE PROBE: FILE must hold PROBE (a shipped source file, so the check can see) and no
# test-only source path or name.
check() {
  local f=$1 probe=$2 needle
  if ! grep -a -q -F "$probe" "$f"; then
    echo "FAIL: $f lacks $probe: no line tables, this check would see nothing"
    status=1
  fi
  for needle in linearizability/check.rs linearizability/model.rs wal/simfs.rs kvd_testkit raft/net/dial_override.rs \
    KVD_TEST_PEER_DIAL_OVERRIDE kvd_test_hooks raft/sm/snapshot_file_install.rs raft/sm/install_file.rs; do
    if grep -a -q -F "$needle" "$f"; then
      echo "FAIL: $f contains test-only code ($needle)"
      status=1
    fi
  done
}
check "$lib" wal/flusher.rs
for bin in kvd kvctl kvbench; do
  [ -e "$dir/$bin" ] && check "$dir/$bin" "cmd/$bin/main.rs"
done
[ $status -eq 0 ] && echo "no test-only code in $lib or the binaries in $dir"
exit $status
