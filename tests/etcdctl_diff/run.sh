#!/usr/bin/env bash
# Differential test: runs tests/etcdctl_diff/commands.txt against two endpoints and diffs the
# normalised outputs (stdout, stderr, trailing newline, exit code of every command).
#
#   run.sh ENDPOINT_A ENDPOINT_B
#
# Both stores must be fresh (the outputs contain revisions). Environment:
#   CTL_A, CTL_B  client for each side (default: etcdctl; e.g. CTL_B=target/debug/kvctl to
#                 compare kvctl with etcdctl)
#   COMMANDS      command file (default: commands.txt next to this script)
#   KEEP_OUT=1    keep the raw and normalised outputs (their directory is printed)
#   CMD_TIMEOUT   seconds after which a single command is killed (default 30; exit 124)
#
# Command file syntax: one etcdctl command line per line, in shell quoting, without the
# `etcdctl --endpoints=...` prefix. Blank lines and lines starting with '#' are ignored.
# A line may end with a stdin marker:
#   <<EOF         the following lines, up to a line `EOF`, are the command's stdin
#   <<BYTES:N     stdin is N bytes of 'a' (for values too large for a command line)
#   <<TXNGETS:N   stdin is a txn without compares whose success branch has N `get a` requests
#   <<TIMEOUT:S   no stdin; the command is stopped after S seconds (for watches, which run on)
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
if [[ $# -ne 2 ]]; then
    echo "usage: $0 ENDPOINT_A ENDPOINT_B" >&2
    exit 2
fi
EP_A=$1
EP_B=$2
CTL_A=${CTL_A:-etcdctl}
CTL_B=${CTL_B:-etcdctl}
COMMANDS=${COMMANDS:-$HERE/commands.txt}
export ETCDCTL_API=3
unset ETCDCTL_ENDPOINTS ETCDCTL_WRITE_OUT ETCDCTL_HEX

OUT=$(mktemp -d)
if [[ ${KEEP_OUT:-} == 1 ]]; then
    echo "outputs kept in $OUT" >&2
else
    trap 'rm -rf "$OUT"' EXIT
fi

# run_all CTL ENDPOINT OUTFILE
run_all() {
    local ctl=$1 ep=$2 out=$3 line cmd marker n=0 rc
    local stdin_file=$OUT/stdin o=$OUT/o e=$OUT/e
    : >"$out"
    while IFS= read -r line <&3 || [[ -n $line ]]; do
        [[ -z ${line//[[:space:]]/} || $line == \#* ]] && continue
        n=$((n + 1))
        cmd=$line
        marker=
        if [[ $line =~ ^(.*[^[:space:]])[[:space:]]+\<\<([A-Z]+(:[0-9]+)?)$ ]]; then
            cmd=${BASH_REMATCH[1]}
            marker=${BASH_REMATCH[2]}
        fi
        : >"$stdin_file"
        local limit=${CMD_TIMEOUT:-30}
        case $marker in
            "") ;;
            EOF)
                local l
                while IFS= read -r l <&3 && [[ $l != EOF ]]; do
                    printf '%s\n' "$l" >>"$stdin_file"
                done
                ;;
            BYTES:*) head -c "${marker#BYTES:}" /dev/zero | tr '\0' a >"$stdin_file" ;;
            TXNGETS:*)
                {
                    printf '\n'
                    for ((i = 0; i < ${marker#TXNGETS:}; i++)); do printf 'get a\n'; done
                    printf '\n\n'
                } >"$stdin_file"
                ;;
            TIMEOUT:*) limit=${marker#TIMEOUT:} ;;
            *) echo "unknown stdin marker $marker" >&2; exit 2 ;;
        esac
        local -a args
        eval "args=($cmd)"
        # etcdctl's txn has no deadline: bound every command so a stuck server cannot hang the run.
        # shellcheck disable=SC2086
        timeout "$limit" $ctl --endpoints="$ep" "${args[@]}" <"$stdin_file" >"$o" 2>"$e"
        rc=$?
        {
            printf '### %d: %s\n' "$n" "$line"
            cat "$o"
            if [[ -s $o && $(tail -c1 "$o" | od -An -c | tr -d ' ') != '\n' ]]; then
                printf '\n--- (no newline at end of stdout)\n'
            fi
            echo "--- stderr"
            # etcdctl's client library logs retries as JSON lines; they are not command output.
            grep -v '^{"level":' "$e"
            echo "--- exit $rc"
        } >>"$out"
    done 3<"$COMMANDS"
}

# Masks what legitimately differs between two stores: ids, ports, versions, raft terms and
# indexes, database sizes and timings.
normalise() {
    sed -E \
        -e 's#(127\.0\.0\.1|localhost):[0-9]+#HOST:PORT#g' \
        -e 's#"(cluster_id|member_id|ID|leader)":[0-9]+#"\1":ID#g' \
        -e 's#"(raft_term|raftTerm|raftIndex|raftAppliedIndex|dbSize|dbSizeInUse)":[0-9]+#"\1":N#g' \
        -e 's#"version":"[^"]*"#"version":"V"#g' \
        -e 's#"(ClusterID|MemberID|ID|Leader)" : [0-9]+#"\1" : ID#' \
        -e 's#"(RaftTerm|RaftIndex|RaftAppliedIndex|DBSize)" : [0-9]+#"\1" : N#' \
        -e 's#^"Version" : "[^"]*"#"Version" : "V"#' \
        -e 's#"took":"[^"]*"#"took":"T"#g' \
        -e 's#^"Took" : .*#"Took" : T#' \
        -e 's#took = .*#took = T#' \
        -e '/^[^{[]/s#\b[0-9a-f]{8,16}\b#ID#g' \
        -e 's#^([^ ,]+), ID, [^,]*, [0-9.]+ [kMGTPE]?B, (true|false), (true|false), [0-9]+, [0-9]+, [0-9]+, #\1, ID, V, SIZE, \2, \3, N, N, N, #' \
        -e '/^[+|]/s#-+#-#g' \
        -e '/^[+|]/s# +# #g' \
        -e '/^\|/s#\b[0-9]+\.[0-9]+\.[0-9]+\b#V#g' \
        -e '/^\|/s#\| [0-9.]+ [kMGTPE]?B \|#| SIZE |#g' \
        -e '/^\|/s#\| (true|false) \| (true|false) \| [0-9]+ \| [0-9]+ \| [0-9]+ \|#| \1 | \2 | N | N | N |#' \
        -e '/^\|/s#\| [0-9.]+(ns|µs|ms|s) \|#| T |#g'
}

run_all "$CTL_A" "$EP_A" "$OUT/a.raw"
run_all "$CTL_B" "$EP_B" "$OUT/b.raw"
normalise <"$OUT/a.raw" >"$OUT/a.txt"
normalise <"$OUT/b.raw" >"$OUT/b.txt"
if diff -u --label "A: $CTL_A $EP_A" --label "B: $CTL_B $EP_B" "$OUT/a.txt" "$OUT/b.txt"; then
    echo "etcdctl_diff: no differences ($(grep -c '^### ' "$OUT/a.txt") commands)"
    exit 0
fi
echo "etcdctl_diff: outputs differ" >&2
exit 1
