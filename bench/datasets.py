#!/usr/bin/env python3
"""S3 datasets: listings, revalidation and epochs over many small objects (issue 37).

A 3-node Garage 2.5.0 cluster (replication factor 3) runs on 127.0.0.1; rclone puts the
data. Readers are Python (os.walk, open, read whole), one at a time unless the row says
otherwise; every system mounts with its defaults and a fresh cache.

Dataset A, --prefixes x --objects (default 50 x 40 = 2,000 objects of 4-120 KiB), read
by hoardfs (`mount s3://`), rclone mount (--vfs-cache-mode full), s3fs (use_cache) and
the local disk:
- `ls -lR` cold, 1 s later, 5 s later, after a remount;
- first epoch: walk and read every file in listing order;
- second epoch, 5 s later (past every TTL), in random order, page cache dropped;
- after a remount, random order, page cache dropped.
hoardfs also: the first epoch with --files-ahead 0 (one GET at a time, as before), and
1 and 8 readers in random order on an empty cache.

Dataset B, --wide-prefixes x --wide-objects (default 1,000 x 20 of 4-16 KiB), hoardfs
and the local disk: the first epoch (cache filling), `ls -lR` and an epoch over cached
objects right after a remount and again past the TTL, with the listing requests the
store saw (Garage's api_s3_request_counter) and the staleness `hoardfs stats` reports.

Run as root: python3 bench/datasets.py [--runs 1]. See doc/BENCHMARKS.md.
"""
import argparse
import concurrent.futures
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import s3 as common  # noqa: E402  (the Garage cluster and the mounts of bench/s3.py)
import svgplot  # noqa: E402

REPO = common.REPO
BUCKET = common.BUCKET
KiB = 1024


def make_tree(root, prefixes, objects, lo, hi, seed):
    rnd = random.Random(seed)
    for p in range(prefixes):
        d = os.path.join(root, f"c{p:04}")
        os.makedirs(d)
        for o in range(objects):
            with open(os.path.join(d, f"o{o:03}.bin"), "wb") as f:
                f.write(os.urandom(rnd.randint(lo, hi)))


def walk(root):
    out = []
    for d, dirs, files in os.walk(root):
        dirs.sort()
        out.extend(os.path.join(d, f) for f in sorted(files))
    return out


def read_whole(p):
    with open(p, "rb") as f:
        return len(f.read())


def epoch(root, order="listing", readers=1, seed=7):
    """Seconds to walk `root` and read every file whole; the bytes read."""
    t0 = time.perf_counter()
    files = walk(root)
    if order == "random":
        random.Random(seed).shuffle(files)
    if readers == 1:
        n = sum(read_whole(p) for p in files)
    else:
        with concurrent.futures.ThreadPoolExecutor(readers) as ex:
            n = sum(ex.map(read_whole, files, chunksize=4))
    return time.perf_counter() - t0, n


def ls_lr(root):
    return common.timed(["ls", "-lR", root])


def s3fs_mount(g, mnt, cache, work):
    os.makedirs(mnt, exist_ok=True)
    os.makedirs(cache, exist_ok=True)
    pw = os.path.join(work, "s3fs-passwd")
    with open(pw, "w") as f:
        f.write(f"{common.KEY_ID}:{common.SECRET}\n")
    os.chmod(pw, 0o600)
    subprocess.run(["s3fs", BUCKET, mnt, "-o", f"url={g.endpoint()}", "-o",
                    "use_path_request_style", "-o", f"passwd_file={pw}", "-o",
                    f"use_cache={cache}", "-o", "endpoint=garage"],
                   check=True, env=common.clean_env())
    for _ in range(100):
        if os.path.ismount(mnt):
            return
        time.sleep(0.05)
    raise RuntimeError("s3fs did not mount")


def lists(g):
    """ListObjectsV2 requests the cluster has answered so far."""
    total = 0.0
    for n in g.nodes:
        import urllib.request
        body = urllib.request.urlopen(
            f"http://127.0.0.1:{n['admin']}/metrics").read().decode()
        for line in body.splitlines():
            if line.startswith("api_s3_request_counter{") and 'api_endpoint="ListObjectsV2"' in line:
                total += float(line.rsplit(" ", 1)[1])
    return int(total)


def daemon_rss(mnt):
    """Resident bytes of the hoardfs daemon serving `mnt`."""
    out = subprocess.run(["pgrep", "-f", f"hoardfs mount .* {mnt} "], capture_output=True,
                         text=True).stdout.split()
    for pid in out:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    return 0


def du(path):
    return int(subprocess.run(["du", "-sb", path], capture_output=True,
                              text=True).stdout.split()[0])


def hoardfs_stats(a, mnt):
    out = subprocess.run([a.binary, "stats", mnt, "--json"], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


def dataset_a(a, g, work, sub, local, row):
    """Every system over dataset A (under `sub` in the bucket, a copy at `local`)."""
    mounts = {
        "hoardfs": lambda m, c: common.hoardfs_mount(a, g, m, c),
        "rclone": lambda m, c: common.rclone_mount(g, m, c),
        "s3fs": lambda m, c: s3fs_mount(g, m, c, work),
    }
    for name, mount in mounts.items():
        if name not in a.systems:
            continue
        d = tempfile.mkdtemp(dir=work)
        m, c = os.path.join(d, "m"), os.path.join(d, "c")
        common.drop_caches()
        mount(m, c)
        root = os.path.join(m, sub)
        row(name, "ls_cold", ls_lr(root))
        time.sleep(1)
        row(name, "ls_1s", ls_lr(root))
        time.sleep(5)
        row(name, "ls_5s", ls_lr(root))
        row(name, "epoch1", epoch(root)[0])
        time.sleep(5)
        common.drop_caches()
        row(name, "epoch2_random", epoch(root, "random")[0])
        common.umount(m)
        common.drop_caches()
        mount(m, c)
        row(name, "ls_remount", ls_lr(root))
        common.drop_caches()
        row(name, "epoch_remount_random", epoch(root, "random", seed=8)[0])
        common.umount(m)
        shutil.rmtree(d, ignore_errors=True)
    # hoardfs: one GET at a time (as before files ahead), and parallel random readers.
    if "hoardfs" in a.systems:
        for key, extra, order, readers in [("epoch1_files_ahead_0", ["--files-ahead", "0"],
                                            "listing", 1),
                                           ("cold_random_1", [], "random", 1),
                                           ("cold_random_8", [], "random", 8)]:
            d = tempfile.mkdtemp(dir=work)
            m, c = os.path.join(d, "m"), os.path.join(d, "c")
            common.drop_caches()
            common.hoardfs_mount(a, g, m, c, extra)
            row("hoardfs", key, epoch(os.path.join(m, sub), order, readers)[0])
            common.umount(m)
            shutil.rmtree(d, ignore_errors=True)
    common.drop_caches()
    row("local", "ls_cold", ls_lr(local))
    row("local", "ls_1s", ls_lr(local))
    common.drop_caches()
    row("local", "epoch1", epoch(local)[0])
    common.drop_caches()
    row("local", "epoch2_random", epoch(local, "random")[0])


def dataset_b_listings(a, g, work, sub, local, row):
    """hoardfs over dataset B, names only (--wide-listing-only): cold `ls -lR`, the
    daemon's memory and the listings kept on disk per object, `ls -lR` after a remount."""
    d = tempfile.mkdtemp(dir=work)
    m, c = os.path.join(d, "m"), os.path.join(d, "c")
    root = os.path.join(m, sub)
    objects = a.wide_prefixes * a.wide_objects
    common.drop_caches()
    common.hoardfs_mount(a, g, m, c)
    rss0 = daemon_rss(m)
    n0 = lists(g)
    row("hoardfs", "wide_ls_cold", ls_lr(root))
    row("hoardfs", "wide_ls_cold_lists", lists(g) - n0)
    row("hoardfs", "wide_rss_per_object", (daemon_rss(m) - rss0) / objects)
    listings = [os.path.join(dp, "listings") for dp, dirs, _ in os.walk(os.path.join(c, "s3"))
                if "listings" in dirs]
    row("hoardfs", "wide_listing_bytes_per_object", sum(du(x) for x in listings) / objects)
    common.umount(m)
    common.drop_caches()
    common.hoardfs_mount(a, g, m, c)
    row("hoardfs", "wide_ls_fresh", ls_lr(root))
    common.umount(m)
    shutil.rmtree(d, ignore_errors=True)
    common.drop_caches()
    row("local", "wide_ls", ls_lr(local))


def dataset_b(a, g, work, sub, local, row):
    """hoardfs over dataset B: revalidation at scale."""
    if a.wide_listing_only:
        return dataset_b_listings(a, g, work, sub, local, row)
    d = tempfile.mkdtemp(dir=work)
    m, c = os.path.join(d, "m"), os.path.join(d, "c")
    root = os.path.join(m, sub)
    common.drop_caches()
    common.hoardfs_mount(a, g, m, c)
    row("hoardfs", "wide_epoch1", epoch(root)[0])
    common.umount(m)
    # Right after a remount: listings fresh (kept on disk within the TTL? no: the TTL is
    # 1 s, so the remount lists), then past the TTL.
    common.drop_caches()
    common.hoardfs_mount(a, g, m, c)
    rss0 = daemon_rss(m)
    row("hoardfs", "wide_ls_fresh", ls_lr(root))
    objects = a.wide_prefixes * a.wide_objects
    row("hoardfs", "wide_rss_per_object", (daemon_rss(m) - rss0) / objects)
    listings = [os.path.join(dp, "listings") for dp, dirs, _ in os.walk(os.path.join(c, "s3"))
                if "listings" in dirs]
    row("hoardfs", "wide_listing_bytes_per_object", sum(du(x) for x in listings) / objects)
    common.drop_caches()
    row("hoardfs", "wide_epoch_fresh", epoch(root, "random")[0])
    time.sleep(2)
    n0 = lists(g)
    common.drop_caches()
    row("hoardfs", "wide_epoch_past_ttl", epoch(root, "random", seed=9)[0])
    time.sleep(2)
    row("hoardfs", "wide_ls_past_ttl", ls_lr(root))
    time.sleep(2)
    st = hoardfs_stats(a, m)["listings"]
    row("hoardfs", "wide_lists_past_ttl", lists(g) - n0)
    row("hoardfs", "wide_max_age_served", st["max_age_served_secs"])
    row("hoardfs", "wide_waited", st["waited"])
    row("hoardfs", "wide_list_rate", st["list_rate"])
    common.umount(m)
    shutil.rmtree(d, ignore_errors=True)
    common.drop_caches()
    row("local", "wide_ls", ls_lr(local))
    common.drop_caches()
    row("local", "wide_epoch", epoch(local, "random")[0])


def med(res, system, key):
    v = res.get(system, {}).get(key)
    return sorted(v)[len(v) // 2] if v else None


def plot(res, out_dir):
    """The charts of doc/BENCHMARKS.md, from a result (`--plot-only bench/out/datasets-….json`)."""
    systems = [("hoardfs", "hoardfs"), ("rclone", "rclone mount (full cache)"),
               ("s3fs", "s3fs (use_cache)"), ("local", "local disk")]
    present = [(k, label) for k, label in systems if k in res]
    svgplot.bar_chart(
        os.path.join(out_dir, "datasets-ls.svg"), "S3 dataset A: ls -lR", "seconds",
        [(label, [med(res, k, key) for k, _ in present])
         for key, label in [("ls_cold", "cold"), ("ls_1s", "1 s later"), ("ls_5s", "5 s later"),
                            ("ls_remount", "after remount")]],
        [label for _, label in present], note="lower is better")
    svgplot.bar_chart(
        os.path.join(out_dir, "datasets-epochs.svg"), "S3 dataset A: epochs, one reader",
        "seconds",
        [(label, [med(res, k, key) for k, _ in present])
         for key, label in [("epoch1", "first (listing order)"),
                            ("epoch2_random", "second (random, 5 s later)"),
                            ("epoch_remount_random", "after remount (random)")]],
        [label for _, label in present], note="lower is better")
    svgplot.bar_chart(
        os.path.join(out_dir, "datasets-wide.svg"),
        "S3 dataset B (1,000 prefixes): cached objects, fresh and past the TTL", "seconds",
        [("ls -lR", [med(res, "hoardfs", "wide_ls_fresh"), med(res, "hoardfs", "wide_ls_past_ttl"),
                     med(res, "local", "wide_ls")]),
         ("epoch (random)", [med(res, "hoardfs", "wide_epoch_fresh"),
                             med(res, "hoardfs", "wide_epoch_past_ttl"),
                             med(res, "local", "wide_epoch")])],
        ["hoardfs after remount", "hoardfs past the TTL", "local disk"],
        note="lower is better")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.common_args(ap, 1)
    ap.add_argument("--prefixes", type=int, default=50)
    ap.add_argument("--objects", type=int, default=40)
    ap.add_argument("--wide-prefixes", type=int, default=1000)
    ap.add_argument("--wide-objects", type=int, default=20)
    ap.add_argument("--systems", default="hoardfs,rclone,s3fs")
    ap.add_argument("--skip-wide", action="store_true")
    ap.add_argument("--skip-a", action="store_true", help="dataset B only")
    ap.add_argument("--wide-listing-only", action="store_true",
                    help="dataset B: names only (no epochs), for 10^5 objects and more")
    a = ap.parse_args()
    if common.plotted_only(a, plot):
        return
    a.systems = a.systems.split(",")
    work = tempfile.mkdtemp(prefix="datasets-bench-", dir="/var/tmp")
    g = common.Garage(a.garage, work)
    res = {}

    def row(system, key, value):
        res.setdefault(system, {}).setdefault(key, []).append(value)
        print(f"{system:8} {key:24} {value:.3f}", flush=True)

    try:
        src_a = os.path.join(work, "a")
        make_tree(src_a, a.prefixes, a.objects, 4 * KiB, 120 * KiB, 1)
        subprocess.run(["rclone", "copy", src_a, f"G:{BUCKET}/a", "--transfers", "32"],
                       check=True, env=common.rclone_env(g))
        if not a.skip_wide:
            src_b = os.path.join(work, "b")
            lo, hi = (64, 256) if a.wide_listing_only else (4 * KiB, 16 * KiB)
            make_tree(src_b, a.wide_prefixes, a.wide_objects, lo, hi, 2)
            t0 = time.time()
            subprocess.run(["rclone", "copy", src_b, f"G:{BUCKET}/b", "--transfers", "32"],
                           check=True, env=common.rclone_env(g))
            print(f"put dataset B in {time.time() - t0:.0f} s", flush=True)
        for _ in range(a.runs):
            if not a.skip_a:
                dataset_a(a, g, work, "a", src_a, row)
            if not a.skip_wide:
                dataset_b(a, g, work, "b", src_b, row)
    finally:
        g.stop()
        shutil.rmtree(work, ignore_errors=True)
    os.makedirs(a.out, exist_ok=True)
    out = os.path.join(a.out, time.strftime("datasets-%Y%m%d-%H%M%S.json"))
    with open(out, "w") as f:
        json.dump(res, f, indent=1)
    print("wrote", out)
    if a.out == os.path.join(REPO, "bench", "out"):
        plot(res, os.path.join(REPO, "doc", "img"))


if __name__ == "__main__":
    main()
