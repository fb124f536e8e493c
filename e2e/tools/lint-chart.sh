#!/usr/bin/env bash
# `make lint`: `helm lint --strict`, then `helm template` validated by kubeconform in strict
# mode against the schemas of the pinned Kubernetes release and of the oldest supported one
# (e2e/controlplane/releases/*), for the default values and for every combination in
# charts/leasehold/ci/*-values.yaml.
#
# The schemas come from each release's own /openapi/v2 (the published collections cannot be
# downloaded here): `leasehold-schemas` generates them once per release into the cache.
# LEASEHOLD_SCHEMAS=<dir> skips that step for the pinned release (the chart's e2e test
# generates them itself). Kinds without a built-in schema are skipped by name: the cert-manager and
# Prometheus Operator kinds (their CRDs are not part of Kubernetes).
set -euo pipefail
cd "$(dirname "$0")/../.."

eval "$(e2e/tools/build.sh)"
release_version() { awk '$1=="k8s.io/kubernetes" {print $2; exit}' "e2e/controlplane/${1:+$1/}go.mod"; }
version=$(release_version "")
schemas=${LEASEHOLD_SCHEMAS:-$(cargo run -q -p leasehold-harness --bin leasehold-schemas)}
oldest_release=${OLDEST_RELEASE:-releases/v1.30}
oldest=$(release_version "$oldest_release")
oldest_schemas=$(LEASEHOLD_KUBE_RELEASE=$oldest_release cargo run -q -p leasehold-harness --bin leasehold-schemas)
chart=charts/leasehold
skip=cert-manager.io/v1/Certificate,cert-manager.io/v1/Issuer,monitoring.coreos.com/v1/ServiceMonitor,monitoring.coreos.com/v1/PodMonitor,monitoring.coreos.com/v1/PrometheusRule
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

cases=(default "$chart"/ci/*-values.yaml)
for case in "${cases[@]}"; do
  name=$(basename "$case" .yaml)
  values=()
  [ "$case" = default ] || values=(--values "$case")
  echo "== $name" >&2
  "$helm" lint --strict --quiet --kube-version "$version" "${values[@]}" "$chart" >&2
  "$helm" template leasehold "$chart" --namespace leasehold-system --kube-version "$version" \
    "${values[@]}" > "$out/$name.yaml"
  "$kubeconform" -strict -summary -kubernetes-version "${version#v}" \
    -schema-location "$schemas/{{ .NormalizedKubernetesVersion }}-standalone{{ .StrictSuffix }}/{{ .ResourceKind }}{{ .KindSuffix }}.json" \
    -skip "$skip" "$out/$name.yaml" >&2
  # The same values rendered for the oldest supported release, against its own schemas.
  "$helm" template leasehold "$chart" --namespace leasehold-system --kube-version "$oldest" \
    "${values[@]}" > "$out/$name-oldest.yaml"
  "$kubeconform" -strict -summary -kubernetes-version "${oldest#v}" \
    -schema-location "$oldest_schemas/{{ .NormalizedKubernetesVersion }}-standalone{{ .StrictSuffix }}/{{ .ResourceKind }}{{ .KindSuffix }}.json" \
    -skip "$skip" "$out/$name-oldest.yaml" >&2
done
echo "chart lint: ${#cases[@]} value sets rendered and valid against Kubernetes $version and $oldest (strict)"
