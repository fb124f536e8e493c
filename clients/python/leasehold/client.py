"""Acquire, follow and release a session-bound hold."""

import http.client
import json
import os
import socket
import threading
import time
import urllib.parse

from .errors import from_answer

DEFAULT_URL = "http://127.0.0.1:7070"
DEFAULT_WAIT = 30.0
MAX_WAIT = 3600.0

# The API paths this client uses (checked against docs/sidecar-api.yaml by a test).
PATH_ACQUIRE = "/v1/locks/{name}/acquire"
PATH_RELEASE_HANDLE = "/v1/locks/{name}/holds/{handle}/release"

# The fields it reads or sends, by schema (checked likewise).
FIELDS = {
    "AcquireRequest": ("waitSeconds", "session"),
    "Acquired": ("lock", "fencingToken", "handle", "validUntilBoottimeMs"),
    "SessionEvent": ("event", "validUntilBoottimeMs", "reason"),
}
ENDING_EVENTS = ("lost", "released")


def boottime_ns():
    """CLOCK_BOOTTIME (counts time suspended, like the sidecar's deadlines), in ns."""
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME)


def held_at(valid_until_ms, now_ns):
    """The "still held?" decision: the deadline (ms) is strictly after the clock (ns)."""
    return valid_until_ms is not None and now_ns < valid_until_ms * 1_000_000


def step(event):
    """What one stream line means: (new deadline in ms or None, why it ended or None)."""
    name = event.get("event")
    if name in ENDING_EVENTS:
        return None, f"{name}: {event.get('reason') or name}"
    return event.get("validUntilBoottimeMs"), None


class Client:
    """The sidecar of this pod: ``$LEASEHOLD_URL`` (set in every app container) by default."""

    def __init__(self, url=None):
        parsed = urllib.parse.urlsplit(url or os.environ.get("LEASEHOLD_URL") or DEFAULT_URL)
        if parsed.scheme != "http" or not parsed.hostname:
            raise ValueError(f"the sidecar URL must be http://HOST:PORT, not {url!r}")
        self.host, self.port = parsed.hostname, parsed.port or 80

    def acquire(self, lock, wait=DEFAULT_WAIT):
        """Waits up to ``wait`` seconds for ``lock`` and returns its session-bound Hold.

        Raises a SidecarError (LockTimeout when not granted in time)."""
        wait = min(max(float(wait), 0.0), MAX_WAIT)
        body = json.dumps({"waitSeconds": wait, "session": True}).encode()
        # The socket's timeout covers the wait; once granted, the stream is read without
        # one (held() goes by the clock, not by the reads).
        conn = http.client.HTTPConnection(self.host, self.port, timeout=wait + 30)
        try:
            conn.request("POST", self._path(PATH_ACQUIRE, lock), body, {"Content-Type": "application/json"})
            answer = conn.getresponse()
            if answer.status != 200:
                raise from_answer(lock, answer.status, answer.read())
            grant = json.loads(answer.readline())
            conn.sock.settimeout(None)
        except BaseException:
            conn.close()
            raise
        return Hold(self, lock, grant, conn, answer)

    def _release(self, lock, handle):
        conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        try:
            conn.request("POST", self._path(PATH_RELEASE_HANDLE, lock, handle))
            answer = conn.getresponse()
            body = answer.read()
            if answer.status != 200:
                raise from_answer(lock, answer.status, body)
        finally:
            conn.close()

    @staticmethod
    def _path(template, lock, handle=""):
        quote = lambda s: urllib.parse.quote(s, safe="")  # noqa: E731
        return template.replace("{name}", quote(lock)).replace("{handle}", quote(handle))


class Hold:
    """One session-bound hold. Use it in a ``with`` block, or call ``release()``."""

    def __init__(self, client, lock, grant, conn, answer):
        self.lock = lock
        self.token = grant["fencingToken"]
        """The fencing token: present it to every resource the work writes."""
        self.handle = grant["handle"]
        self.reason = None
        """Why the hold is no longer held, once it is not."""
        self._client, self._conn, self._answer = client, conn, answer
        self._valid_until_ms = grant["validUntilBoottimeMs"]
        self._ended = threading.Event()
        self._changed = threading.Condition()
        self._released = False
        threading.Thread(target=self._follow, name=f"leasehold-{lock}", daemon=True).start()

    def held(self):
        """True only while no `lost`/`released` word arrived, the stream is open, and
        CLOCK_BOOTTIME is before the last deadline the sidecar sent."""
        return not self._ended.is_set() and held_at(self._valid_until_ms, boottime_ns())

    def wait_lost(self, timeout=None):
        """Blocks until the hold is not held any more (an event, the stream ending, or its
        deadline passing in silence), or ``timeout`` seconds; returns whether it was lost."""
        give_up = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            while self.held():
                left = (self._valid_until_ms * 1_000_000 - boottime_ns()) / 1e9
                if give_up is not None:
                    if time.monotonic() >= give_up:
                        return False
                    left = min(left, give_up - time.monotonic())
                self._changed.wait(max(left, 0) + 0.001)
        if self.reason is None:
            self._end("its deadline passed with no renewal word from the sidecar")
        return True

    def release(self):
        """Gives the hold back with its owner handle and closes the stream. Idempotent."""
        if self._released:
            return
        self._released = True
        try:
            self._client._release(self.lock, self.handle)
        finally:
            self._end("released by its owner")
            self._close()

    close = release

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    def _end(self, reason):
        with self._changed:
            if not self._ended.is_set():
                self.reason = reason
                self._ended.set()
            self._changed.notify_all()

    def _close(self):
        # Shut the socket down first: closing it alone may not wake the reading thread.
        sock = self._conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._answer.close()
        self._conn.close()

    def _follow(self):
        try:
            for line in self._answer:
                if not line.strip():
                    continue  # a keep-alive
                deadline, ended = step(json.loads(line))
                if ended:
                    self._end(ended)
                    return
                if deadline is not None:
                    with self._changed:
                        self._valid_until_ms = deadline
                        self._changed.notify_all()
            self._end("the session stream ended")
        except (OSError, ValueError, http.client.HTTPException) as error:
            self._end(f"the session stream ended: {error}")


def acquire(lock, wait=DEFAULT_WAIT, url=None):
    """``Client(url).acquire(lock, wait)``."""
    return Client(url).acquire(lock, wait)
