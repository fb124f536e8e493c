#!/bin/sh
# One piece of work under a Leasehold lock with curl, held exactly as long as the work runs.
#
# The acquire is session-bound: the sidecar keeps the lock while curl's connection stays
# open. The work reads the grant (the first line) and then runs; when it is done it
# releases with the owner handle, at once. If the script dies instead, curl's connection
# closes (curl exits at its next write to a gone reader: within a second) and the lock
# goes to the next waiter.
#
# Usage: worker.sh LOCK SECONDS LOGFILE  (appends "start TOKEN NS" and "end TOKEN NS")
set -eu
lock=$1 seconds=$2 logfile=$3
url=${LEASEHOLD_URL:-http://127.0.0.1:7070}

curl -sS -N -X POST "$url/v1/locks/$lock/acquire" -H 'Content-Type: application/json' \
    -d '{"session": true, "waitSeconds": 60}' | {
    IFS= read -r grant
    token=$(printf '%s' "$grant" | jq -er .fencingToken) || { echo "not acquired: $grant" >&2; exit 75; }
    handle=$(printf '%s' "$grant" | jq -r .handle)
    # The grant vouches for remainingMs (the stream's `held` lines say more, for readers
    # that follow them): the work is stopped before that runs out.
    vouched=$(( $(printf '%s' "$grant" | jq -r .remainingMs) / 1000 ))
    echo "start $token $(date +%s%N)" >>"$logfile"
    timeout -s KILL "$vouched" sleep "$seconds" # the work: present $token to what it writes
    echo "end $token $(date +%s%N)" >>"$logfile"
    curl -sS -X POST "$url/v1/locks/$lock/holds/$handle/release" >/dev/null
}
