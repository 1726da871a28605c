#!/usr/bin/env python3
"""Cache startup time and per-access cost versus the number of cached objects.

For each size (default 10k, 100k, 1M) a cache directory with that many real objects is
filled through the store (crates/cache/examples/startup.rs), closed in order, the page
cache is dropped, and then:
  open_s           opening the cache (what a mount pays at start: the index is read, the
                   object tree is not walked)
  status_s         wall time of a whole `hoardfs cache status DIR` process (cold)
  access_us        a random object: load its record and data file, hold it, read its chunk
                   (cold: directory blocks and inodes come from disk)
  access_warm_us   the same accesses again (file metadata in the page cache)
  insert_evict_us  a new object into a full cache, each insert evicting one
Target: open < 1 s at 1M objects; per-access cost flat across sizes.

Run as root (drops the page cache): python3 bench/startup.py [--sizes 10000,100000]
Needs ~8 KiB of disk per object. Results: bench/out/startup-latest.json.
"""
import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import time

from seed000 import drop_caches

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORK = os.path.join(REPO, "bench", "out", "startup-work")


def log(msg):
    print(f"[startup] {msg}", file=sys.stderr, flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="10000,100000,1000000")
    ap.add_argument("--keep", action="store_true", help="keep the filled caches")
    a = ap.parse_args()
    log("building (release)")
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "hoardfs-cache",
                    "--example", "startup"], cwd=REPO, check=True)
    subprocess.run(["cargo", "build", "--release", "-q"], cwd=REPO, check=True)
    exe = os.path.join(REPO, "target", "release", "examples", "startup")
    hoardfs = os.path.join(REPO, "target", "release", "hoardfs")
    os.makedirs(WORK, exist_ok=True)
    rows = []
    for n in [int(x) for x in a.sizes.split(",")]:
        d = os.path.join(WORK, f"c{n}")
        shutil.rmtree(d, ignore_errors=True)
        t = time.monotonic()
        subprocess.run([exe, "fill", d, str(n)], check=True)
        log(f"{n} objects filled in {time.monotonic() - t:.0f} s")
        drop_caches()
        t = time.monotonic()
        subprocess.run([hoardfs, "cache", "status", d], check=True, stdout=subprocess.DEVNULL)
        status_s = time.monotonic() - t
        drop_caches()
        out = subprocess.run([exe, "measure", d, str(n)], check=True, capture_output=True,
                             text=True).stdout
        row = json.loads(out)
        row["status_s"] = round(status_s, 4)
        rows.append(row)
        log(json.dumps(row))
        if not a.keep:
            shutil.rmtree(d, ignore_errors=True)
    print(f"{'objects':>10} {'open (s)':>9} {'status (s)':>10} {'access cold (us)':>17} "
          f"{'access warm (us)':>17} {'insert+evict (us)':>18} {'index':>10}")
    for r in rows:
        print(f"{r['objects']:>10} {r['open_s']:>9.3f} {r['status_s']:>10.3f} "
              f"{r['access_us']:>17.1f} {r['access_warm_us']:>17.1f} "
              f"{r['insert_evict_us']:>18.1f} {r['index_bytes'] / 1e6:>8.1f}MB")
    ok = all(r["open_s"] < 1.0 for r in rows)
    print("PASS" if ok else "FAIL", "(open < 1 s at every size)")
    res = {"when": datetime.datetime.now().isoformat(timespec="seconds"), "rows": rows}
    with open(os.path.join(REPO, "bench", "out", "startup-latest.json"), "w") as f:
        json.dump(res, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
