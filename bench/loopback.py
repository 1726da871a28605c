"""Helpers of the benchmarks that run a `hoardfs serve` and its mounts on loopback
(`locks.py`, `writes.py`): waiting for a process to say it is ready, and for a mount to
appear (a mount is silent on success unless -v)."""

import sys
import time


def wait_line(p, prefix, what):
    """Reads `p`'s stdout until a line starts with `prefix`; exits if `p` ends first."""
    while True:
        line = p.stdout.readline()
        if not line:
            sys.exit(f"{what} exited before saying {prefix!r}")
        if line.startswith(prefix):
            return line


def wait_mounted(p, mnt, what, timeout=60):
    """Waits for `mnt` in /proc/mounts; exits if `p` ends or `timeout` passes first."""
    deadline = time.monotonic() + timeout
    while True:
        with open("/proc/mounts") as f:
            if any(line.split()[1] == mnt for line in f):
                return
        if p.poll() is not None or time.monotonic() > deadline:
            sys.exit(f"{what} did not mount (exit={p.poll()})")
        time.sleep(0.05)
