#!/bin/sh
# The job, run under `leasehold run`: at most one copy runs at a time, and the completion
# marker makes it idempotent — a second run for the same period (a retried Job, an
# overlapping schedule, a manual trigger) finds the marker and does nothing. The marker is
# a ConfigMap fenced by the lock, so a run whose hold was lost cannot write it.
# Needs: LEASEHOLD_FENCING_TOKEN and LEASEHOLD_LOCK (from leasehold run), kubectl, PERIOD.
set -eu
period=${PERIOD:-$(date -u +%Y-%m-%d)}
marker="report-done-$period"
if kubectl get configmap "$marker" >/dev/null 2>&1; then
  echo "report for $period already done; nothing to do"
  exit 0
fi
echo "building the report for $period with token $LEASEHOLD_FENCING_TOKEN"
# ... the real work goes here ...
kubectl create configmap "$marker" --from-literal=period="$period" --dry-run=client -o yaml |
  kubectl label --local -f - leasehold.dev/fenced-by="${LEASEHOLD_LOCK#*/}" -o yaml |
  kubectl annotate --local -f - leasehold.dev/fencing-token="$LEASEHOLD_FENCING_TOKEN" -o yaml |
  kubectl apply -f -
echo "report for $period done"
