#!/usr/bin/env python3
"""Writes at local speed (issue 39): the write workloads users judge a network file
system by, on a default mount against the local disk and sshfs in the same run.

A `hoardfs serve` on loopback (its defaults: TLS, the client trusting it on first use),
one mount with the defaults (write-behind: `--write-back close`), one with
`--write-back through` (every write a round trip, the behaviour before issue 39) and one
with `--write-back async` (Coda's weakly connected mode: names and new files through the
change log, sent within about a second), each with its own cache; sshfs straight to an sftp-server behind socat on loopback (no ssh
crypto, as in the other benchmarks). Each workload runs `--rounds` times into a fresh
directory; medians. Workloads, each ending durable (fsync, or syncfs of the tree):

* dd: `dd bs=4k count=20000 conv=fsync` (80 MB);
* appends: Python appends 20,000 log lines to a file opened with 'a', flushing each
  (one write(2) each), then fsync and close;
* tar x: extraction of this repository's sources (`git archive HEAD`), then `sync -f`;
* git clone: `git clone --no-local` of this repository, then `sync -f`.

The local disk is timed with the same final fsync/syncfs (the ratio's base). With
`--write-back async` an fsync makes the data durable on the client's disk, and the
changes reach the server in the background: after each async round `hoardfs sync` (the
barrier) is timed on its own ("async drain"). Then tar x and git clone run once more
without the final sync on the local disk and the async mount (the async target's base).
After each hoardfs round, a second mount checks that the bytes are there (close-to-open;
for async, after the drain). `--rate 100mbit` puts the server (and sshfs's sftp-server) in
a network namespace behind a veth pair shaped to that rate each way (seed000.py's link)
instead of loopback. Run as root: python3 bench/writes.py. JSON in bench/out/.
"""

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import seed000
from loopback import wait_line, wait_mounted

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PORT, SFTP_PORT = 7397, 7398

APPENDS = r"""
import os, sys
n = int(sys.argv[2])
with open(sys.argv[1], "a") as f:
    for i in range(n):
        f.write(f"{i:08d} a log line of about sixty bytes, flushed as it is\n")
        f.flush()
    os.fsync(f.fileno())
"""


def log(msg):
    print(f"[writes] {msg}", flush=True)


def sh(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, **kw)


def digest(path):
    """SHA-256 over every file's relative path and bytes under `path` (or of one file)."""
    h = hashlib.sha256()
    if os.path.isfile(path):
        with open(path, "rb") as f:
            h.update(f.read())
        return h.hexdigest()
    for root, dirs, files in os.walk(path):
        dirs.sort()
        for name in sorted(files):
            p = os.path.join(root, name)
            if os.path.islink(p):
                continue
            h.update(os.path.relpath(p, path).encode())
            with open(p, "rb") as f:
                h.update(f.read())
    return h.hexdigest()


def workloads(tarball, lines):
    """name -> (function(target dir) that runs it, whether the base syncs the tree)."""
    def dd(d):
        sh(["dd", "if=/dev/zero", f"of={d}/dd.out", "bs=4k", "count=20000", "conv=fsync"])
        return f"{d}/dd.out"

    def appends(d):
        sh([sys.executable, "-c", APPENDS, f"{d}/app.log", str(lines)])
        return f"{d}/app.log"

    def tar_x(d):
        sh(["tar", "xf", tarball, "-C", d])
        sh(["sync", "-f", d])
        return d

    def clone(d):
        sh(["git", "clone", "-q", "--no-local", REPO, f"{d}/clone"])
        sh(["sync", "-f", d])
        return f"{d}/clone"

    return {"dd bs=4k 80 MB": dd, f"{lines:,} flushed appends": appends,
            "tar x": tar_x, "git clone": clone}


def unsynced(tarball):
    """tar x and git clone without the final syncfs (the async mode's comparison)."""
    def tar_x(d):
        sh(["tar", "xf", tarball, "-C", d])
        return d

    def clone(d):
        sh(["git", "clone", "-q", "--no-local", REPO, f"{d}/clone"])
        return f"{d}/clone"

    return {"tar x, no sync": tar_x, "git clone, no sync": clone}


def timed(fn, d):
    os.makedirs(d)
    t = time.perf_counter()
    out = fn(d)
    return time.perf_counter() - t, out


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--binary", default=os.path.join(REPO, "target", "release", "hoardfs"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--lines", type=int, default=20000)
    ap.add_argument("--no-sshfs", action="store_true")
    ap.add_argument("--rate", help="shape the link to this rate (e.g. 100mbit) in a "
                    "network namespace instead of loopback")
    ap.add_argument("--out", default=os.path.join(REPO, "bench", "out"))
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="hoardfs-writes-", dir="/var/tmp")
    host, ns = "127.0.0.1", (lambda *cmd: list(cmd))
    if args.rate:
        seed000.WORK, seed000.PIDFILE = work, os.path.join(work, "pids.json")
        seed000.clean_leftovers()
        seed000.setup_network(args.rate)
        host, ns = seed000.SRV_IP, seed000.in_ns
    exp, local = os.path.join(work, "export"), os.path.join(work, "local")
    for d in (exp, local):
        os.makedirs(d)
    tarball = os.path.join(work, "src.tar")
    sh(["git", "-C", REPO, "archive", "-o", tarball, "HEAD"])
    procs, mounts = [], {}
    try:
        srv = subprocess.Popen(ns(args.binary, "serve", exp, "--listen", f"{host}:{PORT}",
                                  "--allow-unauthenticated", "--squash", "none",
                                  "--state-dir", os.path.join(work, "state")),
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        procs.append(srv)
        wait_line(srv, "hoardfs: serving", "server")
        for name, extra in (("default", []), ("through", ["--write-back", "through"]),
                            ("async", ["--write-back", "async"]), ("check", [])):
            mnt = os.path.join(work, f"mnt-{name}")
            os.makedirs(mnt)
            m = subprocess.Popen([args.binary, "mount", f"{host}:{PORT}", mnt,
                                  "--cache-dir", os.path.join(work, f"cache-{name}"), *extra],
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            procs.append(m)
            wait_mounted(m, mnt, f"mount {name}")
            mounts[name] = mnt
        if not args.no_sshfs:
            sftp = shutil.which("sftp-server") or "/usr/lib/openssh/sftp-server"
            procs.append(subprocess.Popen(ns("socat", f"TCP-LISTEN:{SFTP_PORT},bind={host},"
                                             "reuseaddr,fork", f"EXEC:{sftp}")))
            time.sleep(0.5)
            mnt = os.path.join(work, "mnt-sshfs")
            os.makedirs(mnt)
            m = subprocess.Popen(["sshfs", "-f", "-o", f"directport={SFTP_PORT}",
                                  f"{host}:{exp}", mnt], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
            procs.append(m)
            wait_mounted(m, mnt, "sshfs")
            mounts["sshfs"] = mnt
        systems = [("local", local), ("hoardfs", mounts["default"]),
                   ("hoardfs --write-back through", mounts["through"]),
                   ("hoardfs --write-back async", mounts["async"])]
        if "sshfs" in mounts:
            systems.append(("sshfs", mounts["sshfs"]))
        link = f"veth shaped to {args.rate}" if args.rate else "loopback"
        res = {"time": time.strftime("%Y%m%d-%H%M%S"), "binary": args.binary,
               "transport": f"TLS (default), {link}", "rounds": args.rounds, "rows": {}}
        def run(wl, fn, systems):
            row = res["rows"][wl] = {}
            for sysname, root in systems:
                times, drains = [], []
                for r in range(args.rounds):
                    tag = "".join(c if c.isalnum() else "-" for c in f"{sysname}-{wl}")
                    d = os.path.join(root, f"{tag}-{r}")
                    t, out = timed(fn, d)
                    times.append(t)
                    if root == mounts["async"]:
                        t0 = time.perf_counter()
                        sh([args.binary, "sync", root])
                        drains.append(time.perf_counter() - t0)
                    if root in (mounts["default"], mounts["async"]):
                        # Close-to-open: another client sees every byte now.
                        seen = os.path.join(mounts["check"], os.path.relpath(out, root))
                        if digest(seen) != digest(out):
                            sys.exit(f"{wl}: the second client sees other bytes")
                row[sysname] = statistics.median(times)
                log(f"{wl}: {sysname} {row[sysname]:.3f} s")
                if drains:
                    row["async drain"] = statistics.median(drains)
                    log(f"{wl}: async drain {row['async drain']:.3f} s")

        for wl, fn in workloads(tarball, args.lines).items():
            run(wl, fn, systems)
        for wl, fn in unsynced(tarball).items():
            run(wl, fn, [("local", local), ("hoardfs --write-back async", mounts["async"])])
    finally:
        for mnt in mounts.values():
            subprocess.run(["umount", "-l", mnt], stderr=subprocess.DEVNULL)
        for p in procs:
            p.kill()
        if args.rate:
            seed000.clean_leftovers()
        shutil.rmtree(work, ignore_errors=True)
    names = [s for s, _ in systems] + ["async drain"]
    print()
    print(f"{'workload':24}" + "".join(f"{n:>30}" for n in names))
    for wl, row in res["rows"].items():
        cells = [f"{row['local']:.3f} s"]
        for n in names[1:]:
            if n not in row:
                cells.append("-")
            elif n == "async drain":
                cells.append(f"{row[n]:.3f} s")
            else:
                cells.append(f"{row[n]:.3f} s ({row['local'] / row[n]:.2f}x)")
        print(f"{wl:24}" + "".join(f"{c:>30}" for c in cells))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"writes-{res['time']}.json"), "w") as f:
        json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
