/**
 * CLOCK_BOOTTIME for Node, which has no clock_gettime of it: `/proc/uptime`'s first number
 * is that clock (Linux's uptime_proc_show reads ktime_get_boottime_ts64, so it counts time
 * suspended, as the sidecar's deadlines do), in seconds with two decimals, rounded down.
 */
import { readFileSync } from "node:fs";

/** The resolution of `/proc/uptime`: a reading may be this much behind the clock. */
export const UPTIME_RESOLUTION_MS = 10;

/**
 * The latest CLOCK_BOOTTIME the clock can be at, in ms: the reading plus its resolution, so
 * a deadline compared with it is never counted past. Throws when the clock cannot be read.
 */
export function boottimeUpperMs(uptime: string = readFileSync("/proc/uptime", "utf8")): number {
  const first = uptime.trim().split(/\s+/)[0] ?? "";
  const match = /^(\d+)(?:\.(\d{1,3}))?$/.exec(first);
  if (!match) {
    throw new Error(`unreadable /proc/uptime: ${JSON.stringify(uptime)}`);
  }
  // Integer arithmetic: a float product could round a reading up past the clock.
  const fraction = Number((match[2] ?? "").padEnd(3, "0"));
  return Number(match[1]) * 1000 + fraction + UPTIME_RESOLUTION_MS;
}

/** The "still held?" decision: the deadline is strictly after the latest the clock can be. */
export function heldAt(validUntilMs: number | undefined, nowUpperMs: number): boolean {
  return validUntilMs !== undefined && nowUpperMs < validUntilMs;
}
