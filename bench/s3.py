#!/usr/bin/env python3
"""hoardfs over S3 against rclone, same run, same bucket (issue 18's benchmark).

A 3-node Garage 2.5.0 cluster (replication factor 3) runs on 127.0.0.1. rclone puts the
data; then, each as a fresh process with a fresh cache unless the row says otherwise:
- cold 200 MiB: `rclone cat` (the store's raw speed), a hoardfs mount, an
  `rclone mount --vfs-cache-mode full`; sequential 1 MiB reads;
- hot after remount: the same file after unmount + mount with the cache kept and the page
  cache dropped, against the local disk (the file copied to /var/tmp, page cache dropped,
  read right before, so both see the same machine; the ratio is the median of the pairs);
- 1000 small objects (4 KiB): first read, hot (same mount), warm (after remount);
- `ls -lR` of a tree of 500 prefixes (2 objects each): cold, warm, after remount;
- a tier (`hoardfs serve --origin s3://…`) with 1, 4 and 16 clients reading one 64 MiB
  file at once: bytes the store read from its disks (Garage's block_bytes_read, all
  nodes) per byte of the file.
Medians of --runs runs. Run as root: python3 bench/s3.py [--runs 3]. Needs rclone and
Garage ($HOARDFS_GARAGE or ~/.cache/hoardfs-test/garage-2.5.0/bin/garage, built by
.ci/run). See doc/BENCHMARKS.md.
"""
import argparse
import json
import os
import secrets
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
import urllib.request

import svgplot

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MiB = 1 << 20
KEY_ID = "GKbench000000000000000001"
SECRET = "hoardfs-bench-secret-0123456789abcdef0123456789"
BUCKET = "bench"
# Free-space thresholds for cached mounts and tiers: the defaults (cull below 7 % free,
# stop below 3 %) are percentages of the whole disk and would evict the benchmark's cache
# on a nearly full one.
LOW_THRESHOLDS = ["--bstop", "0", "--bcull", "1", "--brun", "2"]


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def clean_env():
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_ACCESS_KEY_ID=KEY_ID, AWS_SECRET_ACCESS_KEY=SECRET, AWS_REGION="garage")
    return env


class Garage:
    def __init__(self, binary, work, n=3):
        self.bin, self.work, self.nodes = binary, work, []
        rpc_secret = secrets.token_hex(32)
        for i in range(n):
            d = os.path.join(work, f"g{i}")
            os.makedirs(d)
            s3, rpc, admin = free_port(), free_port(), free_port()
            cfg = os.path.join(d, "garage.toml")
            with open(cfg, "w") as f:
                f.write(f'''metadata_dir = "{d}/meta"
data_dir = "{d}/data"
db_engine = "lmdb"
lmdb_map_size = "1G"
replication_factor = {n}
consistency_mode = "consistent"
compression_level = "none"
rpc_bind_addr = "127.0.0.1:{rpc}"
rpc_public_addr = "127.0.0.1:{rpc}"
rpc_secret = "{rpc_secret}"
[s3_api]
s3_region = "garage"
api_bind_addr = "127.0.0.1:{s3}"
[admin]
api_bind_addr = "127.0.0.1:{admin}"
''')
            log = open(os.path.join(d, "log"), "w")
            p = subprocess.Popen([binary, "-c", cfg, "server"], stdout=log, stderr=log,
                                 env={**os.environ, "RUST_LOG": "garage=warn"})
            self.nodes.append(dict(cfg=cfg, s3=s3, admin=admin, proc=p))
        ids = [self.retry(lambda i=i: self.cli(i, "node", "id", "-q").strip()) for i in range(n)]
        for nid in ids[1:]:
            self.retry(lambda nid=nid: self.cli(0, "node", "connect", nid))
        self.retry(lambda: self.cli(0, "layout", "assign", "-z", "dc1", "-c", "10G",
                                    *[x.split("@")[0] for x in ids]))
        self.cli(0, "layout", "apply", "--version", "1")
        for i in range(n):
            self.retry(lambda i=i: self.health(i))
        self.retry(lambda: self.cli(0, "key", "import", "--yes", "-n", "bench", KEY_ID, SECRET))
        self.cli(0, "bucket", "create", BUCKET)
        self.cli(0, "bucket", "allow", "--read", "--write", "--owner", BUCKET, "--key", KEY_ID)

    def cli(self, i, *args):
        return subprocess.run([self.bin, "-c", self.nodes[i]["cfg"], *args], check=True,
                              capture_output=True, text=True).stdout

    def health(self, i):
        body = urllib.request.urlopen(f"http://127.0.0.1:{self.nodes[i]['admin']}/health").read()
        if b"fully operational" not in body:
            raise RuntimeError("not healthy")

    @staticmethod
    def retry(f, secs=60):
        t = time.time()
        while True:
            try:
                return f()
            except Exception:
                if time.time() - t > secs:
                    raise
                time.sleep(0.2)

    def endpoint(self, i=0):
        return f"http://127.0.0.1:{self.nodes[i]['s3']}"

    def metric(self, name):
        total = 0.0
        for n in self.nodes:
            body = urllib.request.urlopen(f"http://127.0.0.1:{n['admin']}/metrics").read().decode()
            for line in body.splitlines():
                if line.startswith(name + " ") or line.startswith(name + "{"):
                    total += float(line.rsplit(" ", 1)[1])
        return total

    def stop(self):
        for n in self.nodes:
            n["proc"].kill()
            n["proc"].wait()


def rclone_env(g):
    env = clean_env()
    env.update(RCLONE_CONFIG="/dev/null", RCLONE_CONFIG_G_TYPE="s3",
               RCLONE_CONFIG_G_PROVIDER="Other", RCLONE_CONFIG_G_ENDPOINT=g.endpoint(),
               RCLONE_CONFIG_G_REGION="garage", RCLONE_CONFIG_G_ACCESS_KEY_ID=KEY_ID,
               RCLONE_CONFIG_G_SECRET_ACCESS_KEY=SECRET, RCLONE_CONFIG_G_FORCE_PATH_STYLE="true",
               RCLONE_CONFIG_G_NO_CHECK_BUCKET="true")
    return env


def drop_caches():
    subprocess.run(["sync"])
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def umount(mnt):
    for _ in range(100):
        if subprocess.run(["umount", mnt], stderr=subprocess.DEVNULL).returncode == 0:
            return
        time.sleep(0.1)
    subprocess.run(["umount", "-l", mnt])


def hoardfs_mount(a, g, mnt, cache, extra=()):
    os.makedirs(mnt, exist_ok=True)
    subprocess.run([a.binary, "mount", f"s3://{BUCKET}", mnt, "--cache-dir", cache,
                    "--endpoint-url", g.endpoint(), "--force-path-style", "--daemon",
                    *LOW_THRESHOLDS, *extra],
                   check=True, stdout=subprocess.DEVNULL, env=clean_env())


def rclone_mount(g, mnt, cache):
    os.makedirs(mnt, exist_ok=True)
    subprocess.run(["rclone", "mount", f"G:{BUCKET}", mnt, "--vfs-cache-mode", "full",
                    "--cache-dir", cache, "--daemon"], check=True, env=rclone_env(g))
    for _ in range(100):
        if os.path.ismount(mnt):
            return
        time.sleep(0.05)
    raise RuntimeError("rclone mount did not appear")


def timed(cmd, **kw):
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kw)
    return time.perf_counter() - t0


def read_file(p):
    return timed(["dd", f"if={p}", "of=/dev/null", "bs=1M"])


def read_tree(root):
    return timed(["sh", "-c", f"find {root} -type f -print0 | xargs -0 cat > /dev/null"])


def ls_lr(root):
    return timed(["ls", "-lR", root])


def plot(res, out_dir):
    """The charts of doc/BENCHMARKS.md, from a result (`--plot-only bench/out/s3.json`)."""
    s, m = res["seconds"], res["MiB_per_s"]
    svgplot.bar_chart(
        os.path.join(out_dir, "s3-big.svg"), "S3: one 200 MiB object, sequential reads",
        "MiB/s", [("cold", [m["hoardfs_cold"], m["rclone_cold"], m["raw_cat"]]),
                  ("hot, 1st read after remount", [m["hoardfs_hot_remount"],
                                                   m["rclone_hot_remount"], m["local_disk"]]),
                  ("hot, 2nd remount", [m["hoardfs_hot_remount2"], None, m["local_disk"]])],
        ["hoardfs", "rclone mount (full cache)", "rclone cat / local disk"])
    svgplot.bar_chart(
        os.path.join(out_dir, "s3-small.svg"), "S3: 1000 objects of 4 KiB, find | xargs cat",
        "seconds", [(k, [s[f"small_hoardfs_{k}"], s[f"small_rclone_{k}"]])
                    for k in ["first", "hot", "warm"]],
        ["hoardfs", "rclone mount (full cache)"], note="lower is better")
    svgplot.bar_chart(
        os.path.join(out_dir, "s3-lslr.svg"), "S3: ls -lR of 500 prefixes", "seconds",
        [("cold", [s["ls_hoardfs_cold"], s["ls_rclone_cold"]]),
         ("warm", [s["ls_hoardfs_warm"], s["ls_rclone_warm"]]),
         ("after remount", [s["ls_hoardfs_remount"], s["ls_rclone_remount"]]),
         ("after remount, TTL 60 s", [s["ls_hoardfs_ttl60_remount"], None])],
        ["hoardfs (TTL 1 s unless noted)", "rclone mount (dir cache 5 min)"],
        note="lower is better")
    svgplot.bar_chart(
        os.path.join(out_dir, "s3-tier.svg"), "Tier: store bytes per file byte, 64 MiB object",
        "bytes read by the store / file size",
        [(f"{n} clients", [tier_row(res, n)["store_bytes_per_file_byte"]]) for n in [1, 4, 16]],
        ["clients behind one tier"])


def tier_row(res, n):
    """A tier row, keyed by int in a fresh result and by str in one read from JSON."""
    t = res["tier_64MiB"]
    return t[n] if n in t else t[str(n)]


def common_args(ap, runs):
    """The options every Garage benchmark takes."""
    ap.add_argument("--binary", default=os.path.join(REPO, "target", "release", "hoardfs"))
    ap.add_argument("--garage", default=os.environ.get("HOARDFS_GARAGE", os.path.expanduser(
        "~/.cache/hoardfs-test/garage-2.5.0/bin/garage")))
    ap.add_argument("--runs", type=int, default=runs)
    ap.add_argument("--out", default=os.path.join(REPO, "bench", "out"))
    ap.add_argument("--plot-only", metavar="JSON", help="only draw the charts of a result")


def plotted_only(a, draw):
    """With --plot-only, draws the charts of that result with `draw` and says so."""
    if not a.plot_only:
        return False
    with open(a.plot_only) as f:
        draw(json.load(f), os.path.join(REPO, "doc", "img"))
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common_args(ap, 3)
    a = ap.parse_args()
    if plotted_only(a, plot):
        return
    work = tempfile.mkdtemp(prefix="s3-bench-", dir="/var/tmp")
    g = Garage(a.garage, work)
    renv = rclone_env(g)
    res = {}
    try:
        # Data, put by rclone.
        src = os.path.join(work, "src")
        os.makedirs(os.path.join(src, "small"))
        with open("/dev/urandom", "rb") as r:
            with open(os.path.join(src, "big"), "wb") as f:
                for _ in range(200):
                    f.write(r.read(MiB))
            with open(os.path.join(src, "mid"), "wb") as f:
                f.write(r.read(64 * MiB))
            for i in range(1000):
                with open(os.path.join(src, "small", f"f{i:04}"), "wb") as f:
                    f.write(r.read(4096))
        for d in range(500):
            p = os.path.join(src, "tree", f"d{d // 25:02}", f"p{d:03}")
            os.makedirs(p)
            for j in range(2):
                with open(os.path.join(p, f"o{j}"), "wb") as f:
                    f.write(b"x" * 100)
        subprocess.run(["rclone", "copy", src, f"G:{BUCKET}", "--transfers", "16"],
                       check=True, env=renv)
        local = os.path.join(work, "local-big")
        shutil.copy(os.path.join(src, "big"), local)
        rows = {k: [] for k in ["raw_cat", "local_disk", "local_disk_hot", "local_disk_hot2",
                                "hoardfs_cold", "rclone_cold",
                                "hoardfs_hot_remount", "hoardfs_hot_remount2", "rclone_hot_remount",
                                "small_hoardfs_first", "small_hoardfs_hot", "small_hoardfs_warm",
                                "small_rclone_first", "small_rclone_hot", "small_rclone_warm",
                                "ls_hoardfs_cold", "ls_hoardfs_warm", "ls_hoardfs_remount",
                                "ls_hoardfs_ttl60_remount",
                                "ls_rclone_cold", "ls_rclone_warm", "ls_rclone_remount"]}
        for run in range(a.runs):
            d = os.path.join(work, f"run{run}")
            hm, hc = os.path.join(d, "hm"), os.path.join(d, "hc")
            rm, rc = os.path.join(d, "rm"), os.path.join(d, "rc")
            drop_caches()
            rows["raw_cat"].append(timed(["rclone", "cat", f"G:{BUCKET}/big"], env=renv))
            drop_caches()
            rows["local_disk"].append(read_file(local))
            # hoardfs
            drop_caches()
            hoardfs_mount(a, g, hm, hc)
            rows["hoardfs_cold"].append(read_file(f"{hm}/big"))
            rows["small_hoardfs_first"].append(read_tree(f"{hm}/small"))
            rows["small_hoardfs_hot"].append(read_tree(f"{hm}/small"))
            rows["ls_hoardfs_cold"].append(ls_lr(f"{hm}/tree"))
            rows["ls_hoardfs_warm"].append(ls_lr(f"{hm}/tree"))
            umount(hm)
            hoardfs_mount(a, g, hm, hc)
            # The local reference is read right before, under the same conditions.
            drop_caches()
            rows["local_disk_hot"].append(read_file(local))
            drop_caches()
            rows["hoardfs_hot_remount"].append(read_file(f"{hm}/big"))
            rows["small_hoardfs_warm"].append(read_tree(f"{hm}/small"))
            rows["ls_hoardfs_remount"].append(ls_lr(f"{hm}/tree"))
            umount(hm)
            # A second remount: is a slow first read after the fill the disk's or ours?
            hoardfs_mount(a, g, hm, hc)
            drop_caches()
            rows["local_disk_hot2"].append(read_file(local))
            drop_caches()
            rows["hoardfs_hot_remount2"].append(read_file(f"{hm}/big"))
            umount(hm)
            # Listings kept on disk serve a remount within --metadata-ttl.
            hoardfs_mount(a, g, hm, hc + "-ttl", ["--metadata-ttl", "60"])
            ls_lr(f"{hm}/tree")
            umount(hm)
            hoardfs_mount(a, g, hm, hc + "-ttl", ["--metadata-ttl", "60"])
            rows["ls_hoardfs_ttl60_remount"].append(ls_lr(f"{hm}/tree"))
            umount(hm)
            # rclone mount --vfs-cache-mode full
            drop_caches()
            rclone_mount(g, rm, rc)
            rows["rclone_cold"].append(read_file(f"{rm}/big"))
            rows["small_rclone_first"].append(read_tree(f"{rm}/small"))
            rows["small_rclone_hot"].append(read_tree(f"{rm}/small"))
            rows["ls_rclone_cold"].append(ls_lr(f"{rm}/tree"))
            rows["ls_rclone_warm"].append(ls_lr(f"{rm}/tree"))
            umount(rm)
            drop_caches()
            rclone_mount(g, rm, rc)
            rows["rclone_hot_remount"].append(read_file(f"{rm}/big"))
            rows["small_rclone_warm"].append(read_tree(f"{rm}/small"))
            rows["ls_rclone_remount"].append(ls_lr(f"{rm}/tree"))
            umount(rm)
            shutil.rmtree(d)
        med = {k: statistics.median(v) for k, v in rows.items()}
        res["seconds"] = med
        big = 200 * MiB
        res["MiB_per_s"] = {k: big / MiB / med[k] for k in
                            ["raw_cat", "local_disk", "hoardfs_cold", "rclone_cold",
                             "hoardfs_hot_remount", "hoardfs_hot_remount2", "rclone_hot_remount"]}
        res["ratios"] = {
            "hoardfs_cold_vs_rclone_cat": med["raw_cat"] / med["hoardfs_cold"],
            "rclone_mount_cold_vs_rclone_cat": med["raw_cat"] / med["rclone_cold"],
            "hoardfs_hot_remount_vs_local_disk":
                statistics.median(l / h for l, h in zip(rows["local_disk_hot"],
                                                        rows["hoardfs_hot_remount"])),
            "hoardfs_second_remount_vs_local_disk":
                statistics.median(l / h for l, h in zip(rows["local_disk_hot2"],
                                                        rows["hoardfs_hot_remount2"])),
            "rclone_hot_remount_vs_local_disk": med["local_disk"] / med["rclone_hot_remount"],
        }
        # Tier: store bytes per file byte with 1, 4, 16 clients.
        tier = {}
        for n in [1, 4, 16]:
            d = os.path.join(work, f"tier{n}")
            os.makedirs(d)
            p = subprocess.Popen([a.binary, "serve", "--origin", f"s3://{BUCKET}", "--cache-dir",
                                  os.path.join(d, "cache"), "--endpoint-url", g.endpoint(),
                                  "--force-path-style", "--listen", "127.0.0.1:0",
                                  "--insecure-plaintext", "--state-dir", os.path.join(d, "st"),
                                  *LOW_THRESHOLDS],
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                 env=clean_env())
            addr = p.stdout.readline().rsplit(" on ", 1)[1].split()[0]
            mnts = []
            for i in range(n):
                m = os.path.join(d, f"m{i}")
                os.makedirs(m)
                subprocess.run([a.binary, "mount", addr, m, "--cache-dir", os.path.join(d, f"c{i}"),
                                "--insecure-plaintext", "--daemon", *LOW_THRESHOLDS], check=True,
                               stdout=subprocess.DEVNULL)
                mnts.append(m)
            before = g.metric("block_bytes_read")
            t0 = time.perf_counter()
            procs = [subprocess.Popen(["dd", f"if={m}/mid", "of=/dev/null", "bs=1M"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                     for m in mnts]
            for q in procs:
                q.wait()
            took = time.perf_counter() - t0
            read = g.metric("block_bytes_read") - before
            tier[n] = {"store_bytes_per_file_byte": read / (64 * MiB),
                       "store_bytes_per_client": read / n, "seconds": took}
            for m in mnts:
                umount(m)
            p.kill()
            p.wait()
        res["tier_64MiB"] = tier
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "s3.json"), "w") as f:
            json.dump(res, f, indent=2)
        print(json.dumps(res, indent=2))
        plot(res, os.path.join(REPO, "doc", "img"))
    finally:
        for m in subprocess.run(["findmnt", "-rn", "-o", "TARGET"], capture_output=True,
                                text=True).stdout.split():
            if m.startswith(work):
                subprocess.run(["umount", "-l", m])
        g.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
