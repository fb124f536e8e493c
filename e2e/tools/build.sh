#!/usr/bin/env bash
# Builds the chart tools from the Go module proxy, at pinned versions, into a cache outside
# the repository (like ../controlplane/build.sh):
#   ${LEASEHOLD_CACHE:-$HOME/.cache/leasehold}/tools/<name>-<version>/<name>
# A tool is built only when missing. Prints `helm=<path>` and `kubeconform=<path>`, for
# `eval "$(e2e/tools/build.sh)"`; progress goes to stderr.
set -euo pipefail
export GOTOOLCHAIN=local CGO_ENABLED=0

HELM_VERSION=v3.22.0
KUBECONFORM_VERSION=v0.8.0
# `helm template` and `helm lint` default to this Kubernetes version when given none (its
# upstream Makefile stamps it; `go install` alone would leave 1.20). make lint passes the
# pinned release explicitly anyway.
HELM_KUBE_MINOR=36

cache=${LEASEHOLD_CACHE:-$HOME/.cache/leasehold}

install() { # <name> <package> <version> [ldflags]
  local name=$1 pkg=$2 version=$3 ldflags=${4:-}
  local dir="$cache/tools/$name-$version"
  if [ ! -x "$dir/$name" ]; then
    echo "building $name $version ($pkg)" >&2
    mkdir -p "$dir"
    # GOBIN into a scratch directory, then rename: an interrupted build leaves no binary.
    local tmp
    tmp=$(mktemp -d "$dir/.build-XXXXXX")
    GOBIN="$tmp" go install -trimpath -ldflags "-s -w $ldflags" "$pkg@$version"
    mv "$tmp/$name" "$dir/$name"
    rmdir "$tmp"
  fi
  echo "$name=$dir/$name"
}

install helm helm.sh/helm/v3/cmd/helm "$HELM_VERSION" \
  "-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$HELM_KUBE_MINOR"
install kubeconform github.com/yannh/kubeconform/cmd/kubeconform "$KUBECONFORM_VERSION" \
  "-X main.version=$KUBECONFORM_VERSION"
