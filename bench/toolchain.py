#!/usr/bin/env python3
"""A toolchain started from a mount (issue 38): a CPython installation exported by
`hoardfs serve`, and an interpreter run from a default mount of it (TLS, loopback)
importing a set of standard modules, against the same installation on the local disk,
in the same run.

States, each timed over `--rounds` rounds (median):
  cold  hoardfs: a fresh mount on an empty cache, page cache dropped;
        local: page cache dropped
  hot   hoardfs: remounted on the cache the cold run filled, page cache dropped;
        local: page cache dropped (the same as its cold state)
  warm  the same command again at once (page cache, kernel entries)
The ratio is local / hoardfs (1.0 = as fast as the local disk). Besides the wall time,
the mount's `hoardfs stats` after each hot run says what it asked the server.

Run as root (drops the page cache):
  python3 bench/toolchain.py [--python /root/.pyenv/versions/3.11.7] [--rounds 3]
Results: bench/out/toolchain-TIME.json; --plot-only JSON redraws doc/img/toolchain.svg.
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

import seed000
import svgplot
from loopback import wait_line, wait_mounted

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PORT = 47391
IMPORTS = ("json, asyncio, email.mime.text, http.client, unittest, decimal, sqlite3, "
           "xml.etree.ElementTree, argparse, logging.handlers, csv, zipfile, "
           "concurrent.futures, ssl, urllib.request, multiprocessing")
STATES = ("cold", "hot", "warm")


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def interpreter(root, python):
    """The interpreter of the copy of `python` under `root`."""
    ver = os.path.basename(os.path.realpath(os.path.join(python, "bin", "python3")))
    return os.path.join(root, "py", "bin", ver)


def flat(d, at=""):
    """The integer counters of a `hoardfs stats --json` answer, by dotted name."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flat(v, f"{at}{k}."))
        elif isinstance(v, int) and not isinstance(v, bool):
            out[f"{at}{k}"] = v
    return out


def timed(exe):
    t0 = time.perf_counter()
    subprocess.run([exe, "-c", f"import {IMPORTS}"], check=True,
                   env={"PATH": "/usr/bin:/bin", "HOME": "/root"},
                   stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


class Mount:
    """A default mount of the server (TLS) on cache directory `cache`."""

    def __init__(self, binary, addr, mnt, cache):
        self.binary, self.mnt = binary, mnt
        os.makedirs(mnt, exist_ok=True)
        self.p = subprocess.Popen([binary, "mount", addr, mnt, "--cache-dir", cache],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_mounted(self.p, mnt, "mount")

    def stats(self):
        out = subprocess.run([self.binary, "stats", self.mnt, "--json"], check=True,
                             capture_output=True, text=True).stdout
        return json.loads(out)

    def close(self):
        subprocess.run(["umount", self.mnt], check=False)
        try:
            self.p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.p.kill()


def plot(res, out_dir):
    svgplot.bar_chart(
        os.path.join(out_dir, "toolchain.svg"),
        "Python start with 16 stdlib imports (CPython installation over the mount)",
        "seconds",
        [(s, [res["rows"][s]["local"], res["rows"][s]["hoardfs"]]) for s in STATES],
        ["local disk", "hoardfs (default mount)"], note="lower is better")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--binary", default=os.path.join(REPO, "target", "release", "hoardfs"))
    ap.add_argument("--python", default="/root/.pyenv/versions/3.11.7")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(REPO, "bench", "out"))
    ap.add_argument("--plot-only", metavar="JSON")
    args = ap.parse_args()
    img = os.path.join(REPO, "doc", "img")
    if args.plot_only:
        with open(args.plot_only) as f:
            plot(json.load(f), img)
        return
    work = tempfile.mkdtemp(prefix="hoardfs-toolchain-", dir="/var/tmp")
    exp, local = os.path.join(work, "export"), os.path.join(work, "local")
    for d in (exp, local):
        os.makedirs(d)
        subprocess.run(["cp", "-a", args.python, os.path.join(d, "py")], check=True)
    files = sum(len(f) for _, _, f in os.walk(os.path.join(exp, "py")))
    log(f"{files} files in the installation")
    addr = f"127.0.0.1:{PORT}"
    srv = subprocess.Popen([args.binary, "serve", exp, "--listen", addr,
                            "--allow-unauthenticated", "--state-dir",
                            os.path.join(work, "state")],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    times = {s: {"local": [], "hoardfs": []} for s in STATES}
    requests = []
    mnt = os.path.join(work, "mnt")
    try:
        wait_line(srv, "hoardfs: serving", "server")
        for r in range(args.rounds):
            cache = os.path.join(work, f"cache-{r}")
            # cold
            seed000.drop_caches()
            times["cold"]["local"].append(timed(interpreter(local, args.python)))
            m = Mount(args.binary, addr, mnt, cache)
            seed000.drop_caches()
            times["cold"]["hoardfs"].append(timed(interpreter(mnt, args.python)))
            m.close()
            # hot
            seed000.drop_caches()
            times["hot"]["local"].append(timed(interpreter(local, args.python)))
            m = Mount(args.binary, addr, mnt, cache)
            seed000.drop_caches()
            before = m.stats()
            times["hot"]["hoardfs"].append(timed(interpreter(mnt, args.python)))
            after = m.stats()
            b, a = flat(before), flat(after)
            requests.append({k: a[k] - b.get(k, 0) for k in a if a[k] != b.get(k, 0)})
            # warm (each run once first: the hot run's page cache drop emptied local's)
            for name, root in (("local", local), ("hoardfs", mnt)):
                timed(interpreter(root, args.python))
                times["warm"][name].append(timed(interpreter(root, args.python)))
            m.close()
            log(f"round {r}: " + ", ".join(
                f"{s} {times[s]['local'][-1]:.3f}/{times[s]['hoardfs'][-1]:.3f}"
                for s in STATES))
    finally:
        subprocess.run(["umount", "-l", mnt], stderr=subprocess.DEVNULL)
        srv.kill()
        shutil.rmtree(work, ignore_errors=True)
    res = {"time": time.strftime("%Y%m%d-%H%M%S"), "binary": args.binary,
           "python": args.python, "files": files, "imports": IMPORTS,
           "rounds": args.rounds, "raw": times, "hot_stats_delta": requests,
           "rows": {s: {k: statistics.median(v) for k, v in times[s].items()}
                    for s in STATES}}
    print(f"{'state':8}{'local':>12}{'hoardfs':>12}{'ratio':>10}")
    for s in STATES:
        row = res["rows"][s]
        print(f"{s:8}{row['local']:>11.3f}s{row['hoardfs']:>11.3f}s"
              f"{row['local'] / row['hoardfs']:>10.2f}")
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"toolchain-{res['time']}.json")
    with open(path, "w") as f:
        json.dump(res, f, indent=2)
    plot(res, img)
    log(f"wrote {path}")


if __name__ == "__main__":
    main()
