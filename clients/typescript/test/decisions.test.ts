// The pure decisions: is it still held, what a stream line means, which error an answer is.
import assert from "node:assert/strict";
import { test } from "node:test";

import { UPTIME_RESOLUTION_MS, boottimeUpperMs, heldAt } from "../src/clock.js";
import { LockTimeout, SidecarError, UnknownLock, fromAnswer } from "../src/errors.js";
import { step } from "../src/protocol.js";

test("held only strictly before the boottime deadline", () => {
  const cases: [number | undefined, number, boolean][] = [
    [10_000, 5_000, true],
    [10_000, 9_999, true],
    [10_000, 10_000, false],
    [10_000, 12_000, false],
    [undefined, 1, false],
  ];
  for (const [validUntil, now, held] of cases) {
    assert.equal(heldAt(validUntil, now), held, `heldAt(${validUntil}, ${now})`);
  }
});

test("a /proc/uptime reading counts its resolution, so it is never behind the clock", () => {
  assert.equal(boottimeUpperMs("12345.67 54321.00\n"), 12_345_670 + UPTIME_RESOLUTION_MS);
  assert.equal(boottimeUpperMs("3.00 1.00"), 3_000 + UPTIME_RESOLUTION_MS);
  assert.throws(() => boottimeUpperMs(""), /unreadable/);
  assert.throws(() => boottimeUpperMs("abc 1"), /unreadable/);
});

test("the live /proc/uptime reads", () => {
  assert.ok(boottimeUpperMs() > 0);
});

test("stream lines move the deadline or end the hold", () => {
  assert.deepEqual(step({ event: "held", validUntilBoottimeMs: 5000 }), { validUntilMs: 5000 });
  assert.deepEqual(step({ event: "renew-late", validUntilBoottimeMs: 4000 }), { validUntilMs: 4000 });
  assert.deepEqual(step({ event: "lost", reason: "revoked", validUntilBoottimeMs: 9000 }), { ended: "lost: revoked" });
  assert.deepEqual(step({ event: "released", reason: "released" }), { ended: "released: released" });
  assert.deepEqual(step({ event: "lost" }), { ended: "lost: lost" });
  assert.deepEqual(step({ event: "lagged" }), {});
});

test("error answers become typed errors", () => {
  const timeout = fromAnswer("orders", 409, '{"error": {"code": "timeout", "message": "not granted within 0s"}}');
  assert.ok(timeout instanceof LockTimeout && timeout.code === "timeout" && timeout.status === 409);
  assert.match(timeout.message, /lock orders: not granted within 0s/);
  assert.ok(fromAnswer("x", 404, '{"error": {"code": "unknown_lock", "message": "m"}}') instanceof UnknownLock);
  const other = fromAnswer("x", 409, '{"error": {"code": "handle_required", "message": "m"}}');
  assert.equal(other.constructor, SidecarError);
  const text = fromAnswer("x", 502, "bad gateway");
  assert.equal(text.code, "");
  assert.equal(text.detail, "bad gateway");
});
