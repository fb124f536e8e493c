#!/usr/bin/env bash
# Renders the latency plot of a `make bench` run: bench/plot.sh INPUT_JSON OUT_PNG, with the
# venv bench/prepare.sh made (matplotlib from PyPI).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
venv=${LEASEHOLD_CACHE:-$HOME/.cache/leasehold}/bench/venv
if [ ! -x "$venv/bin/python" ]; then
	echo "plot.sh: no venv at $venv: run bench/prepare.sh" >&2
	exit 1
fi
exec "$venv/bin/python" "$here/plot.py" "$@"
