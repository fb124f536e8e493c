#!/usr/bin/env bash
# Builds what `make bench` needs besides the Rust workspace, before anything is timed, into
# a cache outside the repository, and only when missing or outdated:
#   $CACHE/bench/peers/{peers,rust-peer}   bench/peers (Go: client-go, etcd; Rust: kube-lease-manager)
#   $CACHE/bench/venv                      Python venv with matplotlib from PyPI, for the plot
# CACHE is ${LEASEHOLD_CACHE:-$HOME/.cache/leasehold}. Prints the bench cache directory.
# Cold: ~7 min for the peers (see bench/peers/README.md) plus ~1 min for the venv.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${LEASEHOLD_CACHE:-$HOME/.cache/leasehold}/bench
mkdir -p "$cache"

# A stamp of every input: rebuild when any file of bench/peers changes.
peers_stamp=$(cd "$here/peers" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1)
if [ ! -x "$cache/peers/peers" ] || [ ! -x "$cache/peers/rust-peer" ] ||
	[ "$(cat "$cache/peers/.stamp" 2>/dev/null)" != "$peers_stamp" ]; then
	echo "prepare.sh: building the peer programs (cold: several minutes)" >&2
	"$here/peers/build.sh" "$cache/peers"
	echo "$peers_stamp" > "$cache/peers/.stamp"
fi

venv_stamp=$(sha256sum "$here/plot-requirements.txt" | cut -d' ' -f1)
if [ ! -x "$cache/venv/bin/python" ] || [ "$(cat "$cache/venv/.stamp" 2>/dev/null)" != "$venv_stamp" ]; then
	echo "prepare.sh: creating the plotting venv (matplotlib from PyPI)" >&2
	rm -rf "$cache/venv"
	python3 -m venv "$cache/venv"
	"$cache/venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$here/plot-requirements.txt"
	echo "$venv_stamp" > "$cache/venv/.stamp"
fi
echo "$cache"
