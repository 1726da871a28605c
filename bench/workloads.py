#!/usr/bin/env python3
"""Seeds 002, 003 and 004: small files, many parallel readers, and `ls -lR`.

* metadata (seed 004): `ls -lR` over 516 directories / 1,548 files through the shaped
  100 Mbit/s link of seed000.py: cold (empty cache), warm, after a remount; server round
  trips counted with `hoardfs server-stats`; local disk, sshfs and rclone alongside.
* small files (seed 002): 1,000 files of 20-250 KiB over the same link: first read
  (empty cache), warm (page cache), hot (remounted on the disk cache, page caches
  dropped, server side warm); local disk, sshfs and rclone alongside.

  rclone: `rclone serve sftp` of the same directory in the server namespace (its own SSH
  server, password login) and `rclone mount --vfs-cache-mode full` with a disk cache of
  its own, the way rclone caches a remote; its hot row is a remount on that cache with
  the page cache dropped, as hoardfs's.
* scaling (seed 003): N = 1, 4, 16, 64, 256 reader processes (a small C program, compiled
  at the start; `--python-reader` for the Python loop), each reading its own files
  over and over for a fixed time (10 s) with 4 KiB or 128 KiB read() calls, through four
  --no-cache clients (mounted once) of one server on loopback, and the same readers on
  the local page cache; aggregate throughput, server opens per read, CPU seconds per GiB
  (per client thread too), RSS; then the same readers through four sshfs and four rclone
  (--vfs-cache-mode off) mounts of sftp servers on loopback, aggregate rate only.

FUSE transport: the fuse module's `enable_uring` parameter is set for the run (and restored),
so hoardfs mounts are served over io_uring, its default when the kernel offers it; the small
files also get warm and hot rows over /dev/fuse (`--fuse-transport dev-fuse`), the
transport of a kernel without it. `--dev-fuse` leaves the parameter alone.

Writes JSON and SVG plots into the output directory (default bench/out). Run as root:
python3 bench/workloads.py. See doc/BENCHMARKS.md.
"""
import argparse
import atexit
import contextlib
import datetime
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import tempfile
import sys
import time

import seed000
import svgplot
from seed000 import MiB, sh, in_ns, drop_caches

REPO = seed000.REPO
WORK = os.path.join(REPO, "bench", "out", "work-workloads")
seed000.WORK, seed000.PIDFILE = WORK, os.path.join(WORK, "pids.json")
SRV_IP, PORT, SFTP_PORT, LOOP_PORT = seed000.SRV_IP, 7080, 7082, 7083
RCLONE_PORT = 7084
PEER_SFTP_PORT, PEER_RCLONE_PORT = 7085, 7086  # the scaling peers, on loopback
THRESHOLD_FLAGS = {"brun", "bcull", "bstop", "frun", "fcull", "fstop"}
KiB = 1024


def log(msg):
    print(f"[workloads] {msg}", file=sys.stderr, flush=True)


def make_tree(root):
    """516 directories (the root, 5 top-level ones, 510 below them), 3 files each."""
    r = random.Random(4)
    dirs = [root] + [os.path.join(root, f"d{i}") for i in range(5)]
    dirs += [os.path.join(root, f"d{i % 5}", f"s{i:03d}") for i in range(510)]
    for d in dirs:
        os.makedirs(d)
        for k in range(3):
            with open(os.path.join(d, f"f{k}.c"), "wb") as f:
                f.write(os.urandom(r.randint(200, 8000)))


def make_small(root):
    """1,000 files of 20-250 KiB (seed 002's sizes)."""
    r = random.Random(2)
    os.makedirs(root)
    for i in range(1000):
        with open(os.path.join(root, f"file{i:04d}"), "wb") as f:
            f.write(os.urandom(r.randint(20 * KiB, 250 * KiB)))


def make_scale(root, files, size):
    os.makedirs(root)
    block = os.urandom(MiB)
    for i in range(files):
        with open(os.path.join(root, f"r{i:03d}"), "wb") as f:
            for _ in range(size // MiB):
                f.write(block[:1] + os.urandom(15) + block[16:])


def make_data(args):
    stamp = os.path.join(WORK, "data.ok")
    want = f"v1 {args.scale_files} {args.scale_mib}"
    if os.path.exists(stamp) and open(stamp).read() == want:
        return
    log("writing the data sets (tree, small files, scaling files)")
    for d in ("srv", "local"):
        shutil.rmtree(os.path.join(WORK, d), ignore_errors=True)
    make_tree(os.path.join(WORK, "srv", "tree"))
    make_small(os.path.join(WORK, "srv", "small"))
    make_scale(os.path.join(WORK, "srv", "scale"), args.scale_files, args.scale_mib * MiB)
    for d in ("tree", "small"):  # the local-disk references are separate copies
        shutil.copytree(os.path.join(WORK, "srv", d), os.path.join(WORK, "local", d))
    with open(stamp, "w") as f:
        f.write(want)


# ---------------------------------------------------------------- measurements

def timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def median_time(fn, runs):
    return statistics.median(timed(fn) for _ in range(runs))


def ls_lr(path):
    r = subprocess.run(["ls", "-lR", path], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if r.returncode != 0:
        raise RuntimeError(f"ls -lR {path}: {r.stderr.decode()[-500:]}")


def read_files(root):
    """Reads every file of `root` in name order (open, read to EOF, close); bytes read."""
    buf, n = bytearray(MiB), 0
    for name in sorted(os.listdir(root)):
        fd = os.open(os.path.join(root, name), os.O_RDONLY)
        try:
            while (k := os.readv(fd, [buf])):
                n += k
        finally:
            os.close(fd)
    return n


def warm_server_side(root):
    """Reads the server's copy of a data set (page cache warm, as on a file server with
    RAM): the metadata of a tree, the contents of a flat directory of files."""
    if any(e.is_dir() for e in os.scandir(root)):
        ls_lr(root)
    else:
        read_files(root)


class Rig(seed000.Bench):
    def __init__(self, args):
        super().__init__(args, 0, None)
        self.addr = f"{SRV_IP}:{PORT}"
        self.srv_pid = None

    def requests(self, addr=None):
        out = sh([self.args.binary, "server-stats", addr or self.addr, "--json"]).stdout
        return json.loads(out)

    def round_trips(self, fn, addr=None):
        """fn()'s result and the server requests made while it ran (minus the two each
        query costs)."""
        before = self.requests(addr)["requests"]
        value = fn()
        return value, self.requests(addr)["requests"] - before - 2

    def hoard(self, cache, addr=None, mnt=None, extra=()):
        mnt = mnt or os.path.join(WORK, "mnt-hoardfs")
        opts = ["--cache-dir", cache] if cache else ["--no-cache"]
        opts += [*extra, *(a for a in self.args.mount_opt or [] if a not in extra)]
        # Unless a threshold is given (twice is refused): see seed000.LOW_THRESHOLDS.
        if cache and not any(o.lstrip("-").split("=")[0] in THRESHOLD_FLAGS for o in opts):
            opts += seed000.LOW_THRESHOLDS
        return self.mount([self.args.binary, "mount", addr or self.addr, mnt, *opts],
                          mnt, "hoardfs-mount")

    def start_rclone_server(self, srv_dir):
        """In the server namespace: `rclone serve sftp srv_dir` (SSH with a password)."""
        p = self.spawn(in_ns("rclone", "serve", "sftp", srv_dir, "--addr",
                             f"{SRV_IP}:{RCLONE_PORT}", "--user", "bench", "--pass", "bench",
                             "--config", os.path.join(WORK, "rclone.conf")), "rclone-serve")
        self.wait_for(p, lambda: sh(in_ns("ss", "-Hltn", f"sport = :{RCLONE_PORT}")).stdout
                      .strip(), "rclone serve sftp")

    def rclone(self, cache):
        """`rclone mount --vfs-cache-mode full` of the rclone server, caching in `cache`."""
        mnt = os.path.join(WORK, "mnt-rclone")
        secret = sh(["rclone", "obscure", "bench"]).stdout.strip()
        remote = f":sftp,host={SRV_IP},port={RCLONE_PORT},user=bench,pass={secret}:"
        return self.mount(["rclone", "mount", remote, mnt, "--vfs-cache-mode", "full",
                           "--cache-dir", cache, "--config", os.path.join(WORK, "rclone.conf"),
                           *(self.args.rclone_opt or [])],
                          mnt, "rclone-mount")

    def sshfs(self):
        mnt = os.path.join(WORK, "mnt-sshfs")
        return self.mount(["sshfs", "-f", "-o", f"directport={SFTP_PORT}",
                           f"{SRV_IP}:{os.path.join(WORK, 'srv')}", mnt], mnt, "sshfs")


def metadata(rig, res):
    tree_local = os.path.join(WORK, "local", "tree")
    out = res.setdefault("metadata", {"dirs": 516, "files": 1548})
    drop_caches()
    out["local cold"] = timed(lambda: ls_lr(tree_local))
    out["local warm"] = median_time(lambda: ls_lr(tree_local), 5)
    cache = os.path.join(WORK, "cache")
    shutil.rmtree(cache, ignore_errors=True)
    mnt = rig.hoard(cache)
    tree = os.path.join(mnt, "tree")
    drop_caches()
    warm_server_side(os.path.join(WORK, "srv", "tree"))
    out["hoardfs cold"], out["hoardfs cold round trips"] = rig.round_trips(
        lambda: timed(lambda: ls_lr(tree)))
    out["hoardfs warm"], out["hoardfs warm round trips"] = rig.round_trips(
        lambda: median_time(lambda: ls_lr(tree), 5))
    rig.unmount(mnt)
    mnt = rig.hoard(cache)
    out["hoardfs remount"], out["hoardfs remount round trips"] = rig.round_trips(
        lambda: timed(lambda: ls_lr(tree)))
    rig.unmount(mnt)
    if not rig.args.skip_sshfs:
        mnt = rig.sshfs()
        drop_caches()
        warm_server_side(os.path.join(WORK, "srv", "tree"))
        out["sshfs cold"] = timed(lambda: ls_lr(os.path.join(mnt, "tree")))
        out["sshfs warm"] = median_time(lambda: ls_lr(os.path.join(mnt, "tree")), 3)
        rig.unmount(mnt)
    if not rig.args.skip_rclone:
        rcache = os.path.join(WORK, "rclone-cache")
        shutil.rmtree(rcache, ignore_errors=True)
        mnt = rig.rclone(rcache)
        drop_caches()
        warm_server_side(os.path.join(WORK, "srv", "tree"))
        out["rclone cold"] = timed(lambda: ls_lr(os.path.join(mnt, "tree")))
        out["rclone warm"] = median_time(lambda: ls_lr(os.path.join(mnt, "tree")), 3)
        rig.unmount(mnt)


def small_files(rig, res):
    local = os.path.join(WORK, "local", "small")
    srv = os.path.join(WORK, "srv", "small")
    out = res.setdefault("small", {})
    total = sum(os.path.getsize(os.path.join(local, n)) for n in os.listdir(local))
    out["files"], out["bytes"] = len(os.listdir(local)), total
    rate = lambda secs: total / secs / 1e6  # MB/s
    drop_caches()
    warm_server_side(srv)
    out["local cold"] = rate(timed(lambda: read_files(local)))
    out["local warm"] = rate(median_time(lambda: read_files(local), 3))
    cache = os.path.join(WORK, "cache")
    shutil.rmtree(cache, ignore_errors=True)
    mnt = rig.hoard(cache)
    d = os.path.join(mnt, "small")
    os.listdir(d)  # names (one READDIRPLUS) are not part of the read rate
    out["hoardfs first"] = rate(timed(lambda: read_files(d)))
    out["hoardfs warm"] = rate(median_time(lambda: read_files(d), 3))
    out["fuse transport"] = fuse_transport(rig, mnt)
    # Diagnostic, no target: the same with this process and the mount daemon on one CPU,
    # so that no open waits for a wake-up on another (halted) virtual CPU.
    with one_cpu([os.getpid(), rig.mounts[mnt].pid]):
        out["hoardfs warm, one CPU"] = rate(median_time(lambda: read_files(d), 3))
        out["local warm, one CPU"] = rate(median_time(lambda: read_files(local), 3))
    out["wake-up round trip us (same CPU, other CPU)"] = [wake_round_trip(0, 0),
                                                          wake_round_trip(0, 1)]
    rig.unmount(mnt)
    drop_caches()
    warm_server_side(srv)
    mnt = rig.hoard(cache)
    hot, out["hoardfs hot round trips"] = rig.round_trips(lambda: timed(lambda: read_files(d)))
    out["hoardfs hot"] = rate(hot)
    out["hoardfs hot warm"] = rate(timed(lambda: read_files(d)))
    rig.unmount(mnt)

    def hot_then_warm(extra):
        """The same cache mounted with `extra`, read hot (caches dropped) then warm."""
        drop_caches()
        warm_server_side(srv)
        mnt = rig.hoard(cache, extra=extra)
        hot = rate(timed(lambda: read_files(d)))
        warm = rate(median_time(lambda: read_files(d), 3))
        rig.unmount(mnt)
        return hot, warm

    # Over /dev/fuse (what a kernel without io_uring gets).
    if out["fuse transport"] == "io_uring":
        out["hoardfs hot, /dev/fuse"], out["hoardfs warm, /dev/fuse"] = hot_then_warm(
            ["--fuse-transport", "dev-fuse"])
    # With --kernel-opens (read-only): the kernel opens files without asking the daemon,
    # so a warm read costs no FUSE round trip (and no passthrough: hot reads are daemon
    # reads from the disk cache).
    out["hoardfs kernel opens hot"], out["hoardfs kernel opens warm"] = hot_then_warm(
        ["--read-only", "--kernel-opens"])
    out["link MB/s"] = rate_mbit(rig.args.rate) / 8
    def first_and_warm(name, mnt):
        """A peer's first read (server side warm, page cache dropped) and warm re-read."""
        d = os.path.join(mnt, "small")
        drop_caches()
        warm_server_side(srv)
        os.listdir(d)
        out[f"{name} first"] = rate(timed(lambda: read_files(d)))
        out[f"{name} warm"] = rate(median_time(lambda: read_files(d), 3))
        rig.unmount(mnt)

    if not rig.args.skip_sshfs:
        first_and_warm("sshfs", rig.sshfs())
    if not rig.args.skip_rclone:
        rcache = os.path.join(WORK, "rclone-cache")
        shutil.rmtree(rcache, ignore_errors=True)
        first_and_warm("rclone", rig.rclone(rcache))
        drop_caches()
        warm_server_side(srv)
        mnt = rig.rclone(rcache)
        d = os.path.join(mnt, "small")
        os.listdir(d)
        out["rclone hot"] = rate(timed(lambda: read_files(d)))
        rig.unmount(mnt)


def fuse_transport(rig, mnt):
    """How the mount at `mnt` is served: "io_uring" or "dev_fuse" (`hoardfs stats`)."""
    out = subprocess.run([rig.args.binary, "stats", mnt, "--json"], check=True,
                         capture_output=True, text=True).stdout
    # Builds from before the io_uring transport report no "fuse": they use /dev/fuse.
    return json.loads(out).get("fuse", {}).get("transport", "dev_fuse")


URING_PARAM = "/sys/module/fuse/parameters/enable_uring"


@contextlib.contextmanager
def uring_enabled(enable):
    """Sets the fuse module's enable_uring for the run (when `enable` and the kernel has
    it), restoring the old value afterwards."""
    old = None
    if enable and os.path.exists(URING_PARAM):
        with open(URING_PARAM) as f:
            old = f.read().strip()
        with open(URING_PARAM, "w") as f:
            f.write("Y")
    try:
        yield
    finally:
        if old is not None:
            with open(URING_PARAM, "w") as f:
                f.write(old)


@contextlib.contextmanager
def one_cpu(pids, cpu=0):
    """Runs every thread of `pids` on `cpu` only, restoring their affinity afterwards."""
    saved = {}
    for pid in pids:
        for tid in os.listdir(f"/proc/{pid}/task"):
            saved[int(tid)] = os.sched_getaffinity(int(tid))
            os.sched_setaffinity(int(tid), {cpu})
    try:
        yield
    finally:
        for tid, cpus in saved.items():
            try:
                os.sched_setaffinity(tid, cpus)
            except ProcessLookupError:
                pass


def wake_round_trip(cpu_a, cpu_b, rounds=20000):
    """Microseconds for one process to wake another through a pipe and be woken back
    (each pinned to its CPU): the scheduler's wake-up cost every FUSE request pays twice."""
    a_r, a_w = os.pipe()
    b_r, b_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.sched_setaffinity(0, {cpu_b})
        for _ in range(rounds):
            os.read(a_r, 1)
            os.write(b_w, b"x")
        os._exit(0)
    saved = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu_a})
    t0 = time.perf_counter()
    for _ in range(rounds):
        os.write(a_w, b"x")
        os.read(b_r, 1)
    dt = time.perf_counter() - t0
    os.sched_setaffinity(0, saved)
    os.waitpid(pid, 0)
    for fd in (a_r, a_w, b_r, b_w):
        os.close(fd)
    return round(dt / rounds * 1e6, 1)


def rate_mbit(rate):
    units = {"kbit": 1e-3, "mbit": 1, "gbit": 1e3}
    for u, f in units.items():
        if rate.lower().endswith(u):
            return float(rate[: -len(u)]) * f
    raise ValueError(f"rate {rate}: use kbit/mbit/gbit")


# ---------------------------------------------------------------- scaling (seed 003)

READER = r"""
import os, sys, time
bs, secs, drop, paths = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3] == "drop", sys.argv[4:]
BEHIND = int(os.environ["DROP_BEHIND"])  # bytes; 0: drop once per pass
print("ready", flush=True)
sys.stdin.read(1)  # start signal
buf, n = bytearray(bs), 0
t0, c0 = time.monotonic(), time.process_time()
stop = t0 + secs
while time.monotonic() < stop:
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        pos = dropped = 0
        while (k := os.readv(fd, [buf])):
            n += k
            pos += k
            if BEHIND and drop and pos - dropped >= BEHIND:
                os.posix_fadvise(fd, dropped, pos - dropped, os.POSIX_FADV_DONTNEED)
                dropped = pos
            if time.monotonic() >= stop:
                break
        if drop:  # the next pass must reach the server again, not this client's page cache
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
        if time.monotonic() >= stop:
            break
t1 = time.monotonic()
print(n, t0, t1, time.process_time() - c0, flush=True)
sys.stdin.read()  # exit only when all are done: exits would compete with readers
"""


# The same reader in C, the scaling workload's default: what the readers cost themselves
# matters at 256 of them on two CPUs. With the Python one (`--python-reader`) the readers
# took 19 % of the CPU at 16 readers and 38 % at 256, and 256 interpreters evicted the
# caches the file systems' copies run in (hoardfs's client CPU per GiB doubled).
C_READER = r"""
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>
static double now(clockid_t c) {
    struct timespec t; clock_gettime(c, &t); return t.tv_sec + t.tv_nsec / 1e9;
}
int main(int argc, char **argv) {
    long bs = atol(argv[1]); double secs = atof(argv[2]); int drop = !strcmp(argv[3], "drop");
    const char *b = getenv("DROP_BEHIND"); long behind = b ? atol(b) : 0;
    char *buf = malloc(bs), c; long long n = 0;
    printf("ready\n"); fflush(stdout);
    if (read(0, &c, 1) != 1) return 1;
    double t0 = now(CLOCK_MONOTONIC), c0 = now(CLOCK_PROCESS_CPUTIME_ID), stop = t0 + secs;
    while (now(CLOCK_MONOTONIC) < stop) {
        for (int i = 4; i < argc; i++) {
            int fd = open(argv[i], O_RDONLY); if (fd < 0) return 1;
            long long pos = 0, dropped = 0; ssize_t k;
            struct iovec v = { buf, (size_t)bs };
            while ((k = readv(fd, &v, 1)) > 0) {
                n += k; pos += k;
                if (behind && drop && pos - dropped >= behind) {
                    posix_fadvise(fd, dropped, pos - dropped, POSIX_FADV_DONTNEED); dropped = pos;
                }
                if (now(CLOCK_MONOTONIC) >= stop) break;
            }
            if (k < 0) return 1;
            if (drop) posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
            close(fd);
            if (now(CLOCK_MONOTONIC) >= stop) break;
        }
    }
    double t1 = now(CLOCK_MONOTONIC);
    printf("%lld %.9f %.9f %.6f\n", n, t0, t1, now(CLOCK_PROCESS_CPUTIME_ID) - c0); fflush(stdout);
    while (read(0, &c, 1) > 0) {}
    return 0;
}
"""

# The reader command (`main` sets the C one unless `--python-reader`, or without `cc`).
READER_CMD = [sys.executable, "-c", READER]


def build_c_reader(dir):
    """Compiles `C_READER` into `dir`; returns its path."""
    src, exe = os.path.join(dir, "reader.c"), os.path.join(dir, "reader")
    with open(src, "w") as f:
        f.write(C_READER)
    subprocess.run(["cc", "-O2", "-o", exe, src], check=True)
    return exe


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_cpu(pids):
    """CPU seconds by thread name (digits dropped) over the given processes."""
    out = {}
    for pid in pids:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    raw = f.read()
            except FileNotFoundError:
                continue
            name = raw[raw.index("(") + 1: raw.rindex(")")].rstrip("0123456789.-")
            fields = raw.rsplit(")", 1)[1].split()
            cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            out[name] = out.get(name, 0) + cpu
    return out


def switches(pids):
    """Context switches (voluntary, involuntary) of all threads of the given processes."""
    vol = invol = 0
    for pid in pids:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/status") as f:
                    for line in f:
                        if line.startswith("voluntary_ctxt_switches:"):
                            vol += int(line.split()[1])
                        elif line.startswith("nonvoluntary_ctxt_switches:"):
                            invol += int(line.split()[1])
            except FileNotFoundError:  # the thread ended
                continue
    return vol, invol


def proc_value(path, key):
    """The number after `key` in a /proc key-value file (0 if absent)."""
    with open(path) as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1])
    return 0


def rss_kib(pid):
    return proc_value(f"/proc/{pid}/status", "VmRSS:")


def disk_read_bytes(pid):
    """Bytes a process made the kernel fetch from storage (/proc/PID/io read_bytes)."""
    return proc_value(f"/proc/{pid}/io", "read_bytes:")


def resident_fraction(paths):
    """Share of the files' bytes in the page cache (fincore)."""
    out = json.loads(sh(["fincore", "--json", "--bytes", "--output", "RES,SIZE", *paths]).stdout)
    res = sum(int(f["res"]) for f in out["fincore"])
    size = sum(int(f["size"]) for f in out["fincore"])
    return res / max(size, 1)


PAGE_REPORTING = "/sys/module/page_reporting/parameters"


def reported_kib():
    """Guest memory this VM has handed back to its host so far (free page reporting; the
    host refaults every reported page when the guest touches it again), or None."""
    try:
        with open(os.path.join(PAGE_REPORTING, "reported_kib")) as f:
            return int(f.read())
    except OSError:
        return None


@contextlib.contextmanager
def lazy_page_reporting(enabled):
    """Diagnostic: while active, memory must stay free for a minute before it is reported
    to the host, so page cache freed and reallocated within a scaling point is not.
    Restores the setting afterwards; does nothing where the knob does not exist."""
    knob = os.path.join(PAGE_REPORTING, "min_free_ms")
    if not enabled or not os.path.exists(knob):
        if enabled:
            log("no page_reporting min_free_ms on this machine: --lazy-page-reporting ignored")
        yield
        return
    with open(knob) as f:
        old = f.read().strip()
    with open(knob, "w") as f:
        f.write("60000")
    restore = lambda: open(knob, "w").write(old)  # noqa: E731
    atexit.register(restore)  # also on a signal or an exception below
    try:
        yield
    finally:
        restore()
        atexit.unregister(restore)


def first_touch_gbps():
    """GB/s at which a new process fills 1 GiB of memory it has never touched (dd from
    /dev/zero). On this VM it measured 3.0 at some times and 1.1-1.2 at others (free memory
    the host had taken back through page reporting faults on the host first). Recorded with
    the scaling points, whose page cache comes from that memory."""
    r = sh(["dd", "if=/dev/zero", "of=/dev/null", "bs=1G", "count=1"], check=False)
    words = r.stderr.strip().splitlines()[-1].split() if r.stderr.strip() else []
    try:
        rate, unit = float(words[-2]), words[-1]
    except (IndexError, ValueError):
        return None
    return rate * {"kB/s": 1e-6, "MB/s": 1e-3, "GB/s": 1.0}.get(unit, float("nan"))


def fuse_reads(rig, mnts):
    return sum(json.loads(sh([rig.args.binary, "stats", m, "--json"]).stdout)
               ["counters"]["reads"] for m in mnts)


def start_readers(readers, bs, secs, dirs, files, drop, behind=0):
    """Reader processes, started and waiting for the signal; reader i reads files
    i, i + readers, ... under dirs[i % len(dirs)]."""
    procs = []
    for i in range(readers):
        mine = [os.path.join(dirs[i % len(dirs)], f) for f in files[i::readers]]
        procs.append(subprocess.Popen([*READER_CMD, str(bs), str(secs),
                                       "drop" if drop else "keep", *mine],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      env={**os.environ, "DROP_BEHIND": str(behind)}))
    for p in procs:  # every interpreter started and waits for the signal
        if p.stdout.readline() != b"ready\n":
            raise RuntimeError("a reader process failed to start")
    return procs


def finish_readers(procs):
    """Signals the readers, waits for their results; returns the aggregate rate (all bytes
    over the span from the first start to the last stop, bytes/s), the bytes, the
    sorted per-reader rates and the CPU seconds the readers used while reading."""
    for p in procs:
        p.stdin.write(b"x")
        p.stdin.flush()
    done = [p.stdout.readline().split() for p in procs]
    for p in procs:
        p.stdin.close()
    if any(p.wait() != 0 for p in procs) or any(len(d) != 4 for d in done):
        raise RuntimeError("a reader process failed")
    total = sum(int(d[0]) for d in done)
    span = max(float(d[2]) for d in done) - min(float(d[1]) for d in done)
    rates = sorted(int(d[0]) / (float(d[2]) - float(d[1])) for d in done)
    return total / span, total, rates, sum(float(d[3]) for d in done)


def local_run(rig, readers, bs, files):
    """The same readers on the server's own directory (page cache): what this machine
    does with that many reader processes when no file system is in between."""
    procs = start_readers(readers, bs, rig.args.scale_seconds,
                          [os.path.join(WORK, "srv", "scale")], files, drop=False)
    rate, _, _, _ = finish_readers(procs)
    return rate / 1e6


def scaling_run(rig, mnts, readers, bs, files, profile=False):
    secs = rig.args.scale_seconds
    procs = start_readers(readers, bs, secs, [os.path.join(m, "scale") for m in mnts], files,
                          drop=True, behind=rig.args.scale_drop_behind_kib * KiB)
    cpids = [p.pid for p in (rig.mounts[m] for m in mnts)]
    resident = resident_fraction([os.path.join(WORK, "srv", "scale", f) for f in files])
    disk0 = disk_read_bytes(rig.srv_pid)
    srv0, cli0 = cpu_seconds(rig.srv_pid), sum(cpu_seconds(p) for p in cpids)
    threads0 = thread_cpu(cpids)
    sw0, ctxt0 = switches(cpids), proc_value("/proc/stat", "ctxt")
    c0 = rig.requests(f"127.0.0.1:{LOOP_PORT}")
    fuse0 = fuse_reads(rig, mnts)
    reported0 = reported_kib()
    perf = None
    if profile:
        data = os.path.join(rig.out_dir, f"perf-scaling-{readers}x{bs // KiB}k.data")
        perf = subprocess.Popen(["perf", "record", "-a", "-g", "-F", "1999", "-o", data],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1)
    t0 = time.monotonic()
    # Every reader reads for the same time (seed 003: "reads a file till it is killed");
    # the rate is all their bytes over the span they ran in together.
    rate, total, rates, reader_cpu = finish_readers(procs)
    wall = time.monotonic() - t0
    if perf:
        perf.send_signal(signal.SIGINT)
        perf.wait()
        summarize_profile(data)
    srv_cpu = cpu_seconds(rig.srv_pid) - srv0
    disk = disk_read_bytes(rig.srv_pid) - disk0
    threads1 = thread_cpu(cpids)
    sw1, ctxt1 = switches(cpids), proc_value("/proc/stat", "ctxt")
    by_thread = {k: round(v - threads0.get(k, 0), 2) for k, v in threads1.items()
                 if v - threads0.get(k, 0) > 0.005}
    cli_cpu = sum(cpu_seconds(p) for p in cpids) - cli0
    c1 = rig.requests(f"127.0.0.1:{LOOP_PORT}")
    client_rss = max(rss_kib(p) for p in cpids)
    n_fuse = fuse_reads(rig, mnts) - fuse0
    reported = None if reported0 is None else (reported_kib() - reported0) / 1024
    gib = total / (1 << 30)
    reads = c1["reads"] - c0["reads"]
    return {"readers": readers, "io_size": bs, "bytes": total, "seconds": secs,
            "drop behind KiB": rig.args.scale_drop_behind_kib,
            "lazy page reporting": rig.args.lazy_page_reporting,
            "guest MiB reported to host": reported,
            "MB/s": rate / 1e6, "server reads": reads,
            "server reads per MiB read": reads / max(total / MiB, 1),
            "server opens": c1["opens"] - c0["opens"],
            "FUSE read KiB": total / max(n_fuse, 1) / KiB,
            "opens per read": (c1["opens"] - c0["opens"]) / max(reads, 1),
            "server CPU s/GiB": srv_cpu / gib, "client CPU s/GiB": cli_cpu / gib,
            "reader CPU s/GiB": reader_cpu / gib,
            "server RSS KiB": rss_kib(rig.srv_pid), "client RSS KiB": client_rss,
            "server files resident before": resident,
            "reader MB/s (min, median, max)": [round(rates[0] / 1e6, 1),
                                               round(rates[len(rates) // 2] / 1e6, 1),
                                               round(rates[-1] / 1e6, 1)],
            "wall seconds": wall,
            "client CPU s by thread": by_thread,
            "context switches per MiB (system, client voluntary, client involuntary)": [
                round((ctxt1 - ctxt0) / max(total / MiB, 1), 1),
                round((sw1[0] - sw0[0]) / max(total / MiB, 1), 1),
                round((sw1[1] - sw0[1]) / max(total / MiB, 1), 1)], "server disk reads MiB": disk / MiB}


def peer_mounts(rig, peer, n):
    """`n` mounts of `peer` ("sshfs" or "rclone", served on loopback by the caller), as
    uncached as each can be: sshfs as it comes, rclone with --vfs-cache-mode off."""
    mnts = []
    for i in range(n):
        mnt = os.path.join(WORK, f"mnt-{peer}-scale{i}")
        if peer == "sshfs":
            cmd = ["sshfs", "-f", "-o", f"directport={PEER_SFTP_PORT}",
                   f"127.0.0.1:{os.path.join(WORK, 'srv')}", mnt]
        else:
            secret = sh(["rclone", "obscure", "bench"]).stdout.strip()
            cmd = ["rclone", "mount", f":sftp,host=127.0.0.1,port={PEER_RCLONE_PORT},user=bench,"
                   f"pass={secret}:", mnt, "--vfs-cache-mode", "off",
                   "--config", os.path.join(WORK, "rclone.conf"), *(rig.args.rclone_opt or [])]
        mnts.append(rig.mount(cmd, mnt, f"{peer}-scale{i}"))
    return mnts


def peer_scaling(rig, res, files):
    """The scaling points through sshfs and rclone (four mounts each, on loopback): the
    aggregate rate alone, as seed 003 reports its peers."""
    peers = [p for p in ("sshfs", "rclone") if not getattr(rig.args, f"skip_{p}")]
    rows = res.setdefault("scaling peers", [])
    for peer in peers:
        if peer == "sshfs":
            # (sftp-server runs as root without authentication: any local user may use it
            # while the benchmark runs. This is a private benchmark VM.)
            srv = rig.spawn(["socat", f"TCP-LISTEN:{PEER_SFTP_PORT},bind=127.0.0.1,reuseaddr,fork",
                             f"EXEC:{seed000.sftp_server_path()}"], "sftp-socat-loopback")
            port = PEER_SFTP_PORT
        else:
            srv = rig.spawn(["rclone", "serve", "sftp", os.path.join(WORK, "srv"), "--addr",
                             f"127.0.0.1:{PEER_RCLONE_PORT}", "--user", "bench", "--pass",
                             "bench", "--config", os.path.join(WORK, "rclone.conf")],
                            "rclone-serve-loopback")
            port = PEER_RCLONE_PORT
        rig.wait_for(srv, lambda: sh(["ss", "-Hltn", f"sport = :{port}"]).stdout.strip(),
                     f"{peer} server on loopback")
        mnts = peer_mounts(rig, peer, rig.args.clients)
        for bs in (4 * KiB, 128 * KiB):
            for n in rig.args.readers:
                procs = start_readers(n, bs, rig.args.scale_seconds,
                                      [os.path.join(m, "scale") for m in mnts], files, drop=True,
                                      behind=rig.args.scale_drop_behind_kib * KiB)
                rate, _, _, _ = finish_readers(procs)
                rows.append({"peer": peer, "readers": n, "io_size": bs, "MB/s": rate / 1e6})
                log(f"scaling: {peer} {n:>3} readers x {bs // KiB:>3} KiB: {rate / 1e6:7.0f} MB/s")
        for m in mnts:
            rig.unmount(m)
        rig.stop(srv)


def summarize_profile(data):
    """Writes who used the CPU (by command) and the top symbols next to a perf.data."""
    base = data[: -len(".data")]
    fuse_threads = ",".join(f"fuser-{i}" for i in range(64))
    for suffix, extra in (("-by-command.txt", ["--sort", "comm"]),
                          ("-symbols.txt", ["--sort", "comm,dso,sym"]),
                          # The clients' FUSE worker threads alone, as shares of their time.
                          ("-fuse-threads.txt", ["--sort", "sym", "--comms", fuse_threads,
                                                 "--percentage", "relative"])):
        r = sh(["perf", "report", "-i", data, "--no-children", "--stdio", "-g", "none",
                "--percent-limit", "0.5", *extra], check=False)
        with open(base + suffix, "w") as f:
            f.write(r.stdout)
    log(f"profile: {base}-by-command.txt, {base}-symbols.txt")


def scaling(rig, res):
    p = rig.spawn([rig.args.binary, "serve", os.path.join(WORK, "srv"), "--listen",
                   f"127.0.0.1:{LOOP_PORT}", *(rig.args.serve_opt or [])],
                  "hoardfs-serve-loopback")
    rig.wait_output(p, "hoardfs: serving", "hoardfs serve (loopback)")
    rig.srv_pid = p.pid
    files = sorted(os.listdir(os.path.join(WORK, "srv", "scale")))
    warm_server_side(os.path.join(WORK, "srv", "scale"))
    rows = res.setdefault("scaling", [])
    res["memory first touch GB/s"] = first_touch_gbps()
    log(f"scaling: this VM fills never-touched memory at {res['memory first touch GB/s']} GB/s")
    # The clients stay mounted through every point, as on a client machine (a fresh
    # process per point would measure its memory warming up, not the server).
    mnts = [rig.hoard(None, addr=f"127.0.0.1:{LOOP_PORT}",
                      mnt=os.path.join(WORK, f"mnt-scale{i}")) for i in range(rig.args.clients)]
    for bs in (4 * KiB, 128 * KiB):
        by_n = {}
        for n in rig.args.readers:
            with lazy_page_reporting(rig.args.lazy_page_reporting):
                r = scaling_run(rig, mnts, n, bs, files)
                r["local MB/s"] = local_run(rig, n, bs, files)
                if rig.args.profile:
                    # A separate, unreported run of every point (perf -a -g slows 256
                    # processes down): what grows with N shows against the small points.
                    scaling_run(rig, mnts, n, bs, files, profile=True)
            log(f"scaling: {n:>3} readers x {bs // KiB:>3} KiB: {r['MB/s']:7.0f} MB/s "
                f"(local page cache {r['local MB/s']:.0f}) "
                f"(readers {r['reader MB/s (min, median, max)']}), "
                f"{r['opens per read']:.4f} opens/read, "
                f"{r['server reads per MiB read']:.3f} server reads/MiB, "
                f"server {r['server CPU s/GiB']:.2f} CPU-s/GiB, "
                f"client {r['client CPU s/GiB']:.2f} {r['client CPU s by thread']}, "
                f"readers {r['reader CPU s/GiB']:.2f} CPU-s/GiB, "
                f"RSS server {r['server RSS KiB'] // 1024} client "
                f"{r['client RSS KiB'] // 1024} MiB, FUSE reads of {r['FUSE read KiB']:.0f} KiB, "
                f"server files {r['server files resident before']:.0%} resident, "
                f"{r['server disk reads MiB']:.0f} MiB from disk, "
                f"{r['guest MiB reported to host'] or 0:.0f} MiB guest memory reported to the host")
            r["MB/s by pass"] = [r["MB/s"]]
            r["local MB/s by pass"] = [r["local MB/s"]]
            by_n[n] = r
            rows.append(r)
        # Later passes in alternating order (the second from 256 readers down to 1), so
        # that a drift of the machine during the run weighs on every N alike; a point's
        # MB/s is the mean of its passes (see --scale-passes).
        for k in range(1, rig.args.scale_passes):
            order = rig.args.readers[::-1] if k % 2 else rig.args.readers
            for n in order:
                with lazy_page_reporting(rig.args.lazy_page_reporting):
                    later = scaling_run(rig, mnts, n, bs, files)
                    # The local reference gets the same passes, so that its ratio (an
                    # INFO row beside the check) is not a max of single points either.
                    later["local MB/s"] = local_run(rig, n, bs, files)
                r = by_n[n]
                # A row's other fields are its first pass's; each later pass is kept whole.
                r.setdefault("later passes", []).append(later)
                r["MB/s by pass"].append(later["MB/s"])
                r["MB/s"] = statistics.mean(r["MB/s by pass"])
                r["local MB/s by pass"].append(later["local MB/s"])
                r["local MB/s"] = statistics.mean(r["local MB/s by pass"])
                log(f"scaling: {n:>3} readers x {bs // KiB:>3} KiB, pass {k + 1}: "
                    f"{later['MB/s']:7.0f} MB/s (mean of passes {r['MB/s']:.0f}; local page "
                    f"cache {later['local MB/s']:.0f}, mean {r['local MB/s']:.0f})")
    for m in mnts:
        rig.unmount(m)
    rig.stop(p)
    peer_scaling(rig, res, files)


# ---------------------------------------------------------------- report

def checks(res):
    out = []

    def check(name, value, op, target):
        ok = None if value is None else value >= target if op == ">=" else value <= target
        out.append({"check": name, "value": value, "op": op, "target": target,
                    "result": "SKIP" if ok is None else "PASS" if ok else "FAIL"})

    m, s = res.get("metadata"), res.get("small")
    if m:
        check("ls -lR warm vs local (speed)", m["local warm"] / m["hoardfs warm"], ">=", 0.9)
        check("ls -lR cold round trips per dir", m["hoardfs cold round trips"] / m["dirs"],
              "<=", 1.05)
        check("ls -lR remount round trips per dir",
              m["hoardfs remount round trips"] / m["dirs"], "<=", 1.05)
        # Issue 21: cold ≤ 1.5×, after a remount ≤ 1.0× the local disk cold (times).
        check("ls -lR cold vs local cold (time)", m["hoardfs cold"] / m["local cold"], "<=", 1.5)
        check("ls -lR remount vs local cold (time)", m["hoardfs remount"] / m["local cold"],
              "<=", 1.0)
    if s:
        check("small files warm vs local warm", s["hoardfs warm"] / s["local warm"], ">=", 0.5)
        check("small files hot vs local cold", s["hoardfs hot"] / s["local cold"], ">=", 0.5)
        check("small files first read vs link", s["hoardfs first"] / s["link MB/s"], ">=", 0.5)
        if "hoardfs kernel opens warm" in s:
            check("small files warm, --kernel-opens",
                  s["hoardfs kernel opens warm"] / s["local warm"], ">=", 0.5)
            check("small files hot, --kernel-opens",
                  s["hoardfs kernel opens hot"] / s["local cold"], ">=", 0.5)
        if "hoardfs warm, /dev/fuse" in s:  # the fallback transport, no target of its own
            for k, ref in (("warm", "local warm"), ("hot", "local cold")):
                out.append({"check": f"small files {k} over /dev/fuse vs {ref}",
                            "value": s[f"hoardfs {k}, /dev/fuse"] / s[ref],
                            "op": "", "target": 0, "result": "INFO"})
        if "hoardfs warm, one CPU" in s:  # context, no target
            # Against the faster of the two local references (pinning can slow it too).
            ref = max(s["local warm"], s["local warm, one CPU"])
            out.append({"check": "small files warm on one CPU vs local warm",
                        "value": s["hoardfs warm, one CPU"] / ref,
                        "op": "", "target": 0, "result": "INFO"})
    for bs in (4 * KiB, 128 * KiB):
        rows = [r for r in res.get("scaling", []) if r["io_size"] == bs]
        if rows and rows[-1]["readers"] == max(r["readers"] for r in rows):
            best = max(r["MB/s"] for r in rows)
            # Diagnostic runs say so in the check's name: they do not measure the target.
            how = ", lazy page reporting" if rows[-1].get("lazy page reporting") else ""
            if rows[-1].get("drop behind KiB"):
                how += f", drop behind {rows[-1]['drop behind KiB']} KiB"
            # Issue 21's targets: 256 readers at 0.9x of the peak, and with 4 KiB reads
            # (where each request carries least) at 0.8x of the 4 KiB peak.
            check(f"{bs // KiB} KiB: {rows[-1]['readers']} readers vs best N{how}",
                  rows[-1]["MB/s"] / best, ">=", 0.8 if bs == 4 * KiB else 0.9)
            if all("local MB/s" in r for r in rows):  # context, no target
                lbest = max(r["local MB/s"] for r in rows)
                out.append({"check": f"{bs // KiB} KiB: same on local page cache",
                            "value": rows[-1]["local MB/s"] / lbest, "op": "", "target": 0,
                            "result": "INFO"})
        for peer in ("sshfs", "rclone"):  # the peers, same measure, no target
            prow = [r for r in res.get("scaling peers", [])
                    if r["peer"] == peer and r["io_size"] == bs]
            if prow and max(r["MB/s"] for r in prow) > 0:
                out.append({"check": f"{bs // KiB} KiB: same through {peer}",
                            "value": prow[-1]["MB/s"] / max(r["MB/s"] for r in prow),
                            "op": "", "target": 0, "result": "INFO"})
    return out


def plots(res, out_dir):
    made = []
    sc = res.get("scaling")
    if sc:
        series = [(f"{bs // KiB} KiB reads", [(r["readers"], r["MB/s"]) for r in sc
                                              if r["io_size"] == bs]) for bs in (4 * KiB, 128 * KiB)]
        series += [(f"local page cache, {bs // KiB} KiB",
                    [(r["readers"], r["local MB/s"]) for r in sc
                     if r["io_size"] == bs and "local MB/s" in r]) for bs in (4 * KiB, 128 * KiB)]
        peers = res.get("scaling peers", [])
        series += [(f"{peer}, {bs // KiB} KiB",
                    [(r["readers"], r["MB/s"]) for r in peers
                     if r["peer"] == peer and r["io_size"] == bs])
                   for peer in ("sshfs", "rclone") for bs in (4 * KiB, 128 * KiB)
                   if any(r["peer"] == peer for r in peers)]
        svgplot.line_chart(os.path.join(out_dir, "scaling.svg"),
                           "hoardfs server: aggregate read throughput vs parallel readers",
                           "reader processes", "MB/s (all readers)", series, xlog2=True)
        made.append("scaling.svg")
    m = res.get("metadata")
    if m:
        ms = lambda k: None if k not in m else m[k] * 1000
        svgplot.bar_chart(os.path.join(out_dir, "lslr.svg"),
                          "ls -lR, 516 dirs / 1,548 files (lower is better)", "milliseconds",
                          [("cold", [ms("local cold"), ms("hoardfs cold"), ms("sshfs cold"),
                                     ms("rclone cold")]),
                           ("warm", [ms("local warm"), ms("hoardfs warm"), ms("sshfs warm"),
                                     ms("rclone warm")]),
                           ("after remount", [None, ms("hoardfs remount"), None, None])],
                          ["local disk", "hoardfs", "sshfs", "rclone"],
                          note=f"hoardfs server round trips: cold {m['hoardfs cold round trips']}, "
                               f"warm {m['hoardfs warm round trips']}, after remount "
                               f"{m['hoardfs remount round trips']}")
        made.append("lslr.svg")
    s = res.get("small")
    if s:
        g = lambda k: s.get(k)
        svgplot.bar_chart(os.path.join(out_dir, "small-files.svg"),
                          "1,000 files of 20-250 KiB: read rate (higher is better)", "MB/s",
                          [("first read / cold", [g("local cold"), g("hoardfs first"),
                                                  None, g("sshfs first"), g("rclone first")]),
                           ("warm (page cache)", [g("local warm"), g("hoardfs warm"),
                                                  g("hoardfs kernel opens warm"),
                                                  g("sshfs warm"), g("rclone warm")]),
                           ("hot (remounted)", [g("local cold"), g("hoardfs hot"),
                                                g("hoardfs kernel opens hot"), None,
                                                g("rclone hot")])],
                          ["local disk", "hoardfs", "hoardfs --kernel-opens", "sshfs", "rclone"],
                          note=f"link {s['link MB/s']:.1f} MB/s; hot is compared with the local "
                               "disk with its page cache dropped")
        made.append("small-files.svg")
    return made


def report(res, chk):
    m, s = res.get("metadata"), res.get("small")
    if m:
        print("\nls -lR (516 dirs, 1548 files)   seconds   server round trips")
        for k in ("local cold", "local warm", "hoardfs cold", "hoardfs warm", "hoardfs remount",
                  "sshfs cold", "sshfs warm", "rclone cold", "rclone warm"):
            if k in m:
                rt = m.get(k + " round trips", "")
                print(f"  {k:<28} {m[k]:8.4f}   {rt}")
    if s:
        print(f"\nsmall files ({s['files']} files, {s['bytes'] / MiB:.0f} MiB)   MB/s"
              f"   (hoardfs rows over {s.get('fuse transport')})")
        for k in ("local cold", "local warm", "hoardfs first", "hoardfs warm", "hoardfs hot",
                  "hoardfs hot warm", "hoardfs hot, /dev/fuse", "hoardfs warm, /dev/fuse",
                  "hoardfs kernel opens hot", "hoardfs kernel opens warm",
                  "sshfs first", "sshfs warm", "rclone first", "rclone warm", "rclone hot",
                  "link MB/s",
                  "local warm, one CPU", "hoardfs warm, one CPU"):
            if k in s:
                print(f"  {k:<28} {s[k]:8.1f}")
        k = "wake-up round trip us (same CPU, other CPU)"
        if k in s:
            print(f"  {k}: {s[k][0]} / {s[k][1]}")
    if res.get("scaling"):
        print(f"\nnever-touched memory filled at {res.get('memory first touch GB/s')} GB/s "
              "before the scaling points")
        print("readers  io   MB/s  local MB/s  opens/read  srv CPU-s/GiB  cli CPU-s/GiB  "
              "srv RSS MiB  MB/s by pass")
        for r in res["scaling"]:
            print(f"  {r['readers']:>4} {r['io_size'] // KiB:>4}K {r['MB/s']:7.0f} "
                  f"{r.get('local MB/s', 0):10.0f} "
                  f"{r['opens per read']:10.4f} {r['server CPU s/GiB']:13.2f} "
                  f"{r['client CPU s/GiB']:14.2f} {r['server RSS KiB'] / 1024:11.0f}  "
                  f"{' / '.join(f'{v:.0f}' for v in r.get('MB/s by pass', []))}")
        for r in res.get("scaling peers", []):
            print(f"  {r['readers']:>4} {r['io_size'] // KiB:>4}K {r['MB/s']:7.0f}  ({r['peer']})")
    print(f"\n{'Check':<40} {'value':>8}  target  result")
    for c in chk:
        v = "-" if c["value"] is None else f"{c['value']:.2f}"
        tgt = f"{c['op']}{c['target']:<5}" if c["op"] else " " * 7
        print(f"{c['check']:<40} {v:>8}  {tgt} {c['result']}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--binary", default=os.path.join(REPO, "target", "release", "hoardfs"))
    ap.add_argument("--rate", default="100mbit", help="tc tbf rate of the shaped link")
    ap.add_argument("--out", help="directory for JSON and plots (default bench/out)")
    ap.add_argument("--only", choices=["metadata", "small", "scaling"], action="append",
                    help="run only these workloads (repeatable)")
    ap.add_argument("--readers", type=int, nargs="+", default=[1, 4, 16, 64, 256])
    ap.add_argument("--clients", type=int, default=4, help="--no-cache mounts for scaling")
    ap.add_argument("--scale-files", type=int, default=256)
    ap.add_argument("--scale-mib", type=int, default=4, help="size of each scaling file")
    # 10 s: with 4 s points the 256-reader ratio of one run spread 0.88-0.97 (the peak is
    # the best of five noisy points), with 10 s 0.93-0.97 (doc/BENCHMARKS.md).
    ap.add_argument("--scale-seconds", type=float, default=10.0,
                    help="how long every reader reads in each scaling point")
    # 2: the check divides the 256-reader point by the best point of the run, and the best
    # of five single noisy points is biased upwards; each point's mean over two passes in
    # opposite orders is not (doc/BENCHMARKS.md).
    ap.add_argument("--scale-passes", type=int, default=2, choices=range(1, 9), metavar="N",
                    help="how many times every hoardfs scaling point is run (the second "
                         "pass in reverse order); a point's MB/s is the mean")
    ap.add_argument("--scale-drop-behind-kib", type=int, default=0, metavar="KIB",
                    help="diagnostic: scaling readers drop their page cache behind them "
                         "every KIB read, not once per pass (bounds what each reader "
                         "holds in memory)")
    ap.add_argument("--lazy-page-reporting", action="store_true",
                    help="diagnostic: during each scaling point, free guest memory is "
                         "reported to the VM host only after a minute free (page_reporting "
                         "min_free_ms; restored afterwards), so page cache recycled within "
                         "the point is not refaulted from the host")
    ap.add_argument("--skip-sshfs", action="store_true")
    ap.add_argument("--skip-rclone", action="store_true")
    ap.add_argument("--rclone-opt", action="append", metavar="ARG",
                    help="extra argument for every rclone mount (repeatable)")
    ap.add_argument("--mount-opt", action="append", metavar="ARG",
                    help="extra argument for every hoardfs mount (repeatable)")
    ap.add_argument("--serve-opt", action="append", metavar="ARG",
                    help="extra argument for every hoardfs server (repeatable)")
    ap.add_argument("--profile", action="store_true",
                    help="perf record -a -g an extra, unreported run of every scaling point "
                         "(summaries, FUSE threads alone too, in --out)")
    ap.add_argument("--python-reader", action="store_true",
                    help="scaling readers in Python instead of C (the same loop; the harness "
                         "before 2026-11-25)")
    ap.add_argument("--keep", action="store_true", help="leave namespace/processes for debugging")
    ap.add_argument("--dev-fuse", action="store_true",
                    help="leave the fuse module's enable_uring alone (mounts then use "
                         "/dev/fuse unless it is already set)")
    args = ap.parse_args()
    if len(set(args.readers)) != len(args.readers):
        ap.error("--readers: each count once (a point's passes are matched by its count)")
    if os.geteuid() != 0:
        sys.exit("workloads: run as root (namespaces, tc, drop_caches, FUSE mounts)")
    args.binary = os.path.abspath(args.binary)
    only = set(args.only or ["metadata", "small", "scaling"])
    if not args.python_reader:
        global READER_CMD
        if shutil.which("cc"):
            reader_dir = tempfile.mkdtemp(prefix="hoardfs-reader-")
            atexit.register(shutil.rmtree, reader_dir, True)
            READER_CMD = [build_c_reader(reader_dir)]
        else:
            log("no C compiler (cc): the scaling readers are Python processes")
            args.python_reader = True
    seed000.ensure_packages()
    if not args.skip_rclone and not shutil.which("rclone"):
        log("installing rclone (its rows; --skip-rclone leaves them out)")
        subprocess.run(["apt-get", "update"], check=True)
        subprocess.run(["apt-get", "install", "-y", "rclone"], check=True)
    if not os.path.exists(args.binary):
        log(f"{args.binary} missing: running cargo build --release")
        subprocess.run(["cargo", "build", "--release"], cwd=REPO, check=True)
    shutil.rmtree(os.path.join(WORK, "logs"), ignore_errors=True)
    os.makedirs(os.path.join(WORK, "logs"), exist_ok=True)
    seed000.clean_leftovers()
    make_data(args)
    rig = Rig(args)
    rig.out_dir = os.path.abspath(args.out or os.path.join(REPO, "bench", "out"))
    os.makedirs(rig.out_dir, exist_ok=True)
    atexit.register(rig.cleanup)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda n, _: sys.exit(f"workloads: signal {n}, cleaning up"))
    res = {"benchmark": "workloads", "time": datetime.datetime.now().strftime("%Y%m%d-%H%M%S"),
           "kernel": os.uname().release, "rate": args.rate,
           "scaling readers": "Python" if args.python_reader else "C"}
    uring = uring_enabled(not args.dev_fuse)
    uring.__enter__()
    try:
        if only & {"metadata", "small"}:
            seed000.setup_network(args.rate)
            rig.start_ns_servers(os.path.join(WORK, "srv"), PORT, sftp=not args.skip_sshfs,
                                 sftp_port=SFTP_PORT)
            if not args.skip_rclone:
                rig.start_rclone_server(os.path.join(WORK, "srv"))
            if "metadata" in only:
                metadata(rig, res)
            if "small" in only:
                small_files(rig, res)
        if "scaling" in only:
            scaling(rig, res)
    finally:
        rig.cleanup()
        uring.__exit__(None, None, None)
    chk = checks(res)
    res["checks"] = chk
    out_dir = os.path.abspath(args.out or os.path.join(REPO, "bench", "out"))
    os.makedirs(out_dir, exist_ok=True)
    res["plots"] = plots(res, out_dir)
    for name in (f"workloads-{res['time']}.json", "workloads-latest.json"):
        with open(os.path.join(out_dir, name), "w") as f:
            json.dump(res, f, indent=2)
    report(res, chk)
    log(f"results and plots ({', '.join(res['plots'])}) in {out_dir}")
    return 1 if any(c["result"] == "FAIL" for c in chk) else 0


if __name__ == "__main__":
    sys.exit(main())
