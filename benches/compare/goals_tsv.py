#!/usr/bin/env python3
"""Reads the logs benches/compare/goals.sh keeps (OUT/<bench>-<N>.log) and prints one line per
system, size and measure: `system<TAB>n<TAB>measure<TAB>value`, the long form scale_plot.py
reads beside scale.sh's scale.tsv. A measure taken in several rounds gives its median. Only the
systems named etcd and kvd are kept (A/B builds under other names are left to the logs).
Standard library only.

Usage: goals_tsv.py OUT              (the long form)
       goals_tsv.py --markdown OUT   (a table: measure, size, etcd, kvd, kvd/etcd)
"""
import glob
import os
import re
import statistics
import sys

SYSTEMS = ("etcd", "kvd")
NUM = r"([0-9.]+)"


def compaction(text):
    # | system | round | call (s) | p99 | max | p99 while the call ran | max | ...
    for line in text.splitlines():
        f = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(f) >= 7 and f[0] in SYSTEMS and f[1].isdigit():
            yield f[0], "compact_s", float(f[2])
            yield f[0], "compact_put_p99_during_ms", float(f[5])


def list_single(text):
    for s in SYSTEMS:
        for m in re.finditer(rf"^{s} list \d+: .*: {NUM} s$", text, re.M):
            yield s, "list_s", float(m.group(1))
        for which in ("first", "last"):
            for m in re.finditer(rf"^{s} page {which} \(writes\): p50 {NUM} p99 {NUM} ms", text,
                                 re.M):
                yield s, f"page_{which}_p99_ms", float(m.group(2))


def replace(text):
    pat = (rf"^(\w+) round \d+: .*promoted {NUM}s after the start; new member peak {NUM} MiB.*"
           rf"writer p99 {NUM} ms")
    for m in re.finditer(pat, text, re.M):
        if m.group(1) in SYSTEMS:
            yield m.group(1), "replace_s", float(m.group(2))
            yield m.group(1), "replace_new_peak_mib", float(m.group(3))
            yield m.group(1), "replace_leader_p99_ms", float(m.group(4))
    # Logs from before replace.sh reported CPU time have none.
    pat = rf"^(\w+) round \d+: .*, CPU {NUM}s; leader peak \d+ MiB, CPU {NUM}s meanwhile"
    for m in re.finditer(pat, text, re.M):
        if m.group(1) in SYSTEMS:
            yield m.group(1), "replace_new_cpu_s", float(m.group(2))
            yield m.group(1), "replace_leader_cpu_s", float(m.group(3))


def backup(text):
    for line in text.splitlines():
        f = line.split("\t")
        if len(f) == 9 and f[0] in SYSTEMS and f[1].isdigit():
            yield f[0], "save_s", float(f[2])
            yield f[0], "save_follower_peak_mib", float(f[5])
            restore_s, restore_peak = f[7].split("/")
            yield f[0], "restore_s", float(restore_s)
            yield f[0], "restore_peak_mib", float(restore_peak)


def defrag(text):
    pat = rf"^(\w+) round \d+: .*defrag {NUM}s;.*data dir {NUM} -> {NUM} MiB"
    for m in re.finditer(pat, text, re.M):
        if m.group(1) in SYSTEMS:
            yield m.group(1), "defrag_s", float(m.group(2))
            yield m.group(1), "defrag_disk_after_mib", float(m.group(4))


PARSERS = {"compaction": compaction, "list_single": list_single, "replace": replace,
           "backup": backup, "defrag": defrag}
# Each parser's measures, in the order the table shows them.
MEASURES = {
    compaction: ["compact_s", "compact_put_p99_during_ms"],
    list_single: ["list_s", "page_first_p99_ms", "page_last_p99_ms"],
    replace: ["replace_s", "replace_new_peak_mib", "replace_leader_p99_ms"],
    backup: ["save_s", "save_follower_peak_mib", "restore_s", "restore_peak_mib"],
    defrag: ["defrag_s", "defrag_disk_after_mib"],
}


def show(v):
    return "" if v is None else f"{v:g}"


def main():
    markdown = sys.argv[1] == "--markdown"
    out_dir = sys.argv[-1]
    values = {}  # (system, n, measure) -> [value]
    for path in sorted(glob.glob(os.path.join(out_dir, "*-*.log"))):
        bench, n = os.path.basename(path)[:-4].rsplit("-", 1)
        if bench not in PARSERS or not n.isdigit():
            continue
        for s, m, v in PARSERS[bench](open(path).read()):
            values.setdefault((s, int(n), m), []).append(v)
    median = {k: statistics.median(vs) for k, vs in values.items()}
    if not markdown:
        for (s, n, m), v in sorted(median.items(), key=lambda kv: (kv[0][2], kv[0][1], kv[0][0])):
            print(f"{s}\t{n}\t{m}\t{v:g}")
        return
    print("| measure | puts | etcd 3.4 | kvd | kvd/etcd |")
    print("|---|---:|---:|---:|---:|")
    order = [m for p in PARSERS.values() for m in MEASURES[p]]
    for m in order:
        for n in sorted({k[1] for k in median if k[2] == m}):
            e, k = median.get(("etcd", n, m)), median.get(("kvd", n, m))
            ratio = f"{k / e:.2f}" if e and k is not None else ""
            print(f"| {m} | {n:,} | {show(e)} | {show(k)} | {ratio} |")


if __name__ == "__main__":
    main()
