#!/usr/bin/env python3
"""File locks across clients (issue 36): latency and SQLite, against the local disk.

A `hoardfs serve` on loopback (its defaults: TLS, the client trusting it on first use) and
two mounts with their own caches. Measured with Python, as applications lock:

* uncontended lock + unlock round trip (`fcntl.lockf` POSIX locks and `fcntl.flock`),
  `--ops` times, on the mount and on the local disk: p50 and p99 per pair;
* contended hand-off: a process on client B waits in `F_SETLKW` while a process on client
  A holds the lock; A releases it, and the time from A's release call to B's return is
  taken (CLOCK_MONOTONIC is one clock for every process on the host), `--handoffs` times;
* SQLite (rollback journal, one transaction per insert) on one client: inserts per second
  on the mount and on the local disk.

Run as root: python3 bench/locks.py. JSON in bench/out/locks-*.json.
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

from loopback import wait_line, wait_mounted

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PAIRS = r"""
import fcntl, json, os, sys, time
path, n, kind = sys.argv[1], int(sys.argv[2]), sys.argv[3]
fd = os.open(path, os.O_RDWR)
lat = []
for _ in range(n):
    t = time.perf_counter()
    if kind == "posix":
        fcntl.lockf(fd, fcntl.LOCK_EX)
        fcntl.lockf(fd, fcntl.LOCK_UN)
    else:
        fcntl.flock(fd, fcntl.LOCK_EX)
        fcntl.flock(fd, fcntl.LOCK_UN)
    lat.append(time.perf_counter() - t)
print(json.dumps(lat))
"""

# Waiter: for each round, reads a byte (A holds the lock now), waits in F_SETLKW, prints
# when it got it, releases, and writes a byte back (A may take it again).
WAITER = r"""
import fcntl, os, sys, time
path, n = sys.argv[1], int(sys.argv[2])
fd = os.open(path, os.O_RDWR)
out = []
for _ in range(n):
    sys.stdin.buffer.read(1)
    fcntl.lockf(fd, fcntl.LOCK_EX)
    out.append(time.monotonic())
    fcntl.lockf(fd, fcntl.LOCK_UN)
    sys.stdout.write(f"{out[-1]}\n")
    sys.stdout.flush()
"""

SQLITE = r"""
import sqlite3, sys, time
c = sqlite3.connect(sys.argv[1])
c.execute("pragma journal_mode=delete")
c.execute("create table if not exists t(i int, v text)")
c.commit()
n = int(sys.argv[2])
t = time.perf_counter()
for i in range(n):
    c.execute("insert into t values (?, ?)", (i, "x" * 100))
    c.commit()
print(n / (time.perf_counter() - t))
"""


def log(msg):
    print(f"[locks] {msg}", flush=True)


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def pairs(path, n, kind):
    out = subprocess.run([sys.executable, "-c", PAIRS, path, str(n), kind],
                         check=True, capture_output=True, text=True).stdout
    lat = json.loads(out)
    return {"p50_us": pct(lat, 0.5) * 1e6, "p99_us": pct(lat, 0.99) * 1e6}


def handoffs(holder_path, waiter_path, n):
    import fcntl
    w = subprocess.Popen([sys.executable, "-c", WAITER, waiter_path, str(n)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    fd = os.open(holder_path, os.O_RDWR)
    lat = []
    for _ in range(n):
        fcntl.lockf(fd, fcntl.LOCK_EX)
        w.stdin.write("x")
        w.stdin.flush()
        time.sleep(0.01)  # the waiter is waiting on the server by now
        t0 = time.monotonic()
        fcntl.lockf(fd, fcntl.LOCK_UN)
        t1 = float(w.stdout.readline())
        lat.append(t1 - t0)
    os.close(fd)
    w.wait()
    return {"p50_us": pct(lat, 0.5) * 1e6, "p99_us": pct(lat, 0.99) * 1e6}


def sqlite_rate(path, n):
    out = subprocess.run([sys.executable, "-c", SQLITE, path, str(n)],
                         check=True, capture_output=True, text=True).stdout
    return float(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--binary", default=os.path.join(REPO, "target", "release", "hoardfs"))
    ap.add_argument("--ops", type=int, default=2000)
    ap.add_argument("--handoffs", type=int, default=200)
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--out", default=os.path.join(REPO, "bench", "out"))
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="hoardfs-locks-", dir="/var/tmp")
    exp, local = os.path.join(work, "export"), os.path.join(work, "local")
    for d in (exp, local):
        os.makedirs(d)
    for d in (exp, local):
        with open(os.path.join(d, "f"), "wb") as f:
            f.write(b"0" * 4096)
    procs, mounts = [], []
    try:
        srv = subprocess.Popen([args.binary, "serve", exp, "--listen", "127.0.0.1:7399",
                                "--allow-unauthenticated", "--squash", "none",
                                "--state-dir", os.path.join(work, "state")],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        procs.append(srv)
        wait_line(srv, "hoardfs: serving", "server")
        for name in ("a", "b"):
            mnt = os.path.join(work, f"mnt-{name}")
            os.makedirs(mnt)
            m = subprocess.Popen([args.binary, "mount", "127.0.0.1:7399", mnt,
                                  "--cache-dir", os.path.join(work, f"cache-{name}")],
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            procs.append(m)
            wait_mounted(m, mnt, f"mount {name}")
            mounts.append(mnt)
        a, b = mounts
        res = {"time": time.strftime("%Y%m%d-%H%M%S"), "binary": args.binary,
               "transport": "TLS (default)"}
        for kind in ("posix", "flock"):
            log(f"uncontended {kind} lock+unlock, {args.ops} times")
            res[f"{kind}_mount"] = pairs(os.path.join(a, "f"), args.ops, kind)
            res[f"{kind}_local"] = pairs(os.path.join(local, "f"), args.ops, kind)
        log(f"hand-off between clients, {args.handoffs} times")
        res["handoff_mount"] = handoffs(os.path.join(a, "f"), os.path.join(b, "f"),
                                        args.handoffs)
        res["handoff_local"] = handoffs(os.path.join(local, "f"), os.path.join(local, "f"),
                                        args.handoffs)
        log(f"SQLite, {args.rows} inserts of one row per transaction")
        res["sqlite_mount_per_s"] = sqlite_rate(os.path.join(a, "t.db"), args.rows)
        res["sqlite_local_per_s"] = sqlite_rate(os.path.join(local, "t.db"), args.rows)
    finally:
        for mnt in mounts:
            subprocess.run(["umount", "-l", mnt], stderr=subprocess.DEVNULL)
        for p in procs:
            p.kill()
        shutil.rmtree(work, ignore_errors=True)
    print()
    print(f"{'':34} {'mount p50':>10} {'p99':>9} {'local p50':>10} {'p99':>9}")
    for row, m, l in (("uncontended lockf lock+unlock, us", "posix_mount", "posix_local"),
                      ("uncontended flock lock+unlock, us", "flock_mount", "flock_local"),
                      ("hand-off to another waiter, us", "handoff_mount", "handoff_local")):
        print(f"{row:34} {res[m]['p50_us']:10.0f} {res[m]['p99_us']:9.0f} "
              f"{res[l]['p50_us']:10.0f} {res[l]['p99_us']:9.0f}")
    ratio = res["sqlite_mount_per_s"] / res["sqlite_local_per_s"]
    print(f"SQLite inserts/s (one per transaction): mount {res['sqlite_mount_per_s']:.0f}, "
          f"local {res['sqlite_local_per_s']:.0f} ({ratio:.2f}x)")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"locks-{res['time']}.json"), "w") as f:
        json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
