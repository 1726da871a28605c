#!/usr/bin/env bash
# Crash soak: many more kill -9 iterations of the cache crash test than the test suite runs
# (crates/cache/tests/crash.rs). Usage: bash bench/crash-soak.sh [ITERATIONS] (default 3000).
set -euo pipefail
cd "$(dirname "$0")/.."
n="${1:-3000}"
echo "crash soak: $n kill -9 iterations (release build)"
HOARDFS_CRASH_ITERATIONS="$n" cargo test --release -q -p hoardfs-cache --test crash \
  crash_kill_during_fills_and_evictions -- --exact --nocapture
