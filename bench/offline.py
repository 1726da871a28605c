#!/usr/bin/env python3
"""Replay rate of --offline-writes over a shaped 100 Mbit/s link (issue 20).

The server runs in the network namespace of bench/seed000.py (same veth pair and tc tbf
shaping, 198.18.0.1); the client mounts it with --offline-writes and prefetches the tree.
Then the server's end of the link goes down (the client's end loses its carrier: a
pulled cable, no resets, no answers), 10,000 write operations are made on the mount, the link comes back, and the time
from the link coming back to the mount reconnecting, and from then to an empty log, are
measured (`hoardfs stats` polled every 50 ms). Three logs: `many` (10,000 files of 16 KiB, one 4 KiB write each: 10,000 records),
`collapsed` (100 files of 1 MiB, 100 writes of 4 KiB each: 100 records) and `names`
(1,000 directories made, 9 new files of 4 KiB in each: 10,000 records). The raw link
(one TCP stream, client to server, the direction of reintegration) is measured in the
same run. Every file on the server is checked against what was written.

Run as root: python3 bench/offline.py. Results in bench/out/offline-*.json.
"""
import argparse
import datetime
import hashlib
import json
import os
import random
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import seed000 as s0  # noqa: E402  (shares the namespace, link and cleanup helpers)

REPO = s0.REPO
WORK = os.path.join(s0.WORK, "offline")
KiB, MiB = 1 << 10, 1 << 20

# Receives and discards one stream, then prints the byte count (runs in the namespace).
SINK = r"""
import socket, sys
s = socket.create_server((sys.argv[1], int(sys.argv[2])))
print('ready', flush=True)
c, _ = s.accept()
n = 0
while True:
    b = c.recv(1 << 20)
    if not b: break
    n += len(b)
print(n, flush=True)
"""


def log(msg):
    print(f"[offline] {msg}", file=sys.stderr, flush=True)


def wait_line(p, want, what):
    while True:
        line = p.stdout.readline()
        if not line:
            raise RuntimeError(f"{what} exited before '{want}'")
        if want in line:
            return line


def wait_mounted(p, mnt, timeout=60):
    """Waits for `mnt` in /proc/mounts (a mount is silent on success unless -v, and
    older builds know no -v)."""
    deadline = time.monotonic() + timeout
    while not s0.is_mounted(mnt):
        if p.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"mount of {mnt} not ready (exit={p.poll()})")
        time.sleep(0.05)


def stats(binary, mnt):
    out = subprocess.run([binary, "stats", "--json", mnt], capture_output=True, text=True)
    return json.loads(out.stdout) if out.returncode == 0 else None


def raw_upload_rate(size):
    p = subprocess.Popen(s0.in_ns("python3", "-c", SINK, s0.SRV_IP, "7079"),
                         stdout=subprocess.PIPE, text=True)
    wait_line(p, "ready", "sink")
    import socket
    data = os.urandom(MiB)
    t0 = time.monotonic()
    with socket.create_connection((s0.SRV_IP, 7079)) as c:
        for _ in range(size // MiB):
            c.sendall(data)
    got = int(p.stdout.readline())
    p.wait()
    return got / (time.monotonic() - t0)


def link(up):
    """Takes the server's end of the veth pair down (a pulled cable: the client's end
    loses its carrier and drops what it sends, no resets, no answers), or up again."""
    s0.sh(s0.in_ns("ip", "link", "set", s0.VETH_NS, "up" if up else "down"))


def scenario(binary, mnt, export, name, files, size, writes_per_file):
    """Makes the tree, returns the expected content after the offline writes."""
    d = os.path.join(export, name)
    os.makedirs(d, exist_ok=True)
    rng = random.Random(name)
    expected = {}
    for i in range(files):
        data = bytearray(rng.randbytes(size))
        with open(os.path.join(d, f"f{i:05d}"), "wb") as f:
            f.write(data)
        expected[f"f{i:05d}"] = data
    return d, expected, rng


def names_offline(mnt, name, rng, dirs, files_per_dir):
    """Makes `dirs` directories with `files_per_dir` new 4 KiB files each on the mount;
    returns the expected content by path and the number of operations."""
    expected, ops = {}, 0
    for i in range(dirs):
        sub = f"d{i:04d}"
        os.mkdir(os.path.join(mnt, name, sub))
        ops += 1
        for j in range(files_per_dir):
            rel = f"{sub}/f{j}"
            data = rng.randbytes(4 * KiB)
            with open(os.path.join(mnt, name, rel), "wb") as f:
                f.write(data)
            expected[rel] = data
            ops += 1
    return expected, ops


def run_scenario(args, name, files, size, writes_per_file, made_dirs=0):
    export, mnt, cache = (os.path.join(WORK, x) for x in ("export", "mnt", "cache"))
    d, expected, rng = scenario(args.binary, mnt, export, name, files, size, writes_per_file)
    log(f"{name}: prefetching {files} files of {size // KiB} KiB")
    s0.sh([args.binary, "prefetch", os.path.join(mnt, name), "-q"])
    link(False)
    # The first operation notices the link is gone (a request timeout); not timed.
    first = os.path.join(mnt, name, "f00000")
    try:
        with open(first, "r+b") as f:
            f.write(expected["f00000"][:1])
    except OSError:
        pass
    log(f"{name}: link down; {files * writes_per_file} writes")
    t0 = time.monotonic()
    ops = 0
    if made_dirs:
        expected, ops = names_offline(mnt, name, rng, made_dirs, writes_per_file)
        files = 0
    for i in range(files):
        fname = f"f{i:05d}"
        with open(os.path.join(mnt, name, fname), "r+b") if i else open(first, "r+b") as f:
            for _ in range(writes_per_file):
                off = rng.randrange(0, size - 4 * KiB)
                block = rng.randbytes(4 * KiB)
                f.seek(off)
                f.write(block)
                expected[fname][off:off + 4 * KiB] = block
                ops += 1
    write_secs = time.monotonic() - t0
    st = stats(args.binary, mnt)
    pending = st["offline_writes"]["pending_files"]
    pending_bytes = st["offline_writes"]["pending_bytes"]
    log(f"{name}: {ops} writes in {write_secs:.2f} s; {pending} files pending, link up")
    link(True)
    t0 = time.monotonic()
    t_conn = None
    while True:
        st = stats(args.binary, mnt)
        if t_conn is None and st and st["connected"]:
            t_conn = time.monotonic()
        if st and st["offline_writes"]["pending_files"] == 0:
            break
        if time.monotonic() - t0 > 1800:
            raise RuntimeError("the log did not empty within 30 minutes")
        time.sleep(0.05)
    t_end = time.monotonic()
    t_conn = t_conn or t_end
    replay = t_end - t_conn
    bad = [f for f, data in expected.items()
           if hashlib.sha256(open(os.path.join(d, f), "rb").read()).digest()
           != hashlib.sha256(data).digest()]
    if bad:
        raise RuntimeError(f"{name}: {len(bad)} files differ on the server, e.g. {bad[:3]}")
    log(f"{name}: reconnected {t_conn - t0:.2f} s after the link came back, log empty "
        f"{replay:.2f} s later; server checked")
    return {"scenario": name, "files": files, "file_bytes": size, "ops": ops,
            "records": pending, "staged_bytes": pending_bytes,
            "offline_write_secs": write_secs, "link_to_reconnect_secs": t_conn - t0,
            "reconnect_to_empty_secs": replay,
            "ops_per_sec": ops / replay, "records_per_sec": pending / replay,
            "mb_per_sec": pending_bytes / replay / 1e6, "conflicts": st["offline_writes"]["conflicts"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--binary", default=os.path.join(REPO, "target", "release", "hoardfs"))
    ap.add_argument("--rate", default="100mbit")
    ap.add_argument("--out", default=os.path.join(REPO, "bench", "out"))
    ap.add_argument("--only", choices=["many", "collapsed", "names"], action="append",
                    help="run only this log (repeatable; default: all three)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("offline: run as root")
    args.binary = os.path.abspath(args.binary)
    s0.ensure_packages()
    s0.clean_leftovers()
    subprocess.run(["rm", "-rf", WORK])
    for x in ("export", "mnt", "cache", "state"):
        os.makedirs(os.path.join(WORK, x))
    procs = []
    try:
        s0.setup_network(args.rate)
        raw = raw_upload_rate(64 * MiB)
        log(f"raw link, client to server: {raw / 1e6:.2f} MB/s")
        srv = subprocess.Popen(s0.in_ns(args.binary, "serve", os.path.join(WORK, "export"),
                                        "--listen", f"{s0.SRV_IP}:7070",
                                        "--allow-unauthenticated",
                                        # The writers are root on both ends: not squashed
                                        # to the anonymous user, who may not write here.
                                        "--squash", "none",
                                        "--state-dir", os.path.join(WORK, "state")),
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        procs.append(srv)
        wait_line(srv, "hoardfs: serving", "server")
        mnt = os.path.join(WORK, "mnt")
        cli = subprocess.Popen([args.binary, "mount", f"{s0.SRV_IP}:7070", mnt,
                                "--cache-dir", os.path.join(WORK, "cache"),
                                "--offline-writes", "--timeout", "2"],
                               stdout=subprocess.PIPE, text=True,
                               stderr=open(os.path.join(s0.WORK, "offline-mount.log"), "w"))
        procs.append(cli)
        wait_mounted(cli, mnt)
        scenarios = {"many": lambda: run_scenario(args, "many", 10_000, 16 * KiB, 1),
                     "collapsed": lambda: run_scenario(args, "collapsed", 100, MiB, 100),
                     "names": lambda: run_scenario(args, "names", 1, 4 * KiB, 9,
                                                   made_dirs=1_000)}
        rows = [run() for name, run in scenarios.items()
                if not args.only or name in args.only]
    finally:
        if os.path.exists(f"/sys/class/net/{s0.VETH_ROOT}"):
            link(True)
        s0.force_unmount(os.path.join(WORK, "mnt"))
        for p in procs:
            p.kill()
        s0.clean_leftovers()
    print(f"\nraw link, client to server: {raw / 1e6:.2f} MB/s ({args.rate})")
    print(f"{'log':<10} {'ops':>6} {'records':>8} {'staged MB':>9} {'offline writes s':>16} "
          f"{'link->reconnect s':>17} {'reconnect->empty s':>18} {'ops/s':>8} {'MB/s':>6} "
          f"{'x raw':>6}")
    for r in rows:
        print(f"{r['scenario']:<10} {r['ops']:>6} {r['records']:>8} {r['staged_bytes'] / 1e6:>9.1f} "
              f"{r['offline_write_secs']:>16.2f} {r['link_to_reconnect_secs']:>17.2f} "
              f"{r['reconnect_to_empty_secs']:>18.2f} "
              f"{r['ops_per_sec']:>8.0f} {r['mb_per_sec']:>6.2f} {r['mb_per_sec'] * 1e6 / raw:>6.2f}")
    os.makedirs(args.out, exist_ok=True)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path = os.path.join(args.out, f"offline-{stamp}.json")
    commit = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    with open(path, "w") as f:
        json.dump({"commit": commit, "rate": args.rate, "raw_upload_bytes_per_sec": raw,
                   "rows": rows}, f, indent=1)
    log(f"results in {path}")


if __name__ == "__main__":
    main()
