"""The pure decisions: is it still held, what a stream line means, which error an answer is."""

import unittest

from leasehold import LockTimeout, SidecarError, UnknownLock
from leasehold.client import held_at, step
from leasehold.errors import from_answer


class Decisions(unittest.TestCase):
    def test_held_only_strictly_before_the_boottime_deadline(self):
        for valid_until_ms, now_ns, held in [
            (10_000, 5_000_000_000, True),
            (10_000, 9_999_999_999, True),
            (10_000, 10_000_000_000, False),  # at the deadline: no longer
            (10_000, 12_000_000_000, False),
            (None, 1, False),  # no deadline known
        ]:
            with self.subTest(valid_until_ms=valid_until_ms, now_ns=now_ns):
                self.assertIs(held_at(valid_until_ms, now_ns), held)

    def test_stream_lines_move_the_deadline_or_end_the_hold(self):
        for event, result in [
            ({"event": "held", "remainingMs": 900, "validUntilBoottimeMs": 5000}, (5000, None)),
            ({"event": "renew-late", "validUntilBoottimeMs": 4000}, (4000, None)),
            ({"event": "lost", "reason": "revoked", "validUntilBoottimeMs": 9000}, (None, "lost: revoked")),
            ({"event": "released", "reason": "released"}, (None, "released: released")),
            ({"event": "lost"}, (None, "lost: lost")),
            ({"event": "lagged", "missed": 3}, (None, None)),
        ]:
            with self.subTest(event=event):
                self.assertEqual(step(event), result)

    def test_error_answers_become_typed_errors(self):
        for status, body, kind, code in [
            (409, b'{"error": {"code": "timeout", "message": "not granted within 0s"}}', LockTimeout, "timeout"),
            (404, b'{"error": {"code": "unknown_lock", "message": "no lock x"}}', UnknownLock, "unknown_lock"),
            (409, b'{"error": {"code": "handle_required", "message": "m"}}', SidecarError, "handle_required"),
            (502, b"bad gateway", SidecarError, ""),
        ]:
            with self.subTest(code=code):
                error = from_answer("orders", status, body)
                self.assertIs(type(error), kind)
                self.assertEqual((error.code, error.status), (code, status))
                self.assertIn("orders", str(error))


if __name__ == "__main__":
    unittest.main()
