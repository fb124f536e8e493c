"""The sidecar's error answers, one class per code a caller may want to tell apart."""

import json


class SidecarError(Exception):
    """An error answer of the sidecar: ``{"error": {"code": ..., "message": ...}}``."""

    def __init__(self, lock, status, code, message):
        super().__init__(f"lock {lock}: {message} ({status} {code})")
        self.lock, self.status, self.code, self.message = lock, status, code, message


class LockTimeout(SidecarError):
    """Not granted within the wait (``timeout``)."""


class LostBeforeReported(SidecarError):
    """Granted, but lost before it could be reported (``lost``): never held."""


class InvalidLockName(SidecarError):
    """The lock name is not a DNS label (``invalid_lock_name``)."""


class UnknownLock(SidecarError):
    """No DistributedLock of that name in the pod's namespace (``unknown_lock``)."""


class Forbidden(SidecarError):
    """RBAC or the guard refused the claim (``forbidden``)."""


class ShuttingDown(SidecarError):
    """The sidecar is stopping and takes no new holds (``shutting_down``)."""


# Error codes with a class of their own; every other code is a plain SidecarError.
BY_CODE = {
    "timeout": LockTimeout,
    "lost": LostBeforeReported,
    "invalid_lock_name": InvalidLockName,
    "unknown_lock": UnknownLock,
    "forbidden": Forbidden,
    "shutting_down": ShuttingDown,
}


def from_answer(lock, status, body):
    """The error an answer's status and body (bytes) describe."""
    try:
        error = json.loads(body)["error"]
        code, message = error["code"], error["message"]
    except (ValueError, KeyError, TypeError):
        code, message = "", body.decode("utf-8", "replace").strip()
    return BY_CODE.get(code, SidecarError)(lock, status, code, message)
