#!/usr/bin/env python3
"""Compare two builds of batchwire in one sitting, with alternating runs.

    scripts/ab.py OLD_BINARY NEW_BINARY --rounds 5 -- bench throughput --bundler natural --size 100

Runs `OLD ARGS --runs 1 --quiet --json F` and `NEW ARGS ...` in turn, ROUNDS times each
(old, new, old, new, ...), and prints per result (scenario, bundler, size) the median and
min-max of each build and the ratio of the medians; for throughput also the CPU time per
message of both processes (`CPU ns/msg`: what a message costs, not how fast the run went;
on a shared VM it swings about as much as the rate). Build the old one from an earlier
commit in a worktree, e.g.

    git worktree add /tmp/prev COMMIT && (cd /tmp/prev && cargo build --release)
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile


def run(binary, args, out):
    cmd = [binary] + args + ["--runs", "1", "--quiet", "--json", out]
    res = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if res.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{res.stderr}")
    with open(out) as f:
        return json.load(f)["results"]


def key(r):
    """What makes two rows the same measurement: rows at another idle level, over another
    link or pinned elsewhere are kept apart (a single median of them would mean nothing)."""
    label = r["bundler"]
    if r["scenario"] == "rpc":
        label += f" {r['nodes']}x{r['threads']}"
    if r.get("idle_cpu_level") not in (None, 1):
        label += f" idle {r['idle_cpu_level']}"
    if r.get("link"):
        label += f" {r['link']}"
    if r.get("pinned"):
        label += f" pinned {r['pinned']}"
    return (r["scenario"], label, r.get("size"))


def fmt(v, unit):
    if unit == "ms":
        return f"{v:.2f}"
    for div, suffix in ((1e6, " M"), (1e3, " k")):
        if v >= div:
            return f"{v / div:.2f}{suffix}"
    return f"{v:.1f}"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("old")
    p.add_argument("new")
    p.add_argument("--rounds", type=int, default=5)
    argv = sys.argv[1:]
    if "--" not in argv:
        p.error("give the batchwire arguments after --")
    cut = argv.index("--")
    a = p.parse_args(argv[:cut])
    args = argv[cut + 1:]
    figures = {"old": {}, "new": {}}
    latency = {"old": {}, "new": {}}
    cpu = {"old": {}, "new": {}}
    units = {}
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "r.json")
        for i in range(a.rounds):
            for which, binary in (("old", a.old), ("new", a.new)):
                for r in run(binary, args, out):
                    if r.get("verification_failed") or any(r.get(k, 0) for k in ("lost", "duplicated", "reordered")):
                        sys.exit(f"{binary}: {key(r)} failed its checks (lost, duplicated or reordered)")
                    figures[which].setdefault(key(r), []).append(r["median"])
                    units[key(r)] = r["unit"]
                    if r.get("p50_us") is not None:
                        lat = latency[which].setdefault(key(r), {"p50": [], "p99": []})
                        lat["p50"].append(r["p50_us"])
                        lat["p99"].append(r["p99_us"])
                    if r.get("cpu_ns_per_msg") is not None:
                        cpu[which].setdefault(key(r), []).append(r["cpu_ns_per_msg"])
                print(f"round {i + 1}/{a.rounds} {which} done", file=sys.stderr)
    print(f"{'scenario':<12} {'bundler':<22} {'size':>6}  {'old median (min-max)':>28}  {'new median (min-max)':>28}  new/old")
    for k in sorted(figures["old"], key=str):
        o, n = figures["old"][k], figures["new"].get(k, [])
        if not n:
            continue
        u = units[k]
        mo, mn = statistics.median(o), statistics.median(n)
        so = f"{fmt(mo, u)} ({fmt(min(o), u)}-{fmt(max(o), u)})"
        sn = f"{fmt(mn, u)} ({fmt(min(n), u)}-{fmt(max(n), u)})"
        print(f"{k[0]:<12} {k[1]:<22} {str(k[2]):>6}  {so:>28}  {sn:>28}  {mn / mo:6.2f} {u}")
        lo, ln = latency["old"].get(k), latency["new"].get(k)
        if lo and ln:
            for p in ("p50", "p99"):
                a, b = statistics.median(lo[p]), statistics.median(ln[p])
                print(f"{'':<12} {'  latency ' + p + ' us':<22} {'':>6}  {a:>28.1f}  {b:>28.1f}  {b / a:6.2f}")
        co, cn = cpu["old"].get(k), cpu["new"].get(k)
        if co and cn:
            # CPU time per message of both processes.
            a, b = statistics.median(co), statistics.median(cn)
            so = f"{a:.0f} ({min(co):.0f}-{max(co):.0f})"
            sn = f"{b:.0f} ({min(cn):.0f}-{max(cn):.0f})"
            print(f"{'':<12} {'  CPU ns/msg':<22} {'':>6}  {so:>28}  {sn:>28}  {b / a:6.2f}")


if __name__ == "__main__":
    main()
