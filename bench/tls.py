#!/usr/bin/env python3
"""TLS against --insecure-plaintext, same run, unshaped loopback (issue 16's speed check).

Two `hoardfs serve` processes export the same tree on 127.0.0.1, one with TLS (the
default) and one with --insecure-plaintext. For each, a fresh `--no-cache` mount reads:
- single stream: one 1 GiB file with 1 MiB reads;
- 64 readers: 64 files of 16 MiB at once, 128 KiB reads, over 4 mounts (16 each).
The server's page cache holds the files (they are read once first), and each run uses a
fresh mount, so every byte crosses the link (and the cipher) and nothing is served from
the client's page cache. The local page cache read of the same files is the ceiling.
Runs alternate TLS / plaintext; medians are reported with the TLS/plaintext ratio.
Run as root: python3 bench/tls.py [--runs 5]. See doc/BENCHMARKS.md.
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


def spawn_server(binary, export, state, plaintext):
    args = [binary, "serve", export, "--listen", "127.0.0.1:0", "--state-dir", state]
    if plaintext:
        args.append("--insecure-plaintext")
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


def read_all(paths, bs):
    """Reads every path in its own process at once; returns elapsed seconds."""
    t0 = time.perf_counter()
    procs = [subprocess.Popen(["dd", f"if={p}", "of=/dev/null", f"bs={bs}"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for p in paths]
    for p in procs:
        if p.wait() != 0:
            raise RuntimeError("a reader failed")
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--binary", default=os.path.join(REPO, "target", "release", "hoardfs"))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--out", default=os.path.join(REPO, "bench", "out"))
    a = ap.parse_args()
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
            servers[name] = spawn_server(a.binary, export, os.path.join(work, "state"), plain)
        res = {k: {"single": [], "64 readers": []} for k in servers}
        local = {"single": [], "64 readers": []}
        for run in range(a.runs):
            local["single"].append(1024 * MiB / read_all([big], "1M") / 1e6)
            local["64 readers"].append(1024 * MiB / read_all(many, "128k") / 1e6)
            for name, (_, addr, fp) in servers.items():
                mnt = os.path.join(work, "mnt")
                mount(a.binary, addr, fp, mnt)
                res[name]["single"].append(1024 * MiB / read_all([os.path.join(mnt, "big")], "1M") / 1e6)
                umount(mnt)
                mnts = [os.path.join(work, f"m{i}") for i in range(4)]
                for m in mnts:
                    mount(a.binary, addr, fp, m)
                paths = [os.path.join(mnts[i % 4], "many", f"f{i:02}") for i in range(64)]
                res[name]["64 readers"].append(1024 * MiB / read_all(paths, "128k") / 1e6)
                for m in mnts:
                    umount(m)
            print(f"run {run + 1}/{a.runs}: " + ", ".join(
                f"{n} {k} {v[k][-1]:.0f} MB/s" for n, v in res.items() for k in v), flush=True)
        out = {"runs": a.runs, "MB/s": {}, "ratio tls/plaintext": {}}
        print(f"\n{'workload':<12} {'local pgcache':>14} {'plaintext':>10} {'TLS':>10} {'TLS/plain':>10}")
        for k in ("single", "64 readers"):
            med = {n: statistics.median(v[k]) for n, v in res.items()}
            loc = statistics.median(local[k])
            ratio = med["tls"] / med["plaintext"]
            out["MB/s"][k] = {"local": loc, **med}
            out["ratio tls/plaintext"][k] = ratio
            print(f"{k:<12} {loc:>14.0f} {med['plaintext']:>10.0f} {med['tls']:>10.0f} {ratio:>10.2f}")
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "tls.json"), "w") as f:
            json.dump({"raw": res, "local": local, **out}, f, indent=1)
    finally:
        for p, _, _ in servers.values():
            p.terminate()
            p.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
