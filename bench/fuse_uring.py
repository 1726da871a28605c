#!/usr/bin/env python3
"""FUSE over io_uring against /dev/fuse: the cost of one open round trip (issue 21, item 1).

Builds bench/fuse-uring/open_bench.c (a minimal FUSE file system with one 4 KiB file,
served over /dev/fuse or over one io_uring queue per CPU) and runs N x (open, pread 4 KiB,
close) of the warm file through it, in the same run as the same loop on a local file:

  transport  x  client unpinned / pinned to CPU 0  x  ring threads SCHED_OTHER / SCHED_IDLE

Each cell is the median of --runs runs of --ops operations: microseconds per operation
(mean, p50, p99), rescheduling + function-call IPIs per operation and the client's task
migrations per operation. The daemon answers as hoardfs answers a cached read open
(FOPEN_KEEP_CACHE | FOPEN_NOFLUSH, names and attributes valid for an hour), so what an
operation costs beyond the local loop is the OPEN round trip and the RELEASE.

The same loop also runs on a hoardfs mount of the same file (the release binary,
`hoardfs serve` on 127.0.0.1 in plaintext, a mount with a disk cache holding the file):
the default mount (a passthrough open per operation; over io_uring, as the parameter is
set for the run), the same over /dev/fuse (`--fuse-transport dev-fuse`) and
`--read-only --kernel-opens`.
The difference between the hoardfs row and the /dev/fuse row is what hoardfs's own open
path adds to the transport's round trip.

Needs root, /dev/fuse, gcc and liburing-dev (installed when missing), and Linux 6.14+
with the fuse module parameter enable_uring (set to Y for the run, then restored).
Writes bench/out/fuse-uring-<time>.json and fuse-uring-latest.json.

    sudo python3 bench/fuse_uring.py [--ops 20000] [--runs 5] [--binary target/release/hoardfs]
"""
import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

# Free-space thresholds for cached mounts and tiers: the defaults (cull below 7 % free,
# stop below 3 %) are percentages of the whole disk and would evict the benchmark's cache
# on a nearly full one.
LOW_THRESHOLDS = ["--bstop", "0", "--bcull", "1", "--brun", "2"]

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(REPO, "bench", "fuse-uring", "open_bench.c")
PARAM = "/sys/module/fuse/parameters/enable_uring"


def log(msg):
    print(f"[fuse-uring] {msg}", file=sys.stderr, flush=True)


def ensure_tools():
    missing = [p for p, probe in (("gcc", "/usr/bin/gcc"),
                                  ("liburing-dev", "/usr/include/liburing.h"))
               if not os.path.exists(probe)]
    if missing:
        log(f"installing {' '.join(missing)}")
        subprocess.run(["apt-get", "install", "-y", *missing], check=True,
                       stdout=subprocess.DEVNULL)


def build(out_dir):
    exe = os.path.join(out_dir, "open_bench")
    subprocess.run(["gcc", "-O2", "-Wall", "-Wextra", "-o", exe, SRC, "-luring", "-lpthread"],
                   check=True)
    return exe


def run(exe, target, mode, ops, extra):
    r = subprocess.run([exe, target, mode, str(ops), *extra], capture_output=True, text=True,
                       timeout=300)
    if r.returncode != 0:
        raise RuntimeError(f"open_bench {mode} {extra}: {r.stderr.strip()}")
    res = json.loads(r.stdout.strip().splitlines()[-1])
    if mode != "local":
        # "opens answered: D over /dev/fuse, R over io_uring": every measured open must
        # have gone through the transport under test.
        words = r.stderr.split()
        at = words.index("answered:")
        dev, ring = int(words[at + 1]), int(words[at + 4])
        res["dev_opens"], res["ring_opens"] = dev, ring
        through = ring if mode == "uring" else dev
        if through < ops:
            raise RuntimeError(f"{mode}: only {through} of {ops} opens went through it: {r.stderr}")
    return res


def is_mounted(path):
    with open("/proc/mounts") as f:
        return any(line.split()[1] == path for line in f)


class Hoardfs:
    """`hoardfs serve` of a directory holding `f`, and mounts of it with a disk cache."""

    def __init__(self, binary, work, port=17997):
        self.binary, self.work, self.addr = binary, work, f"127.0.0.1:{port}"
        self.procs = []
        srv = os.path.join(work, "srv")
        os.makedirs(srv)
        with open(os.path.join(srv, "f"), "wb") as f:
            f.write(os.urandom(4096))
        self.spawn([binary, "serve", srv, "--listen", self.addr, "--insecure-plaintext",
                    "--state-dir", os.path.join(work, "state")])
        deadline = time.monotonic() + 30
        while subprocess.run(["ss", "-Hltn", f"sport = :{port}"], capture_output=True,
                             text=True).stdout.strip() == "":
            if time.monotonic() > deadline:
                raise RuntimeError("hoardfs serve did not start")
            time.sleep(0.05)

    def spawn(self, cmd):
        log_path = os.path.join(self.work, f"log-{len(self.procs)}")
        p = subprocess.Popen(cmd, stdout=open(log_path, "w"), stderr=subprocess.STDOUT)
        self.procs.append(p)
        return p

    def mount(self, name, extra):
        mnt = os.path.join(self.work, name)
        os.makedirs(mnt, exist_ok=True)
        cache = os.path.join(self.work, "cache")
        p = self.spawn([self.binary, "mount", self.addr, mnt, "--cache-dir", cache,
                        "--insecure-plaintext", *LOW_THRESHOLDS, *extra])
        deadline = time.monotonic() + 30
        while not is_mounted(mnt):
            if p.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"hoardfs mount {extra} failed")
            time.sleep(0.05)
        with open(os.path.join(mnt, "f"), "rb") as f:  # fetched into the cache
            f.read()
        return mnt, p

    def unmount(self, mnt, p):
        subprocess.run(["umount", mnt], check=False)
        p.wait(timeout=30)

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
                p.wait(timeout=30)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--ops", type=int, default=20000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--out", default=os.path.join(REPO, "bench", "out"))
    ap.add_argument("--binary", default=os.path.join(REPO, "target", "release", "hoardfs"))
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("fuse_uring: run as root (FUSE mounts, module parameter)")
    if not os.path.exists(PARAM):
        sys.exit(f"fuse_uring: {PARAM} missing: this kernel has no FUSE over io_uring (6.14+)")
    ensure_tools()
    os.makedirs(args.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="fuse-uring-")
    old = open(PARAM).read().strip()
    hoard = None
    try:
        exe = build(work)
        mnt, local = os.path.join(work, "mnt"), os.path.join(work, "local")
        os.makedirs(mnt)
        os.makedirs(local)
        with open(os.path.join(local, "f"), "wb") as f:
            f.write(os.urandom(4096))
        with open(PARAM, "w") as f:
            f.write("Y")
        cells = [("local", "local", []), ("local", "local, pinned", ["--pin-client", "0"])]
        for mode in ("devfuse", "uring"):
            cells.append((mode, f"{mode}", []))
            cells.append((mode, f"{mode}, client pinned", ["--pin-client", "0"]))
        cells.append(("uring", "uring, SCHED_IDLE ring", ["--idle-ring"]))
        cells.append(("uring", "uring, SCHED_IDLE ring, client pinned",
                      ["--idle-ring", "--pin-client", "0"]))
        results = {}
        hoard = Hoardfs(os.path.abspath(args.binary), os.path.join(work, "hoardfs"))
        # The parameter is set, so the default mount (--fuse-transport auto) is over
        # io_uring; the same mount over /dev/fuse alongside.
        mounts = [("hoardfs (default mount: io_uring)", "m-default", []),
                  ("hoardfs --fuse-transport dev-fuse", "m-devfuse",
                   ["--fuse-transport", "dev-fuse"]),
                  ("hoardfs --read-only --kernel-opens", "m-kopens", ["--read-only", "--kernel-opens"])]
        # Interleaved, so that a slow phase of the VM touches every cell alike.
        for i in range(args.runs):
            for mode, name, extra in cells:
                target = local if mode == "local" else mnt
                results.setdefault(name, []).append(run(exe, target, mode, args.ops, extra))
            for name, sub, extra in mounts:
                m, p = hoard.mount(sub, extra)
                try:
                    results.setdefault(name, []).append(run(exe, m, "local", args.ops, []))
                finally:
                    hoard.unmount(m, p)
            log(f"run {i + 1}/{args.runs} done")
    finally:
        if hoard:
            hoard.stop()
        with open(PARAM, "w") as f:
            f.write(old)
        subprocess.run(["umount", "-l", os.path.join(work, "mnt")], stderr=subprocess.DEVNULL)
        shutil.rmtree(work, ignore_errors=True)
    summary = {}
    for name, runs in results.items():
        summary[name] = {k: statistics.median(r[k] for r in runs)
                         for k in ("us_mean", "us_p50", "us_p99", "ipis_per_op",
                                   "migrations_per_op")}
    res = {"benchmark": "fuse-uring", "time": datetime.datetime.now().strftime("%Y%m%d-%H%M%S"),
           "kernel": os.uname().release, "cpus": os.cpu_count(), "ops": args.ops,
           "runs": args.runs, "summary": summary, "raw": results}
    for name in (f"fuse-uring-{res['time']}.json", "fuse-uring-latest.json"):
        with open(os.path.join(args.out, name), "w") as f:
            json.dump(res, f, indent=2)
    base = summary["devfuse"]["us_mean"]
    print(f"\nN x (open, pread 4 KiB, close) of a warm file, {args.ops} ops, median of {args.runs} runs")
    print(f"{'':40} {'us/op':>7} {'p50':>7} {'p99':>7} {'IPIs/op':>8} {'migr/op':>8} {'vs /dev/fuse':>12}")
    for name, s in summary.items():
        print(f"{name:40} {s['us_mean']:7.1f} {s['us_p50']:7.1f} {s['us_p99']:7.1f} "
              f"{s['ipis_per_op']:8.2f} {s['migrations_per_op']:8.3f} {base / s['us_mean']:11.2f}x")


if __name__ == "__main__":
    main()
