/** The parts of the API this client uses, checked against docs/sidecar-api.yaml by a test. */

export const PATH_ACQUIRE = "/v1/locks/{name}/acquire";
export const PATH_RELEASE_HANDLE = "/v1/locks/{name}/holds/{handle}/release";

/** The fields it sends or reads, by schema. */
export const FIELDS = {
  AcquireRequest: ["waitSeconds", "session"],
  Acquired: ["lock", "fencingToken", "handle", "validUntilBoottimeMs"],
  SessionEvent: ["event", "validUntilBoottimeMs", "reason"],
} as const;

/** Session events that end the hold. */
export const ENDING_EVENTS = ["lost", "released"] as const;

export interface Acquired {
  lock: string;
  fencingToken: number;
  handle: string;
  validUntilBoottimeMs: number;
}

export interface SessionEvent {
  event: string;
  validUntilBoottimeMs?: number;
  reason?: string;
}

/** What one stream line means: a new deadline (ms on CLOCK_BOOTTIME), or why the hold ended. */
export function step(event: SessionEvent): { validUntilMs?: number; ended?: string } {
  if ((ENDING_EVENTS as readonly string[]).includes(event.event)) {
    return { ended: `${event.event}: ${event.reason || event.event}` };
  }
  return event.validUntilBoottimeMs === undefined ? {} : { validUntilMs: event.validUntilBoottimeMs };
}

export function path(template: string, lock: string, handle = ""): string {
  return template
    .replace("{name}", encodeURIComponent(lock))
    .replace("{handle}", encodeURIComponent(handle));
}
