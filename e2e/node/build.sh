#!/usr/bin/env bash
# Everything the test node needs besides the Rust workspace, built or installed only when
# missing:
#   - kube-scheduler, kubelet, kube-proxy (with the control plane, by ../controlplane/build.sh,
#     from the pinned k8s.io/kubernetes module);
#   - containerd, containerd-shim-runc-v2 and ctr v$CONTAINERD_VERSION from the Go module proxy,
#     into ${LEASEHOLD_CACHE:-$HOME/.cache/leasehold}/node/containerd-<version>/;
#   - the pod sandbox process (pause.c, static) into .../node/pause-<hash of pause.c>/pause;
#   - from Debian's packages (../packages.sh): runc, the CNI plugins, busybox-static (the test
#     images' shell), iptables (kube-proxy), iproute2 (the node's network), gcc (pause).
# Prints `controlplane=<dir>`, `containerd=<dir>` and `pause=<file>`; progress goes to stderr.
set -euo pipefail
cd "$(dirname "$0")"
export GOTOOLCHAIN=local

CONTAINERD_VERSION=v2.2.9
cache=${LEASEHOLD_CACHE:-$HOME/.cache/leasehold}

../packages.sh

controlplane=$(../controlplane/build.sh)

dir="$cache/node/containerd-$CONTAINERD_VERSION"
if [ ! -x "$dir/containerd" ] || [ ! -x "$dir/containerd-shim-runc-v2" ] || [ ! -x "$dir/ctr" ]; then
  echo "building containerd $CONTAINERD_VERSION (Go module proxy)" >&2
  mkdir -p "$dir"
  tmp=$(mktemp -d "$dir/.build-XXXXXX")
  # Without the snapshotters the node does not use (they need C libraries or kernel parts).
  GOBIN="$tmp" CGO_ENABLED=0 go install -trimpath -tags "no_btrfs no_devmapper no_zfs" \
    -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION" \
    "github.com/containerd/containerd/v2/cmd/containerd@$CONTAINERD_VERSION" \
    "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION" \
    "github.com/containerd/containerd/v2/cmd/ctr@$CONTAINERD_VERSION"
  mv "$tmp"/* "$dir/"
  rmdir "$tmp"
fi
pause_dir="$cache/node/pause-$(sha256sum pause.c | cut -c1-16)"
if [ ! -x "$pause_dir/pause" ]; then
  mkdir -p "$pause_dir"
  cc -static -Os -s -o "$pause_dir/pause.tmp" pause.c
  mv "$pause_dir/pause.tmp" "$pause_dir/pause"
fi
echo "controlplane=$controlplane"
echo "containerd=$dir"
echo "pause=$pause_dir/pause"
