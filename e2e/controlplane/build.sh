#!/usr/bin/env bash
# Builds the test control plane (kube-apiserver, etcd, kubectl, kube-controller-manager)
# and the node (kube-scheduler, kubelet, kube-proxy) from Go modules at the release pinned
# in go.mod, into a cache outside the repository:
#   ${LEASEHOLD_CACHE:-$HOME/.cache/leasehold}/controlplane/<version>/bin
# With an argument (releases/<name>, a directory with a go.mod of its own pinning another
# release, e.g. the oldest supported one), the control plane of that release only.
# A binary is rebuilt only when missing. Prints the bin directory on success.
set -euo pipefail
cd "$(dirname "$0")/${1:-.}"
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=readonly

version=$(awk '$1=="k8s.io/kubernetes" {print $2; exit}' go.mod)
etcd_version=$(awk '$1=="go.etcd.io/etcd/server/v3" {print $2; exit}' go.mod)
cache=${LEASEHOLD_CACHE:-$HOME/.cache/leasehold}
bin="$cache/controlplane/$version/bin"
mkdir -p "$bin"

major=${version#v}; major=${major%%.*}
minor=${version#v*.}; minor=${minor%%.*}
stamp=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  stamp+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
  stamp+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done

build() { # <output name> <package> [extra ldflags]
  local out="$bin/$1" pkg=$2 extra=${3:-}
  [ -x "$out" ] && return 0
  echo "building $1 ($pkg)" >&2
  go build -trimpath -ldflags "-s -w $extra" -o "$out.tmp" "$pkg"
  mv "$out.tmp" "$out"
}

build etcd go.etcd.io/etcd/server/v3 "-X go.etcd.io/etcd/api/v3/version.Version=${etcd_version#v}"
build kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver "$stamp"
build kube-controller-manager k8s.io/kubernetes/cmd/kube-controller-manager "$stamp"
build kubectl k8s.io/kubernetes/cmd/kubectl "$stamp"
[ -n "${1:-}" ] && { echo "$bin"; exit 0; }
# The node of e2e/node (after the control plane: they share most of the build cache).
build kube-scheduler k8s.io/kubernetes/cmd/kube-scheduler "$stamp"
build kubelet k8s.io/kubernetes/cmd/kubelet "$stamp"
build kube-proxy k8s.io/kubernetes/cmd/kube-proxy "$stamp"
echo "$bin"
