#!/usr/bin/env python3
"""Reproduce seed 000's "Cache (state)" table over a shaped 100 Mbit/s link.

A veth pair joins the root namespace (client side, 198.18.0.2, where the FUSE mounts
live) to the namespace hoardfs-bench-srv (server, 198.18.0.1); both ends are shaped
with tc tbf. Run as root: python3 bench/seed000.py. See doc/BENCHMARKS.md.
"""
import argparse
import atexit
import dataclasses
import datetime
import hashlib
import json
import operator
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORK = os.path.join(REPO, "bench", "out", "work")  # on the real disk, never tmpfs
PIDFILE = os.path.join(WORK, "pids.json")
NS = "hoardfs-bench-srv"
VETH_ROOT, VETH_NS = "hfb-root", "hfb-srv"
SRV_IP, CLI_IP = "198.18.0.1", "198.18.0.2"
HOARD_PORT, RAW_PORT, SFTP_PORT = 7070, 7071, 7072
# Free-space thresholds for cached bench mounts: the defaults (cull below 7 % free, stop
# below 3 %) are percentages of the whole disk, so on a nearly full disk they would evict
# the bench's cache mid-run and the numbers would measure the disk's fill, not hoardfs.
LOW_THRESHOLDS = ["--bstop", "0", "--bcull", "1", "--brun", "2"]
# burst: a few MTU-sized packets (tbf splits larger GSO packets itself); latency bounds
# the queue (~625 KB at 100mbit). A 1mb burst lets the first second exceed the rate.
TBF = ["burst", "32kb", "latency", "50ms"]
MiB = 1 << 20
PACKAGES = {"ip": "iproute2", "tc": "iproute2", "ss": "iproute2", "socat": "socat",
            "sshfs": "sshfs", "fusermount3": "fuse3"}

ROWS = [  # (name, meaning), in table order
    ("Server", "server side, local file, page cache warm (second of two reads)"),
    ("None", "hoardfs --no-cache, page cache dropped"),
    ("COLD", "hoardfs, empty disk cache, page cache dropped"),
    ("HOT", "hoardfs remounted on the populated disk cache, page cache dropped"),
    ("PGCACHE", "hoardfs, same mount as HOT read again, page cache warm"),
    ("raw link", "one TCP stream over the shaped link, sender page cache warm"),
    ("local disk", "client-side local copy, page cache dropped"),
    ("local fresh", "a local copy written during the run, read right before HOT"),
    ("local pgcache", "client-side local copy, page cache warm"),
    ("sshfs cold", "sshfs -o directport (sftp-server via socat), page cache dropped"),
    ("sshfs warm", "sshfs, same mount read again"),
]

# Runs in the server namespace: warm the page cache, listen, send the file to one client.
SENDER = r"""
import socket, sys
path, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
with open(path, 'rb') as f:
    while f.read(1 << 20): pass
s = socket.create_server((host, port))
print('ready', flush=True)
c, _ = s.accept()
with open(path, 'rb') as f: c.sendfile(f)
c.close()
"""


@dataclasses.dataclass
class Row:
    name: str
    meaning: str
    times: list = dataclasses.field(default_factory=list)      # seconds, one per run
    net_bytes: list = dataclasses.field(default_factory=list)  # bytes the client received

    @property
    def median(self):
        return statistics.median(self.times) if self.times else None


def log(msg):
    print(f"[seed000] {msg}", file=sys.stderr, flush=True)


def sh(cmd, check=True):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"command failed ({r.returncode}): {cmd}\n{r.stderr.strip()}")
    return r


def in_ns(*cmd):
    return ["ip", "netns", "exec", NS, *cmd]


# ---------------------------------------------------------------- environment

def sftp_server_path():
    r = sh(["dpkg", "-L", "openssh-sftp-server"], check=False)
    for p in r.stdout.split():
        if p.endswith("/sftp-server") and os.path.isfile(p) and os.access(p, os.X_OK):
            return p


def ensure_packages():
    missing = sorted({pkg for cmd, pkg in PACKAGES.items() if not shutil.which(cmd)})
    if not sftp_server_path():
        missing.append("openssh-sftp-server")
    if missing:
        log(f"installing missing packages: {' '.join(missing)}")
        sh(["apt-get", "update"])
        sh(["apt-get", "install", "-y", *missing])
    if not os.path.exists("/dev/fuse"):
        sh(["modprobe", "fuse"], check=False)


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def rx_bytes():
    with open(f"/sys/class/net/{VETH_ROOT}/statistics/rx_bytes") as f:
        return int(f.read())


def setup_network(rate):
    if sh(["ip", "-o", "addr", "show", "to", f"{CLI_IP}/24"]).stdout.strip():
        raise RuntimeError(f"{CLI_IP}/24 is already used in the root namespace")
    for cmd in (["ip", "netns", "add", NS],
                ["ip", "link", "add", VETH_ROOT, "type", "veth", "peer", "name", VETH_NS],
                ["ip", "link", "set", VETH_NS, "netns", NS],
                ["ip", "addr", "add", f"{CLI_IP}/24", "dev", VETH_ROOT],
                ["ip", "link", "set", VETH_ROOT, "up"],
                in_ns("ip", "addr", "add", f"{SRV_IP}/24", "dev", VETH_NS),
                in_ns("ip", "link", "set", VETH_NS, "up"),
                in_ns("ip", "link", "set", "lo", "up"),
                ["tc", "qdisc", "replace", "dev", VETH_ROOT, "root", "tbf", "rate", rate, *TBF],
                in_ns("tc", "qdisc", "replace", "dev", VETH_NS, "root", "tbf", "rate", rate, *TBF)):
        sh(cmd)


def read_all(path, h=None):
    with open(path, "rb") as f:
        while (chunk := f.read(MiB)):
            if h:
                h.update(chunk)
    return h


def is_mounted(mnt):
    with open("/proc/mounts") as f:
        return any(line.split()[1] == mnt for line in f)


def force_unmount(mnt):
    for cmd in (["umount", mnt], ["fusermount3", "-u", mnt], ["umount", "-l", mnt]):
        if not is_mounted(mnt) or sh(cmd, check=False).returncode == 0:
            return


def clean_leftovers():
    """Undo whatever a previous (crashed or --keep) run left behind; safe to call twice."""
    with open("/proc/mounts") as f:
        for mnt in [l.split()[1] for l in f if l.split()[1].startswith(WORK + "/")]:
            force_unmount(mnt)
    if os.path.exists(PIDFILE):  # our root-namespace processes, matched by exact cmdline
        with open(PIDFILE) as f:
            for entry in json.load(f):
                try:
                    with open(f"/proc/{entry['pid']}/cmdline", "rb") as c:
                        if c.read().decode().split("\0")[:-1] == entry["cmd"]:
                            os.kill(entry["pid"], signal.SIGKILL)
                except (OSError, ValueError):
                    pass
        os.unlink(PIDFILE)
    if NS in sh(["ip", "netns", "list"]).stdout.split():
        for pid in sh(["ip", "netns", "pids", NS], check=False).stdout.split():
            try:  # everything in our namespace is ours
                os.kill(int(pid), signal.SIGKILL)
            except OSError:
                pass
        sh(["ip", "netns", "del", NS], check=False)
    if os.path.exists(f"/sys/class/net/{VETH_ROOT}"):
        sh(["ip", "link", "del", VETH_ROOT], check=False)
    shutil.rmtree(os.path.join(WORK, "cache"), ignore_errors=True)


# ---------------------------------------------------------------- processes and mounts

class Bench:
    def __init__(self, args, size, digest):
        self.args, self.size, self.digest = args, size, digest
        self.procs = {}    # Popen -> log path
        self.mounts = {}   # mount point -> FUSE process
        self.rows = {name: Row(name, meaning) for name, meaning in ROWS}
        self.seq = 0
        self.cleaned = False

    def spawn(self, cmd, name):
        self.seq += 1
        path = os.path.join(WORK, "logs", f"{self.seq:03d}-{name}.log")
        with open(path, "wb") as logf:
            p = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL)
        self.procs[p] = path
        self._save_pids()
        return p

    def _save_pids(self):
        with open(PIDFILE, "w") as f:
            json.dump([{"pid": p.pid, "cmd": p.args} for p in self.procs], f)

    def start_ns_servers(self, srv_dir, port, hoardfs=True, sftp=True, sftp_port=SFTP_PORT):
        """In the server namespace: `hoardfs serve srv_dir` on `port`, and an sftp-server
        behind socat on `sftp_port` (for sshfs)."""
        if hoardfs:
            p = self.spawn(in_ns(self.args.binary, "serve", srv_dir, "--listen",
                                 f"{SRV_IP}:{port}", "--allow-unauthenticated",
                                 *(self.args.serve_opt or [])),
                           "hoardfs-serve")
            self.wait_output(p, "hoardfs: serving", "hoardfs serve")
        if sftp:
            p = self.spawn(in_ns("socat", f"TCP-LISTEN:{sftp_port},bind={SRV_IP},reuseaddr,fork",
                                 f"EXEC:{sftp_server_path()}"), "sftp-socat")
            self.wait_for(p, lambda: sh(in_ns("ss", "-Hltn", f"sport = :{sftp_port}")).stdout
                          .strip(), "socat for sftp-server")

    def wait_for(self, proc, pred, what, timeout=30):
        deadline = time.monotonic() + timeout
        while not pred():
            if proc.poll() is not None or time.monotonic() > deadline:
                with open(self.procs[proc], errors="replace") as f:
                    tail = f.read()[-2000:]
                raise RuntimeError(f"{what} not ready (exit={proc.poll()}); "
                                   f"{self.procs[proc]}:\n{tail}")
            time.sleep(0.05)

    def wait_output(self, proc, text, what):
        self.wait_for(proc, lambda: text in open(self.procs[proc], errors="replace").read(), what)

    def stop(self, proc, grace=0.0):
        """Give proc `grace` seconds to exit by itself, then SIGTERM, then SIGKILL."""
        for action in (None, proc.terminate, proc.kill):
            if action:
                action()
            try:
                proc.wait(grace if action is None else 10)
                break
            except subprocess.TimeoutExpired:
                pass
        self.procs.pop(proc, None)
        self._save_pids()

    def mount(self, cmd, mnt, name):
        """Run a FUSE client in the foreground; return once mnt is in /proc/mounts."""
        os.makedirs(mnt, exist_ok=True)
        proc = self.spawn(cmd, name)
        self.wait_for(proc, lambda: is_mounted(mnt), name)
        self.mounts[mnt] = proc
        return mnt

    def unmount(self, mnt):
        force_unmount(mnt)
        self.stop(self.mounts.pop(mnt), grace=10)  # a FUSE client exits on unmount

    def cleanup(self):
        if self.cleaned:
            return
        self.cleaned = True
        if self.args.keep:
            log(f"--keep: namespace {NS}, mounts and processes left in place")
            return
        for mnt in list(self.mounts):
            self.unmount(mnt)
        for proc in list(self.procs):
            self.stop(proc)
        clean_leftovers()

    # ------------------------------------------------------------ measurements

    def read(self, row, path, count_net=False):
        """Time one `cat path > /dev/null` (1 MiB reads, wall clock, open included)."""
        buf, n, rx0 = bytearray(MiB), 0, rx_bytes()
        t0 = time.perf_counter()
        fd = os.open(path, os.O_RDONLY)
        try:
            while (k := os.readv(fd, [buf])):
                n += k
        finally:
            os.close(fd)
        self.rows[row].times.append(time.perf_counter() - t0)
        if count_net:
            self.rows[row].net_bytes.append(rx_bytes() - rx0)
        if n != self.size:
            raise RuntimeError(f"{path}: read {n} bytes, expected {self.size}")

    def verify(self, path):
        if read_all(path, hashlib.sha256()).hexdigest() != self.digest:
            raise RuntimeError(f"{path}: content differs from the server's file")

    def measure_server(self, srv):
        read_all(srv)  # warms the page cache
        self.read("Server", srv)

    def measure_local(self, local):
        drop_caches()
        self.read("local disk", local)
        self.read("local pgcache", local)

    def measure_raw(self, srv):
        p = self.spawn(in_ns(sys.executable, "-c", SENDER, srv, SRV_IP, str(RAW_PORT)), "raw")
        self.wait_output(p, "ready", "raw-link sender")
        buf, n, rx0 = bytearray(MiB), 0, rx_bytes()
        t0 = time.perf_counter()
        with socket.create_connection((SRV_IP, RAW_PORT)) as s:
            while (k := s.recv_into(buf)):
                n += k
        self.rows["raw link"].times.append(time.perf_counter() - t0)
        self.rows["raw link"].net_bytes.append(rx_bytes() - rx0)
        self.stop(p)
        if n != self.size:
            raise RuntimeError(f"raw link: received {n} bytes, expected {self.size}")

    def hoard_mount(self, *opts):
        mnt = os.path.join(WORK, "mnt-hoardfs")
        if "--cache-dir" in opts:
            opts = (*opts, *LOW_THRESHOLDS)
        return self.mount([self.args.binary, "mount", f"{SRV_IP}:{HOARD_PORT}", mnt, *opts],
                          mnt, "hoardfs-mount")

    def measure_hoardfs(self):
        cache = os.path.join(WORK, "cache")
        shutil.rmtree(cache, ignore_errors=True)
        os.makedirs(cache)
        mnt = self.hoard_mount("--no-cache")
        path = os.path.join(mnt, "data.bin")
        drop_caches()
        self.read("None", path, count_net=True)
        self.unmount(mnt)

        self.hoard_mount("--cache-dir", cache)
        drop_caches()
        self.read("COLD", path, count_net=True)
        self.verify(path)
        self.unmount(mnt)

        # Same-run control for HOT: a local file written during this run (as the cache
        # file was), read after the same mount, just before HOT.
        fresh = os.path.join(WORK, "local", "fresh.bin")
        shutil.copyfile(os.path.join(WORK, "srv", "data.bin"), fresh)
        rx0 = rx_bytes()  # HOT traffic counts from before the mount to the end of the read
        self.hoard_mount("--cache-dir", cache)
        drop_caches()
        self.read("local fresh", fresh)
        drop_caches()
        self.read("HOT", path)
        self.rows["HOT"].net_bytes.append(rx_bytes() - rx0)
        self.read("PGCACHE", path)
        self.verify(path)
        self.unmount(mnt)

    def measure_sshfs(self):
        mnt = os.path.join(WORK, "mnt-sshfs")
        self.mount(["sshfs", "-f", "-o", f"directport={SFTP_PORT}",
                    f"{SRV_IP}:{os.path.join(WORK, 'srv')}", mnt], mnt, "sshfs")
        path = os.path.join(mnt, "data.bin")
        drop_caches()
        self.read("sshfs cold", path, count_net=True)
        self.read("sshfs warm", path, count_net=True)
        self.verify(path)
        self.unmount(mnt)


# ---------------------------------------------------------------- data and report

def make_data(size):
    """Random file on the server side plus a client-side copy; reused while the size fits."""
    srv, local = os.path.join(WORK, "srv", "data.bin"), os.path.join(WORK, "local", "data.bin")
    sumfile = os.path.join(WORK, "data.sha256")
    if not (os.path.exists(srv) and os.path.getsize(srv) == size and os.path.exists(sumfile)):
        log(f"writing {size / MiB:.0f} MiB of random bytes to {srv}")
        h = hashlib.sha256()
        with open(srv, "wb") as f:
            for off in range(0, size, MiB):
                chunk = os.urandom(min(MiB, size - off))
                h.update(chunk)
                f.write(chunk)
        with open(sumfile, "w") as f:
            f.write(h.hexdigest())
    if not (os.path.exists(local) and os.path.getsize(local) == size):
        shutil.copyfile(srv, local)
    # Untimed pass: the first read after writing is slower than steady state (the VM
    # host's own cache); warming it makes the local-disk reference stricter, not looser.
    drop_caches()
    read_all(local)
    with open(sumfile) as f:
        return srv, local, f.read().strip()


def checks(rows, size):
    def speed(ref, x):  # throughput of x relative to ref, i.e. time(ref) / time(x)
        return rows[ref].median / rows[x].median if rows[ref].times and rows[x].times else None

    cold_none, hot = speed("COLD", "None"), rows["HOT"].net_bytes
    hot_net = statistics.median(hot) / size if hot else None
    spec = [
        ("HOT vs local disk (dropped)", speed("local disk", "HOT"), ">=", 0.9, "x"),
        ("HOT vs local file of this run", speed("local fresh", "HOT"), ">=", 0.9, "x"),
        ("PGCACHE vs local page cache", speed("local pgcache", "PGCACHE"), ">=", 0.9, "x"),
        ("None vs raw link", speed("raw link", "None"), ">=", 0.9, "x"),
        ("COLD vs raw link", speed("raw link", "COLD"), ">=", 0.9, "x"),
        ("COLD slower than None by", cold_none and cold_none - 1, "<=", 0.03, "%"),
        ("HOT network bytes / file size", hot_net, "<", 0.01, "%"),
    ]
    ops = {">=": operator.ge, "<=": operator.le, "<": operator.lt}
    return [{"check": name, "value": v, "op": op, "target": t, "unit": unit,
             "result": "SKIP" if v is None else "PASS" if ops[op](v, t) else "FAIL"}
            for name, v, op, t, unit in spec]


def fmt(v, unit):
    return "-" if v is None else f"{v * 100:.2f}%" if unit == "%" else f"{v:.2f}x"


def report(rows, size, runs, chk):
    w = 16
    print(f"\n{'Cache (state)':<{w}}" + "".join(f" {f'Run #{i + 1}':>10}" for i in range(runs))
          + f" {'median':>10} {'MB/s':>9} {'net/size':>9}")
    print("=" * w + (" " + "=" * 10) * (runs + 1) + (" " + "=" * 9) * 2)
    for r in rows.values():
        if r.times:
            net = f"{statistics.median(r.net_bytes) / size * 100:.1f}%" if r.net_bytes else ""
            print(f"{r.name:<{w}}" + "".join(f" {t:>8.3f} s" for t in r.times)
                  + f" {r.median:>8.3f} s {size / 1e6 / r.median:>9.1f} {net:>9}")
    if rows["raw link"].median:
        print(f"\nraw link goodput: {size * 8 / 1e6 / rows['raw link'].median:.1f} Mbit/s")
    print(f"\n{'Check':<32} {'value':>9}  {'target':>9}  result")
    for c in chk:
        target = c["op"] + fmt(c["target"], c["unit"])
        print(f"{c['check']:<32} {fmt(c['value'], c['unit']):>9}  {target:>9}  {c['result']}")


def save(args, rows, size, chk):
    out_dir = os.path.abspath(args.out or os.path.join(REPO, "bench", "out"))
    os.makedirs(out_dir, exist_ok=True)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    result = {
        "benchmark": "seed000", "time": stamp, "size_bytes": size, "runs": args.runs,
        "rate": args.rate, "tbf": TBF, "kernel": os.uname().release,
        "binary": None if args.skip_hoardfs else args.binary,
        "rows": [dict(dataclasses.asdict(r), median=r.median) for r in rows.values() if r.times],
        "checks": chk,
    }
    for name in (f"seed000-{stamp}.json", "latest.json"):
        with open(os.path.join(out_dir, name), "w") as f:
            json.dump(result, f, indent=2)
    log(f"results saved to {os.path.join(out_dir, f'seed000-{stamp}.json')} (and latest.json)")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--binary", default=os.path.join(REPO, "target", "release", "hoardfs"))
    ap.add_argument("--size-mib", type=int, default=200, help="test file size (default 200)")
    ap.add_argument("--runs", type=int, default=2, help="repetitions; median reported (default 2)")
    ap.add_argument("--rate", default="100mbit", help="tc tbf rate, both directions")
    ap.add_argument("--out", help="directory for the JSON results (default bench/out)")
    ap.add_argument("--keep", action="store_true", help="leave namespace/processes for debugging")
    ap.add_argument("--skip-hoardfs", action="store_true", help="only the reference rows")
    ap.add_argument("--skip-sshfs", action="store_true", help="leave out the sshfs rows")
    ap.add_argument("--serve-opt", action="append", metavar="ARG",
                    help="extra argument for the hoardfs server (repeatable)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("seed000: run as root (namespaces, tc, drop_caches, FUSE mounts)")
    args.binary = os.path.abspath(args.binary)
    size = args.size_mib * MiB

    ensure_packages()
    if not args.skip_hoardfs and not os.path.exists(args.binary):
        log(f"{args.binary} missing: running cargo build --release")
        subprocess.run(["cargo", "build", "--release"], cwd=REPO, check=True)
    shutil.rmtree(os.path.join(WORK, "logs"), ignore_errors=True)
    for d in ("logs", "srv", "local"):
        os.makedirs(os.path.join(WORK, d), exist_ok=True)
    fstype = sh(["stat", "-f", "-c", "%T", WORK]).stdout.strip()
    if fstype in ("tmpfs", "ramfs"):
        sys.exit(f"seed000: {WORK} is on {fstype}; the local-disk rows need a real disk")
    clean_leftovers()

    srv, local, digest = make_data(size)
    b = Bench(args, size, digest)
    atexit.register(b.cleanup)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started with it ignored
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda n, _: sys.exit(f"seed000: signal {n}, cleaning up"))
    try:
        setup_network(args.rate)
        b.start_ns_servers(os.path.join(WORK, "srv"), HOARD_PORT, hoardfs=not args.skip_hoardfs,
                           sftp=not args.skip_sshfs)
        for run in range(args.runs):
            log(f"run {run + 1}/{args.runs}")
            b.measure_server(srv)
            if not args.skip_hoardfs:
                b.measure_hoardfs()
            b.measure_raw(srv)
            b.measure_local(local)
            if not args.skip_sshfs:
                b.measure_sshfs()
    finally:
        b.cleanup()

    chk = checks(b.rows, size)
    report(b.rows, size, args.runs, chk)
    save(args, b.rows, size, chk)
    return 1 if any(c["result"] == "FAIL" for c in chk) else 0


if __name__ == "__main__":
    sys.exit(main())
