#!/usr/bin/env python3
"""batchwire beside a gRPC client stream, in one sitting, with alternating runs.

    scripts/grpc-ref/vs.py [--rounds 5] [--sizes 100,1000,10000] [--bundler natural] [--batchwire BIN]

Builds the reference (scripts/grpc-ref, tonic 0.14 on current-thread runtimes) if needed,
then for each size runs, ROUNDS times in turn: `batchwire bench throughput --bundler
BUNDLER,tcp --size S --runs 1` (the bundler, then the plain-TCP ceiling, each two
processes; the bench's message counts: about 300 MB or a million messages, and at least
4 GiB for tcp) and the gRPC pair (a fresh server process each round) with the bundler's
message count, its payloads built before the clock as batchwire's are, then again with
--fresh (each built as it is sent, which was faster for gRPC at 1 KB and 10 KB). Prints
per size the median msgs/s and min-max of each, and the ratios: batchwire / gRPC (the
faster of the two), and each / tcp (the socket's ceiling in the same round).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def messages(size):
    # As batchwire's bench picks them: about 300 MB or a million messages.
    return max(1000, min(1_000_000, 300_000_000 // size))


def batchwire(binary, bundler, size):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        # The bench's own message counts: n for the bundler, at least 4 GiB for tcp.
        cmd = [binary, "bench", "throughput", "--bundler", f"{bundler},tcp", "--size", str(size),
               "--runs", "1", "--quiet", "--json", f.name]
        r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if r.returncode != 0:
            sys.exit(f"{' '.join(cmd)} failed:\n{r.stderr}")
        rows = json.load(open(f.name))["results"]
    by = {row["bundler"]: row["median"] for row in rows}
    return by[bundler], by["tcp"]


def grpc(binary, size, n, port, fresh):
    server = subprocess.Popen([binary, "server", "--listen", f"127.0.0.1:{port}"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        r = subprocess.run([binary, "client", "--peer", f"127.0.0.1:{port}", "--messages", str(n),
                            "--size", str(size)] + (["--fresh"] if fresh else []),
                           capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            sys.exit(f"grpc-ref client failed:\n{r.stdout}{r.stderr}")
        # "grpc SIZE B: N msgs in T s = R msgs/s (...)"
        return float(r.stdout.split(" = ")[1].split()[0])
    finally:
        server.kill()
        server.wait()


def si(v):
    for div, s in ((1e6, " M"), (1e3, " k")):
        if v >= div:
            return f"{v / div:.2f}{s}"
    return f"{v:.0f}"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--sizes", default="100,1000,10000")
    p.add_argument("--bundler", default="natural")
    p.add_argument("--batchwire", default=os.path.join(ROOT, "target/release/batchwire"))
    p.add_argument("--port", type=int, default=7790)
    a = p.parse_args()
    if not os.path.exists(a.batchwire):
        sys.exit(f"no {a.batchwire}: cargo build --release -p batchwire-cli")
    subprocess.run(["cargo", "build", "--release", "--quiet"], cwd=HERE, check=True)
    ref = os.path.join(HERE, "target/release/grpc-ref")
    print(f"throughput one way, 2 processes on loopback, msgs/s: median (min-max) of {a.rounds} "
          f"alternating rounds ({a.bundler}, tcp, grpc twice each round); {time.strftime('%Y-%m-%d %H:%M')}")
    print(f"{'size':>6} {a.bundler:>24} {'grpc, payloads built':>24} {'grpc --fresh':>24} "
          f"{'tcp ceiling':>24} {'bw/grpc':>8} {'bw/tcp':>7} {'grpc/tcp':>8}")
    print("(bw/grpc and grpc/tcp take the faster of gRPC's two medians)")
    for size in [int(s) for s in a.sizes.split(",")]:
        n = messages(size)
        bw, tcp, gp, gf = [], [], [], []
        for _ in range(a.rounds):
            b, t = batchwire(a.batchwire, a.bundler, size)
            bw.append(b)
            tcp.append(t)
            gp.append(grpc(ref, size, n, a.port, False))
            gf.append(grpc(ref, size, n, a.port, True))
        med = {k: statistics.median(v) for k, v in (("bw", bw), ("gp", gp), ("gf", gf), ("tcp", tcp))}
        gr = max(med["gp"], med["gf"])
        cell = lambda v: f"{si(statistics.median(v))} ({si(min(v))}-{si(max(v))})"
        print(f"{size:>6} {cell(bw):>24} {cell(gp):>24} {cell(gf):>24} {cell(tcp):>24} "
              f"{med['bw'] / gr:>7.2f}x {med['bw'] / med['tcp']:>6.2f}x {gr / med['tcp']:>7.2f}x")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
