#!/usr/bin/env bash
# Builds the bench peer programs into the directory given as $1:
#   $1/peers      Go: client-go leader election, etcd concurrency.Mutex, floors
#   $1/rust-peer  Rust: kube-lease-manager
# Needs Go 1.26 (GOTOOLCHAIN=local: a toolchain mismatch fails loudly instead of
# downloading) and a Rust stable toolchain; fetches modules/crates from the Go
# module proxy and crates.io on a cold cache. See README.md for build times.
set -euo pipefail

out=${1:?usage: bench/peers/build.sh OUTDIR}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)

export GOTOOLCHAIN=local
echo "build.sh: go build -> $out/peers" >&2
(
	cd "$here/go"
	# -mod=readonly: go.mod/go.sum are committed and must already be complete.
	# -buildvcs=false: no VCS stamping (works in any checkout, even without git).
	CGO_ENABLED=0 go build -mod=readonly -buildvcs=false -trimpath -o "$out/peers" .
)

echo "build.sh: cargo build --release (kube-lease-manager peer) -> $out/rust-peer" >&2
(
	cd "$here/rust"
	# --locked: Cargo.lock is committed; the peer's version is read from it.
	cargo build --release --locked
	# The target dir comes from CARGO_TARGET_DIR or rust/.cargo/config.toml
	# (../../target/peers-rs); ask cargo rather than guess.
	target_dir=$(cargo metadata --format-version 1 --no-deps --locked |
		grep -o '"target_directory":"[^"]*"' | cut -d'"' -f4)
	cp "$target_dir/release/rust-peer" "$out/rust-peer"
)
echo "build.sh: done: $out/peers $out/rust-peer" >&2
