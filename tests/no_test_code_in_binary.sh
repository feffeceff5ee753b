#!/usr/bin/env bash
# Fails when a release binary contains test-only code: the linearizability checker
# (kvd-testkit) or the WAL's simulated file system (kvd's `testkit` feature). Release builds
# keep line tables (`debug = 1`), so any function compiled from those files leaves its source
# path in the binary.
set -euo pipefail
status=0
for bin in "${@:-target/release/kvd}"; do
  for needle in kvd_testkit linearizability/ wal/simfs.rs; do
    if grep -a -q -F "$needle" "$bin"; then
      echo "FAIL: $bin contains test-only code ($needle)"
      status=1
    fi
  done
  # The check must be able to fail: a source path of shipped code is there.
  if ! grep -a -q -F "wal/flusher.rs" "$bin"; then
    echo "FAIL: $bin has no line tables; this check would see nothing"
    status=1
  fi
done
[ $status -eq 0 ] && echo "no test-only code in: ${*:-target/release/kvd}"
exit $status
