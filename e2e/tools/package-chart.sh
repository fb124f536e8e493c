#!/usr/bin/env bash
# Packages the chart: `helm package` of charts/leasehold into DEST (default
# target/release-artifacts), after `helm lint --strict`. Prints the archive's path. The
# chart's end-to-end test installs exactly this archive.
set -euo pipefail
cd "$(dirname "$0")/../.."
dest=${1:-target/release-artifacts}
eval "$(e2e/tools/build.sh)"
mkdir -p "$dest"
"$helm" lint --strict --quiet charts/leasehold >&2
out=$("$helm" package charts/leasehold --destination "$dest")
# "Successfully packaged chart and saved it to: <path>"
echo "${out##*: }"
