#!/bin/sh
# Builds the Debian package of hoardfs: target/debian/hoardfs_VERSION_ARCH.deb (under
# $CARGO_TARGET_DIR if set). It holds the release binary, the man pages and shell
# completions generated from it, the systemd units of dist/systemd/ and the docs; see
# [package.metadata.deb] in crates/cli/Cargo.toml. Needs cargo-deb:
#     cargo install cargo-deb && dist/deb.sh
# Extra arguments go to `cargo deb` (e.g. --output DIR).
set -eu
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-target}
cargo build --release --locked -p hoardfs
out="$target/release/dist"
rm -rf "$out"
mkdir -p "$out/completions"
"$target/release/hoardfs" man "$out/man" >/dev/null
gzip -9n "$out"/man/*.1
"$target/release/hoardfs" completions bash >"$out/completions/hoardfs"
"$target/release/hoardfs" completions zsh >"$out/completions/_hoardfs"
"$target/release/hoardfs" completions fish >"$out/completions/hoardfs.fish"
# Stripped: the release profile keeps line tables for profiling, the package need not.
cargo deb -p hoardfs --no-build --strip "$@"
