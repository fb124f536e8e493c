#!/usr/bin/env python3
"""Takes a session-bound hold on a lock and answers commands on stdin, one a line: `held`
prints whether it is still held, `await-loss` waits until it is not (and says why),
`release` releases it and exits. End of input exits without releasing (the process's end
lets go). A refused acquire prints `error CODE` and exits 3.

Usage: contend.py LOCK WAIT_SECONDS  (the sidecar at $LEASEHOLD_URL)
"""

import sys

import leasehold


def say(line):
    print(line, flush=True)


def main():
    lock, wait = sys.argv[1], float(sys.argv[2])
    try:
        hold = leasehold.acquire(lock, wait=wait)
    except leasehold.SidecarError as error:
        say(f"error {error.code}")
        sys.exit(3)
    say(f"granted {hold.token} {str(hold.held()).lower()}")
    for command in sys.stdin:
        command = command.strip()
        if command == "held":
            say(f"held {str(hold.held()).lower()}")
        elif command == "await-loss":
            hold.wait_lost()
            say(f"lost {str(hold.held()).lower()} {hold.reason}")
        elif command == "release":
            hold.release()
            say(f"released {str(hold.held()).lower()}")
            return
        else:
            sys.exit(f"unknown command {command!r}")


if __name__ == "__main__":
    main()
