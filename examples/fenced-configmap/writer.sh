#!/bin/sh
# Writes routing-table with the lock's token: acquire through the sidecar, stamp the token
# into the annotation, apply, release. A writer whose hold was lost (and whose token is
# therefore stale) is refused by the webhook; the Kubernetes object never goes back.
# Needs: LEASEHOLD_URL (injected), kubectl, wget (busybox's or GNU).  Usage: writer.sh <routes-value>
set -eu
value=${1:?usage: writer.sh <routes-value>}
dir=$(dirname "$0")
token=$(wget -q -O- --post-data '{"waitSeconds": 30}' "$LEASEHOLD_URL/v1/locks/config-writer/acquire" |
        sed -n 's/.*"fencingToken":\([0-9]*\).*/\1/p')
[ -n "$token" ] || { echo "no lock" >&2; exit 75; }
trap 'wget -q -O- --post-data "" "$LEASEHOLD_URL/v1/locks/config-writer/release" >/dev/null' EXIT
sed -e "s/\"TOKEN\"/\"$token\"/" -e "s/routes: \"v1\"/routes: \"$value\"/" "$dir/configmap.yaml" |
  kubectl apply --server-side --field-manager=writer --force-conflicts -f -
echo "wrote routes=$value with token $token"
