#!/usr/bin/env python3
"""What performing each request as its caller costs the server (issue 34).

A server running as root switches its request thread to each request's identity, lazily:
a thread serving one user after another pays the switch (several system calls that each
commit new credentials), a thread serving one user pays nothing after its first request.
This measures the worst case against the best on loopback, same run: reader processes
doing small O_DIRECT reads through one --no-cache mount (every read a server request),
either all as one user or alternating between users (so consecutive requests on the
server's threads belong to different identities), and the same readers as root with
--squash none (the server's own identity: no switch at all).

Run as root: python3 bench/identity.py [--seconds 10] [--readers 4]. See
doc/BENCHMARKS.md.
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
USERS = [2901, 2902, 2903, 2904]
# The readers run as other users: an interpreter they can run (not one under /root).
READER_PYTHON = shutil.which("python3", path="/usr/bin:/usr/local/bin") or sys.executable

# One reader: O_DIRECT 4 KiB reads at random aligned offsets of its file for a fixed time;
# prints the reads done.
READER = r"""
import mmap, os, random, sys, time
path, seconds = sys.argv[1], float(sys.argv[2])
fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
size = os.fstat(fd).st_size
buf = mmap.mmap(-1, 4096)
r = random.Random(1)
n, end = 0, time.monotonic() + seconds
while time.monotonic() < end:
    for _ in range(64):
        os.preadv(fd, [buf], r.randrange(size // 4096) * 4096)
    n += 64
print(n)
"""


def spawn_server(binary, export, state, squash):
    p = subprocess.Popen([binary, "serve", export, "--listen", "127.0.0.1:0", "--state-dir",
                          state, "--squash", squash], stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True)
    line = p.stdout.readline()
    if not line.startswith("hoardfs: serving"):
        raise RuntimeError(f"server did not start: {line!r}")
    addr = line.rsplit(" on ", 1)[1].split()[0]
    fp = line.split("identity ")[1].rstrip(")\n")
    return p, addr, fp


def run_readers(files, uids, seconds):
    """Starts one reader per file, as the matching uid (None: root); returns reads/s."""
    procs = []
    for f, uid in zip(files, uids):
        kw = {} if uid is None else {"user": uid, "group": uid, "extra_groups": []}
        procs.append(subprocess.Popen([READER_PYTHON, "-c", READER, f, str(seconds)],
                                      stdout=subprocess.PIPE, text=True, **kw))
    total = 0
    for p in procs:
        out, _ = p.communicate()
        if p.returncode != 0:
            raise RuntimeError("a reader failed")
        total += int(out)
    return total / seconds


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--binary", default=os.path.join(REPO, "target", "release", "hoardfs"))
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--readers", type=int, default=4)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(REPO, "bench", "out"))
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="identity-bench-", dir="/var/tmp")
    os.chmod(work, 0o755)
    export = os.path.join(work, "export")
    os.makedirs(export)
    files = []
    for i in range(a.readers):
        p = os.path.join(export, f"f{i}")
        with open(p, "wb") as f:
            f.write(os.urandom(8 << 20))
        files.append(p)
    cases = {
        "one user": [USERS[0]] * a.readers,
        "alternating users": [USERS[i % len(USERS)] for i in range(a.readers)],
        "root, --squash none": [None] * a.readers,
    }
    res = {k: [] for k in cases}
    servers = []
    try:
        for run in range(a.runs):
            for case, uids in cases.items():
                squash = "none" if uids[0] is None else "root"
                srv, addr, fp = spawn_server(a.binary, export, os.path.join(work, "state"), squash)
                servers.append(srv)
                mnt = os.path.join(work, "mnt")
                os.makedirs(mnt, exist_ok=True)
                subprocess.run([a.binary, "mount", addr, mnt, "--no-cache", "--daemon",
                                "--server-fingerprint", fp], check=True,
                               stdout=subprocess.DEVNULL)
                paths = [os.path.join(mnt, os.path.basename(f)) for f in files]
                res[case].append(run_readers(paths, uids, a.seconds))
                subprocess.run(["umount", mnt], check=True)
                srv.terminate()
                srv.wait()
                print(f"run {run + 1}: {case}: {res[case][-1]:.0f} reads/s", flush=True)
        base = statistics.median(res["one user"])
        print(f"\n{a.readers} readers, O_DIRECT 4 KiB reads through one --no-cache mount")
        print(f"{'case':<22} {'reads/s':>10} {'vs one user':>12}")
        out = {"readers": a.readers, "seconds": a.seconds, "runs": a.runs, "reads/s": {}}
        for case in cases:
            m = statistics.median(res[case])
            out["reads/s"][case] = m
            print(f"{case:<22} {m:>10.0f} {m / base:>12.3f}")
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "identity.json"), "w") as f:
            json.dump({"raw": res, **out}, f, indent=1)
    finally:
        for s in servers:
            if s.poll() is None:
                s.terminate()
                s.wait()
        subprocess.run(["umount", os.path.join(work, "mnt")], stderr=subprocess.DEVNULL)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
