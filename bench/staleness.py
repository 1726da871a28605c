#!/usr/bin/env python3
"""Measure how long a change stays invisible to another client (callback latency).

One `hoardfs serve` on 127.0.0.1 and two clients, A and B, each with its own cache; B
mounts with --attr-timeout 60, so without callback breaks it would see stale attributes for
a minute. Each trial writes new content of a new length to a file and takes t0 right after
close() returns; B then polls stat() and the file's content (no sleeps) until both show the
new version. Latency = t_seen - t0.

  client case: A writes the file through its mount
  server case: the file is written directly in the exported directory

Reports median, p99 and max per case and PASS/FAIL against the target (median and p99
<= 100 ms, no trial timing out). Run as root: python3 bench/staleness.py. Results go to
bench/out/staleness-<time>.json and bench/out/staleness-latest.json.
"""
import argparse
import atexit
import datetime
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time

from seed000 import force_unmount, is_mounted

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORK = os.path.join(REPO, "bench", "out", "staleness-work")  # on the real disk, never tmpfs
TARGET_MS = 100.0
CASES = ("client", "server")


def log(msg):
    print(f"[staleness] {msg}", file=sys.stderr, flush=True)


def clean_leftovers():
    """Detach mounts a crashed earlier run left under WORK; safe to call twice."""
    if not os.path.isdir(WORK):
        return
    with open("/proc/mounts") as f:
        for mnt in [l.split()[1] for l in f if l.split()[1].startswith(WORK + "/")]:
            force_unmount(mnt)


class Rig:
    """The server and the two clients; cleanup() undoes everything, also after errors."""

    def __init__(self, binary):
        self.binary = binary
        self.procs = {}   # Popen -> log path
        self.mounts = []  # mount points, in mount order
        self.seq = 0
        self.cleaned = False

    def spawn(self, cmd, name):
        self.seq += 1
        path = os.path.join(WORK, "logs", f"{self.seq:03d}-{name}.log")
        with open(path, "wb") as logf:
            p = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL)
        self.procs[p] = path
        return p

    def log_of(self, proc):
        with open(self.procs[proc], errors="replace") as f:
            return f.read()

    def wait_for(self, proc, pred, what, timeout=30):
        deadline = time.monotonic() + timeout
        while not pred():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{what} not ready (exit={proc.poll()}); "
                                   f"{self.procs[proc]}:\n{self.log_of(proc)[-2000:]}")
            time.sleep(0.05)

    def serve(self, export):
        # The client case writes as root through a mount: root on both ends, not squashed.
        p = self.spawn([self.binary, "serve", export, "--listen", "127.0.0.1:0",
                        "--squash", "none"], "serve")
        marker = "hoardfs: serving"
        self.wait_for(p, lambda: marker in self.log_of(p), "hoardfs serve")
        line = next(l for l in self.log_of(p).splitlines() if l.startswith(marker))
        # "hoardfs: serving DIR on ADDR (TLS, identity SHA256:...)"
        return line.rsplit(" on ", 1)[1].split()[0]

    def mount(self, addr, name, *opts):
        mnt, cache = os.path.join(WORK, f"mnt-{name}"), os.path.join(WORK, f"cache-{name}")
        shutil.rmtree(cache, ignore_errors=True)
        os.makedirs(mnt, exist_ok=True)
        p = self.spawn([self.binary, "mount", addr, mnt, "--cache-dir", cache, *opts],
                       f"mount-{name}")
        self.mounts.append(mnt)
        self.wait_for(p, lambda: is_mounted(mnt), f"mount {name}")
        return mnt

    def cleanup(self):
        if self.cleaned:
            return
        self.cleaned = True
        for mnt in reversed(self.mounts):
            force_unmount(mnt)
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


def write_file(path, data):
    """Rewrite path in place (O_TRUNC) and return the time right after close() returned."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)
    return time.perf_counter()


def read_file(path):
    with open(path, "rb") as f:
        return f.read()


def wait_seen(path, data, max_wait):
    """Busy-poll stat() and the content of path until both show data; time it was seen."""
    deadline = time.perf_counter() + max_wait
    while True:
        try:
            if os.stat(path).st_size == len(data) and read_file(path) == data:
                return time.perf_counter()
        except FileNotFoundError:
            pass
        if time.perf_counter() > deadline:
            return None


def content(case, trial, prev_len):
    """New content whose length differs from the previous version's."""
    n = 1000 + (trial * 7919) % 60000
    if n == prev_len:
        n += 1
    head = f"{case} trial {trial}\n".encode()
    return (head + os.urandom(n))[:n]


def run_case(case, writer_path, observer_path, trials, warmup, max_wait):
    data = content(case, -1, -1)
    write_file(writer_path, data)
    if wait_seen(observer_path, data, max_wait) is None:
        raise RuntimeError(f"{case}: B never saw the initial file {observer_path}")
    latencies, timeouts = [], 0
    for trial in range(-warmup, trials):
        data = content(case, trial, len(data))
        t0 = write_file(writer_path, data)
        seen = wait_seen(observer_path, data, max_wait)
        if trial < 0:
            if seen is None:
                raise RuntimeError(f"{case}: warm-up change not seen within {max_wait} s")
            continue
        if seen is None:
            timeouts += 1
            log(f"{case} trial {trial}: not seen within {max_wait} s")
            # Let B catch up before the next trial, so trials stay independent.
            wait_seen(observer_path, data, 120)
        else:
            latencies.append((seen - t0) * 1000)
    return latencies, timeouts


def summarize(case, latencies, timeouts, trials):
    if latencies:
        s = sorted(latencies)
        median = statistics.median(s)
        p99 = s[max(0, math.ceil(0.99 * len(s)) - 1)]
        worst = s[-1]
    else:
        median = p99 = worst = None
    ok = (timeouts == 0 and median is not None and median <= TARGET_MS and p99 <= TARGET_MS)
    return {"case": case, "trials": trials, "timeouts": timeouts, "median_ms": median,
            "p99_ms": p99, "max_ms": worst, "target_ms": TARGET_MS,
            "result": "PASS" if ok else "FAIL", "latencies_ms": latencies}


def report(results):
    def ms(v):
        return "-" if v is None else f"{v:.2f}"
    print(f"\n{'case':<8} {'trials':>6} {'median ms':>10} {'p99 ms':>10} {'max ms':>10} "
          f"{'timeouts':>8}  result (target: median and p99 <= {TARGET_MS:.0f} ms)")
    for r in results:
        print(f"{r['case']:<8} {r['trials']:>6} {ms(r['median_ms']):>10} {ms(r['p99_ms']):>10} "
              f"{ms(r['max_ms']):>10} {r['timeouts']:>8}  {r['result']}")


def save(args, results):
    out_dir = os.path.abspath(args.out or os.path.join(REPO, "bench", "out"))
    os.makedirs(out_dir, exist_ok=True)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    result = {"benchmark": "staleness", "time": stamp, "trials": args.trials,
              "warmup": args.warmup, "max_wait_s": args.max_wait,
              "b_attr_timeout_s": args.attr_timeout, "kernel": os.uname().release,
              "binary": args.binary, "cases": results}
    for name in (f"staleness-{stamp}.json", "staleness-latest.json"):
        with open(os.path.join(out_dir, name), "w") as f:
            json.dump(result, f, indent=2)
    log(f"results saved to {os.path.join(out_dir, f'staleness-{stamp}.json')}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--binary", default=os.path.join(REPO, "target", "release", "hoardfs"))
    ap.add_argument("--trials", type=int, default=200,
                    help="measured trials per case (default 200)")
    ap.add_argument("--warmup", type=int, default=5,
                    help="untimed trials per case first (default 5)")
    ap.add_argument("--max-wait", type=float, default=5.0,
                    help="seconds B polls before a trial counts as timed out (default 5)")
    ap.add_argument("--attr-timeout", default="60", help="B's --attr-timeout (default 60)")
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated: client,server")
    ap.add_argument("--out", help="directory for the JSON results (default bench/out)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("staleness: run as root (FUSE mounts)")
    if args.trials < 100:
        sys.exit("staleness: use at least 100 trials (p99 needs them)")
    cases = [c for c in args.cases.split(",") if c]
    if not cases or any(c not in CASES for c in cases):
        sys.exit(f"staleness: --cases takes {','.join(CASES)}")
    args.binary = os.path.abspath(args.binary)
    if not os.path.exists(args.binary):
        log(f"{args.binary} missing: running cargo build --release")
        subprocess.run(["cargo", "build", "--release"], cwd=REPO, check=True)
    if not os.path.exists("/dev/fuse"):
        subprocess.run(["modprobe", "fuse"], capture_output=True)

    clean_leftovers()
    shutil.rmtree(WORK, ignore_errors=True)
    for d in ("logs", "export"):
        os.makedirs(os.path.join(WORK, d))
    export = os.path.join(WORK, "export")

    rig = Rig(args.binary)
    atexit.register(rig.cleanup)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda n, _: sys.exit(f"staleness: signal {n}, cleaning up"))
    results = []
    try:
        addr = rig.serve(export)
        mnt_a = rig.mount(addr, "a")
        mnt_b = rig.mount(addr, "b", "--attr-timeout", args.attr_timeout)
        for case in cases:
            name = f"{case}.txt"
            writer = os.path.join(mnt_a if case == "client" else export, name)
            log(f"{case} case: {args.trials} trials ({args.warmup} warm-up), writer {writer}")
            lat, timeouts = run_case(case, writer, os.path.join(mnt_b, name), args.trials,
                                     args.warmup, args.max_wait)
            results.append(summarize(case, lat, timeouts, args.trials))
    finally:
        rig.cleanup()

    report(results)
    save(args, results)
    return 1 if any(r["result"] == "FAIL" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
