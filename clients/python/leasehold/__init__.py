"""A client of the Leasehold sidecar's lock API for the app in its pod. Standard library only.

``acquire`` takes a session-bound hold: it lasts while the hold's stream stays open and ends
at once when it is released, or when the process dies and the kernel closes the connection.
A background thread follows the stream; ``held()`` reports the hold only while the sidecar
has not said it was lost and its deadline on CLOCK_BOOTTIME is ahead of the clock, so a
frozen sidecar or a paused process is never told "held" late.
"""

from .client import Client, Hold, acquire
from .errors import (
    Forbidden,
    InvalidLockName,
    LockTimeout,
    LostBeforeReported,
    ShuttingDown,
    SidecarError,
    UnknownLock,
)

__all__ = [
    "Client",
    "Hold",
    "acquire",
    "SidecarError",
    "LockTimeout",
    "LostBeforeReported",
    "InvalidLockName",
    "UnknownLock",
    "Forbidden",
    "ShuttingDown",
]
