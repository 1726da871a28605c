#!/usr/bin/env python3
"""TLS against --insecure-plaintext, same run, unshaped loopback (issue 16's speed check).

Two `hoardfs serve` processes export the same tree on 127.0.0.1, one with TLS (the
default) and one with --insecure-plaintext. For each, a fresh `--no-cache` mount reads:
- single stream: one 1 GiB file with 1 MiB reads;
- 64 readers: 64 files of 16 MiB at once, 128 KiB reads, over 4 mounts (16 each).
The server's page cache holds the files (they are read once first), and each run uses a
fresh mount, so every byte crosses the link (and the cipher) and nothing is served from
the client's page cache. The local page cache read of the same files is the ceiling.
Runs alternate TLS / plaintext; medians are reported with the TLS/plaintext ratio, and
the CPU time of every hoardfs process (server and clients together) per GiB read.
`--rate 1gbit` puts the servers in a network namespace behind a veth pair shaped with
tbf (seed000.py's link) instead of loopback. Run as root: python3 bench/tls.py
[--runs 5] [--rate 1gbit]. See doc/BENCHMARKS.md.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MiB = 1 << 20


def hoardfs_cpu():
    """CPU seconds (user + system) used so far by each running hoardfs process, by pid."""
    tick = os.sysconf("SC_CLK_TCK")
    cpu = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        if comm == "hoardfs":
            fields = stat[stat.rindex(")") + 2:].split()
            cpu[pid] = (int(fields[11]) + int(fields[12])) / tick
    return cpu


def cpu_since(before):
    """CPU seconds hoardfs processes used since `before` (a `hoardfs_cpu()`): what the
    ones alive then used since, plus all of what newer ones used (one that exited in
    between, e.g. an earlier mount's client, counts for nothing)."""
    now = hoardfs_cpu()
    return sum(c - before.get(pid, 0.0) for pid, c in now.items())


def spawn_server(binary, export, state, plaintext, listen="127.0.0.1:0", wrap=None):
    args = [binary, "serve", export, "--listen", listen, "--state-dir", state,
            "--allow-unauthenticated"]
    if plaintext:
        args.append("--insecure-plaintext")
    if wrap:
        args = wrap(*args)
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = p.stdout.readline()
    if not line.startswith("hoardfs: serving"):
        raise RuntimeError(f"server did not start: {line!r}")
    addr = line.rsplit(" on ", 1)[1].split()[0]
    fp = line.split("identity ")[1].rstrip(")\n") if "identity " in line else None
    return p, addr, fp


def mount(binary, addr, fp, mnt):
    os.makedirs(mnt, exist_ok=True)
    args = [binary, "mount", addr, mnt, "--no-cache", "--daemon"]
    args += ["--server-fingerprint", fp] if fp else ["--insecure-plaintext"]
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL)


def umount(mnt):
    for _ in range(50):
        if subprocess.run(["umount", mnt], stderr=subprocess.DEVNULL).returncode == 0:
            return
        time.sleep(0.1)
    raise RuntimeError(f"cannot unmount {mnt}")


def read_all(paths, bs, cpu=None):
    """Reads every path in its own process at once; returns elapsed seconds (and adds the
    hoardfs processes' CPU seconds to `cpu[0]`)."""
    c0 = hoardfs_cpu()
    t0 = time.perf_counter()
    procs = [subprocess.Popen(["dd", f"if={p}", "of=/dev/null", f"bs={bs}"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for p in paths]
    for p in procs:
        if p.wait() != 0:
            raise RuntimeError("a reader failed")
    took = time.perf_counter() - t0
    if cpu is not None:
        cpu[0] += cpu_since(c0)
    return took


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--binary", default=os.path.join(REPO, "target", "release", "hoardfs"))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--out", default=os.path.join(REPO, "bench", "out"))
    ap.add_argument("--rate", help="serve through a tbf-shaped veth pair at this rate (e.g. 1gbit)")
    a = ap.parse_args()
    listen, wrap = "127.0.0.1:0", None
    if a.rate:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import seed000
        seed000.clean_leftovers()
        seed000.setup_network(a.rate)
        listen, wrap = f"{seed000.SRV_IP}:0", seed000.in_ns
    work = tempfile.mkdtemp(prefix="tls-bench-", dir="/var/tmp")
    export = os.path.join(work, "export")
    os.makedirs(os.path.join(export, "many"))
    with open("/dev/urandom", "rb") as r:
        chunk = r.read(16 * MiB)
    with open(os.path.join(export, "big"), "wb") as f:
        for _ in range(64):
            f.write(chunk)
    for i in range(64):
        with open(os.path.join(export, "many", f"f{i:02}"), "wb") as f:
            f.write(chunk[i * 4096:] + chunk[:i * 4096])
    big = os.path.join(export, "big")
    many = [os.path.join(export, "many", f"f{i:02}") for i in range(64)]
    read_all([big] + many, "1M")  # server page cache warm
    servers = {}
    try:
        for name, plain in (("tls", False), ("plaintext", True)):
            servers[name] = spawn_server(a.binary, export, os.path.join(work, "state"), plain,
                                         listen, wrap)
        res = {k: {"single": [], "64 readers": []} for k in servers}
        cpu = {k: {"single": [0.0], "64 readers": [0.0]} for k in servers}
        local = {"single": [], "64 readers": []}
        for run in range(a.runs):
            local["single"].append(1024 * MiB / read_all([big], "1M") / 1e6)
            local["64 readers"].append(1024 * MiB / read_all(many, "128k") / 1e6)
            for name, (_, addr, fp) in servers.items():
                mnt = os.path.join(work, "mnt")
                mount(a.binary, addr, fp, mnt)
                res[name]["single"].append(
                    1024 * MiB / read_all([os.path.join(mnt, "big")], "1M", cpu[name]["single"]) / 1e6)
                umount(mnt)
                mnts = [os.path.join(work, f"m{i}") for i in range(4)]
                for m in mnts:
                    mount(a.binary, addr, fp, m)
                paths = [os.path.join(mnts[i % 4], "many", f"f{i:02}") for i in range(64)]
                res[name]["64 readers"].append(
                    1024 * MiB / read_all(paths, "128k", cpu[name]["64 readers"]) / 1e6)
                for m in mnts:
                    umount(m)
            print(f"run {run + 1}/{a.runs}: " + ", ".join(
                f"{n} {k} {v[k][-1]:.0f} MB/s" for n, v in res.items() for k in v), flush=True)
        out = {"runs": a.runs, "rate": a.rate or "loopback", "MB/s": {},
               "ratio tls/plaintext": {}, "CPU-s per GiB": {}}
        print(f"\nlink: {a.rate or 'loopback, unshaped'}; CPU-s/GiB: all hoardfs processes, "
              "server and clients together")
        print(f"{'workload':<12} {'local pgcache':>14} {'plaintext':>10} {'TLS':>10} "
              f"{'TLS/plain':>10} {'CPU plain':>10} {'CPU TLS':>10} {'TLS extra':>10}")
        for k in ("single", "64 readers"):
            med = {n: statistics.median(v[k]) for n, v in res.items()}
            loc = statistics.median(local[k])
            ratio = med["tls"] / med["plaintext"]
            per_gib = {n: cpu[n][k][0] / a.runs for n in cpu}
            out["MB/s"][k] = {"local": loc, **med}
            out["ratio tls/plaintext"][k] = ratio
            out["CPU-s per GiB"][k] = per_gib
            print(f"{k:<12} {loc:>14.0f} {med['plaintext']:>10.0f} {med['tls']:>10.0f} "
                  f"{ratio:>10.2f} {per_gib['plaintext']:>10.2f} {per_gib['tls']:>10.2f} "
                  f"{per_gib['tls'] - per_gib['plaintext']:>10.2f}")
        os.makedirs(a.out, exist_ok=True)
        name = f"tls-{a.rate}.json" if a.rate else "tls.json"
        with open(os.path.join(a.out, name), "w") as f:
            json.dump({"raw": res, "local": local, **out}, f, indent=1)
    finally:
        for p, _, _ in servers.values():
            p.terminate()
            p.wait()
        if a.rate:
            seed000.clean_leftovers()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
