#!/usr/bin/env python3
"""Plots benches/compare/scale.sh's scale.tsv files as one SVG of small multiples: for each
measure, etcd's and kvd's values against the number of puts (log scale), so growth can be
compared at a glance. Several scale.tsv files (runs at different sizes) may be given; a size
measured twice keeps its last row. goals.sh's goals.tsv (long form: system, n, measure, value)
may be given too; a measure with no value in any file gets no panel. Standard library only.

Usage: scale_plot.py OUT.svg scale.tsv|goals.tsv [...]
"""
import math
import sys

COLS = ["system", "n", "load_qps", "rss_load", "disk", "keys", "list_s", "rss_serve",
        "serve_qps", "restart_s", "rss_restart"]
MEASURES = [("load_qps", "load throughput (puts/s)"),
            ("rss_load", "RSS after the load (MiB, max member)"),
            ("rss_serve", "peak RSS while serving (MiB)"),
            ("rss_restart", "RSS after a restart (MiB)"),
            ("disk", "data dir (MiB)"),
            ("list_s", "full paginated listing (s)"),
            ("restart_s", "restart until a read (s)"),
            # goals.sh (long form)
            ("list1_s", "full listing, one member (s)"),
            ("page_first_p99_ms", "first page of 500, p99 (ms)"),
            ("page_last_p99_ms", "last page of 500, p99 (ms)"),
            ("compact_s", "compaction --physical (s)"),
            ("compact_put_p99_during_ms", "put p99 during compaction (ms)"),
            ("replace_s", "member replaced, promoted after (s)"),
            ("replace_new_peak_mib", "new member's peak RSS (MiB)"),
            ("replace_leader_p99_ms", "put p99 while the leader sends (ms)"),
            ("save_s", "backup save (s)"),
            ("save_follower_peak_mib", "follower peak RSS in a save (MiB)"),
            ("restore_s", "restore (s)"),
            ("restore_peak_mib", "restore peak RSS (MiB)"),
            ("defrag_s", "defragment after compaction (s)"),
            ("defrag_disk_after_mib", "data dir after defragment (MiB)")]
COLORS = {"etcd": "#1f77b4", "kvd": "#d62728"}
W, H, PAD = 300, 200, 40


def value(v):
    return max(float(x) for x in v.split(",")) if "," in v else float(v)


def load(paths):
    data = {}  # (system, measure) -> {n: value}
    for p in paths:
        for line in open(p).read().splitlines():
            f = line.split("\t")
            if len(f) == 4 and not f[2].replace(".", "").isdigit():
                # goals.tsv; its one-member listing is kept apart from scale.sh's 3 members
                m = "list1_s" if f[2] == "list_s" else f[2]
                data.setdefault((f[0], m), {})[int(f[1])] = float(f[3])
                continue
            r = dict(zip(COLS, f))
            for m, _ in MEASURES:
                if r.get(m):
                    data.setdefault((r["system"], m), {})[int(r["n"])] = value(r[m])
    return data


def panel(data, m, title, x0, y0, out):
    series = {s: sorted(data.get((s, m), {}).items()) for s in COLORS}
    pts = [p for s in series.values() for p in s]
    if not pts:
        return
    ns = [n for n, _ in pts]
    lo, hi = math.log10(min(ns)), math.log10(max(ns))
    hi = hi if hi > lo else lo + 1
    ymax = max(v for _, v in pts) * 1.1 or 1

    def xy(n, v):
        return (x0 + PAD + (math.log10(n) - lo) / (hi - lo) * (W - 2 * PAD),
                y0 + H - PAD - v / ymax * (H - 2 * PAD))

    out.append(f'<text x="{x0 + W / 2}" y="{y0 + 16}" text-anchor="middle" '
               f'font-size="12">{title}</text>')
    out.append(f'<line x1="{x0 + PAD}" y1="{y0 + H - PAD}" x2="{x0 + W - PAD}" '
               f'y2="{y0 + H - PAD}" stroke="black"/>')
    out.append(f'<line x1="{x0 + PAD}" y1="{y0 + PAD}" x2="{x0 + PAD}" '
               f'y2="{y0 + H - PAD}" stroke="black"/>')
    out.append(f'<text x="{x0 + PAD - 4}" y="{y0 + PAD + 4}" text-anchor="end" '
               f'font-size="10">{ymax:.0f}</text>')
    for n in sorted(set(ns)):
        x, _ = xy(n, 0)
        out.append(f'<text x="{x}" y="{y0 + H - PAD + 14}" text-anchor="middle" '
                   f'font-size="10">{n // 1000}k</text>')
    for s, pts in series.items():
        if not pts:
            continue
        path = " ".join(f"{x:.1f},{y:.1f}" for x, y in (xy(n, v) for n, v in pts))
        out.append(f'<polyline points="{path}" fill="none" stroke="{COLORS[s]}" '
                   f'stroke-width="2"/>')
        for n, v in pts:
            x, y = xy(n, v)
            out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{COLORS[s]}"/>')


def main():
    out_path, paths = sys.argv[1], sys.argv[2:]
    data = load(paths)
    measures = [(m, t) for m, t in MEASURES if any(k[1] == m for k in data)]
    cols = 3
    rows = (len(measures) + cols - 1) // cols
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{cols * W}" '
           f'height="{rows * H + 30}" font-family="sans-serif">',
           '<rect width="100%" height="100%" fill="white"/>']
    for k, (m, title) in enumerate(measures):
        panel(data, m, title, (k % cols) * W, 30 + (k // cols) * H, out)
    for k, (s, c) in enumerate(COLORS.items()):
        out.append(f'<rect x="{10 + k * 80}" y="8" width="12" height="12" fill="{c}"/>')
        label = "etcd 3.4" if s == "etcd" else s
        out.append(f'<text x="{26 + k * 80}" y="19" font-size="12">{label}</text>')
    out.append("</svg>")
    with open(out_path, "w") as f:
        f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
