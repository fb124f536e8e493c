#!/usr/bin/env python3
"""One piece of work under a Leasehold lock, held exactly as long as this process needs it.

The acquire is session-bound: the sidecar keeps the lock while this request's connection
stays open, and gives it up the moment the connection closes. A worker that crashes or is
killed closes it by dying, so the next waiter gets the lock within milliseconds. Standard
library only.

Usage: worker.py LOCK SECONDS LOGFILE  (appends "start TOKEN NS" and "end TOKEN NS")
"""

import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request

SIDECAR = os.environ.get("LEASEHOLD_URL", "http://127.0.0.1:7070")


def boottime():
    """Seconds since boot on CLOCK_BOOTTIME, the clock the sidecar's deadlines are on."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


class Hold:
    """What the sidecar last said about our hold."""

    def __init__(self, grant):
        self.token = grant["fencingToken"]
        self.handle = grant["handle"]
        # The deadline on the boot clock (the same in every container of the pod): unlike
        # remainingMs it does not stretch while an answer is in transit.
        self.valid_until = grant["validUntilBoottimeMs"] / 1000
        self.ended = None

    def held(self):
        # Act only within the time the sidecar last vouched for (a frozen sidecar stops
        # vouching), and never after it said the hold was lost.
        return self.ended is None and boottime() < self.valid_until

    def follow(self, session):
        """Reads the session's lines: `held` every second, `lost`/`released` at the end."""
        try:
            for line in session:
                if not line.strip():
                    continue
                event = json.loads(line)
                if "validUntilBoottimeMs" in event:
                    self.valid_until = event["validUntilBoottimeMs"] / 1000
                if event["event"] in ("lost", "released"):
                    self.ended = event.get("reason", event["event"])
                    return
        except (OSError, ValueError):
            self.ended = "the session ended"


def main():
    lock, seconds, logfile = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    request = urllib.request.Request(
        f"{SIDECAR}/v1/locks/{lock}/acquire",
        data=json.dumps({"session": True, "waitSeconds": 60}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        session = urllib.request.urlopen(request, timeout=90)
    except urllib.error.HTTPError as error:
        sys.exit(f"not acquired: {json.load(error)['error']['message']}")
    with session:  # the lock is ours while this connection is open
        hold = Hold(json.loads(session.readline()))
        threading.Thread(target=hold.follow, args=(session,), daemon=True).start()
        with open(logfile, "a") as log:
            log.write(f"start {hold.token} {time.time_ns()}\n")
            log.flush()
            done = time.monotonic() + seconds
            while time.monotonic() < done:
                if not hold.held():
                    sys.exit(f"lost the lock ({hold.ended or 'no word from the sidecar in time'}); stopping")
                time.sleep(0.05)  # a step of the work: present hold.token to what it writes
            log.write(f"end {hold.token} {time.time_ns()}\n")
        # Done: give the lock back now (closing the connection would too, once noticed).
        release = f"{SIDECAR}/v1/locks/{lock}/holds/{hold.handle}/release"
        urllib.request.urlopen(urllib.request.Request(release, method="POST"), timeout=30).close()


if __name__ == "__main__":
    main()
