#!/usr/bin/env python3
"""Summarises a bench_compare.sh output dir as Markdown (medians over rounds, kvd/etcd ratios)
and, when matplotlib is importable, draws qps and p99 against clients into benchmarks.png."""
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

out = Path(sys.argv[1])
# (system, test) -> [(qps, p50, p99, errors, fsyncs_per_write, cpu_us_per_op or None)]
runs = defaultdict(list)
for line in (out / "raw.tsv").read_text().splitlines():
    s, _r, test, qps, p50, p99, err, fpw, *cpu = line.split("\t")
    cpu = float(cpu[0]) if cpu else None  # older runs have no CPU column
    runs[(s, test)].append((float(qps), float(p50), float(p99), int(err), float(fpw), cpu))
rss = defaultdict(list)  # (system, member) -> [MiB]
for line in (out / "rss.tsv").read_text().splitlines():
    s, _r, m, v = line.split("\t")
    rss[(s, m)].append(float(v))

TESTS = ["put-1", "put-64", "put-256", "range-l-64", "range-s-64"]
rounds = len(runs[("kvd", "put-1")])


def med(s, t, k):
    return statistics.median(r[k] for r in runs[(s, t)])


def ratio(a, b):
    return f"{a / b:.2f}" if b else "n/a"


print(f"Medians over {rounds} rounds (latency in ms).\n")
print("| test | etcd qps | kvd qps | kvd/etcd qps | etcd p50 | kvd p50 | etcd p99 | kvd p99 | kvd/etcd p99 | errors etcd/kvd |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for t in TESTS:
    if (("etcd", t)) not in runs:
        continue
    eq, kq = med("etcd", t, 0), med("kvd", t, 0)
    e50, k50 = med("etcd", t, 1), med("kvd", t, 1)
    e99, k99 = med("etcd", t, 2), med("kvd", t, 2)
    ee = sum(r[3] for r in runs[("etcd", t)])
    ke = sum(r[3] for r in runs[("kvd", t)])
    print(f"| {t} | {eq:.0f} | {kq:.0f} | {ratio(kq, eq)} | {e50:.2f} | {k50:.2f} | {e99:.2f} | {k99:.2f} | {ratio(k99, e99)} | {ee}/{ke} |")

print("\nLeader WAL fsyncs per committed write (metrics delta / successful puts, median):\n")
print("| test | etcd | kvd |")
print("|---|---:|---:|")
for t in ["put-1", "put-64", "put-256"]:
    print(f"| {t} | {med('etcd', t, 4):.3f} | {med('kvd', t, 4):.3f} |")

if all(r[5] is not None for v in runs.values() for r in v):
    print("\nCPU time of the three members per operation (user + system, us, median; the client's")
    print("CPU is not counted):\n")
    print("| test | etcd | kvd | kvd/etcd |")
    print("|---|---:|---:|---:|")
    for t in TESTS:
        if ("etcd", t) in runs:
            e, k = med("etcd", t, 5), med("kvd", t, 5)
            print(f"| {t} | {e:.0f} | {k:.0f} | {ratio(k, e)} |")

print("\nRSS per member after each round (MiB, median over rounds):\n")
print("| system | m0 | m1 | m2 |")
print("|---|---:|---:|---:|")
for s in ["etcd", "kvd"]:
    cells = [f"{statistics.median(rss[(s, f'rss-m{i}')]):.1f}" for i in range(3)]
    print(f"| {s} | " + " | ".join(cells) + " |")

f = out / "fsync.json"
if f.exists():
    j = json.loads(f.read_text())
    lat = j["latency_ms"]
    print(f"\nDisk check (`kvbench fsync`, {j['count']} x {j['size']} B + fdatasync): "
          f"p50 {lat['p50']:.3f} ms, p99 {lat['p99']:.3f} ms, max {lat['max']:.3f} ms, "
          f"{j['syncs_per_sec']:.0f} syncs/s: {'within' if j['ok'] else 'outside'} etcd's p99 < 10 ms guidance.")

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    sys.exit(0)
fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
clients = [1, 64, 256]
for s, style in [("etcd", "o-"), ("kvd", "s-")]:
    a1.plot(clients, [med(s, f"put-{c}", 0) for c in clients], style, label=s)
    a2.plot(clients, [med(s, f"put-{c}", 2) for c in clients], style, label=s)
a1.set(xscale="log", xlabel="clients", ylabel="put qps", title="put throughput")
a2.set(xscale="log", xlabel="clients", ylabel="put p99 (ms)", title="put p99 latency")
for a in (a1, a2):
    a.set_xticks(clients, [str(c) for c in clients])
    a.grid(True, alpha=0.3)
    a.legend()
fig.tight_layout()
fig.savefig(out / "benchmarks.png", dpi=100)
print(f"\n(plot: {out / 'benchmarks.png'})", file=sys.stderr)
