#!/usr/bin/env python3
"""Summarises benches/compare/scale.sh's scale.tsv as a Markdown table, one row per size and
measure, etcd and kvd side by side with the kvd/etcd ratio (RSS: the members' maximum)."""
import sys
from collections import defaultdict

COLS = ["system", "n", "load_qps", "rss_load", "disk", "keys", "list_s", "rss_serve",
        "serve_qps", "restart_s", "rss_restart"]
rows = defaultdict(dict)  # n -> system -> {col: value}
for line in open(sys.argv[1]).read().splitlines():
    r = dict(zip(COLS, line.split("\t")))
    rows[int(r["n"])][r["system"]] = r

MEASURES = [("load_qps", "load throughput (puts/s, 64 clients)"),
            ("rss_load", "RSS per member after the load (MiB, max)"),
            ("disk", "data dir per member (MiB, max)"),
            ("keys", "distinct keys"),
            ("list_s", "full paginated listing (s)"),
            ("rss_serve", "peak RSS per member while 64 clients put (MiB, max)"),
            ("serve_qps", "puts/s meanwhile"),
            ("restart_s", "restart until a linearizable get (s)"),
            ("rss_restart", "RSS per member after the restart (MiB, max)")]


def value(r, col):
    v = r[col]
    return max(float(x) for x in v.split(",")) if "," in v else float(v)


print("| puts | measure | etcd 3.4 | kvd | kvd/etcd |")
print("|---|---|---|---|---|")
for n in sorted(rows):
    e, k = rows[n].get("etcd"), rows[n].get("kvd")
    for col, label in MEASURES:
        ev = e[col] if e else "-"
        kv = k[col] if k else "-"
        ratio = f"{value(k, col) / value(e, col):.2f}" if e and k and value(e, col) else "-"
        print(f"| {n:,} | {label} | {ev} | {kv} | {ratio} |")
