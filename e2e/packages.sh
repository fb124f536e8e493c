#!/usr/bin/env bash
# The Debian packages the tests need, installed when missing (as root, with apt-get), or
# named with the command to install them:
#   postgresql     resource-side fencing tests, the inventory example and the demo
#   faketime       clock faults in the fault suite
#   runc, containernetworking-plugins, iptables, iproute2, util-linux (nsenter/unshare)
#                  the test node (e2e/node)
#   busybox-static the test node's shell image
#   gcc, libc6-dev the node's static pod sandbox process (e2e/node/pause.c)
#   wget           the fenced-configmap example's writer.sh, run on the host by e2e tests
set -euo pipefail

# The toolchains the client libraries' tests build with (clients/): not installed here,
# because Debian's releases are older than the ones they are written for.
tools=()
command -v python3 >/dev/null || tools+=("Python 3.9+ (python3)")
command -v node >/dev/null && command -v npm >/dev/null || tools+=("Node.js 20+ with npm")
command -v java >/dev/null && command -v mvn >/dev/null || tools+=("JDK 17+ with Maven (java, mvn)")
if [ ${#tools[@]} -gt 0 ]; then
  printf 'the client libraries'"'"' tests (clients/) need: %s\n' "${tools[@]}" >&2
  exit 1
fi

# A file each package provides, and the package.
need=(
  "/usr/lib/postgresql/*/bin/postgres postgresql"
  "/usr/lib/*/faketime/libfaketime.so.1 faketime"
  "/usr/sbin/runc runc"
  "/usr/lib/cni/bridge containernetworking-plugins"
  "/bin/busybox busybox-static"
  "/usr/sbin/iptables iptables"
  "/usr/sbin/ip iproute2"
  "/usr/bin/nsenter util-linux"
  "/usr/bin/cc gcc"
  "/usr/lib/x86_64-linux-gnu/libc.a libc6-dev"
  "/usr/bin/wget wget"
)
missing=()
for item in "${need[@]}"; do
  read -r pattern package <<< "$item"
  # shellcheck disable=SC2086 # the pattern is a glob on purpose
  compgen -G "$pattern" >/dev/null || missing+=("$package")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  echo "the tests need these Debian packages: ${missing[*]}; install them as root:" >&2
  echo "  apt-get update && apt-get install -y --no-install-recommends ${missing[*]}" >&2
  exit 1
fi
echo "installing Debian packages the tests need: ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >&2
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
