/** The sidecar's error answers, one class per code a caller may want to tell apart. */

/** An error answer of the sidecar: `{"error": {"code": ..., "message": ...}}`. */
export class SidecarError extends Error {
  constructor(
    readonly lock: string,
    readonly status: number,
    readonly code: string,
    readonly detail: string,
  ) {
    super(`lock ${lock}: ${detail} (${status} ${code})`);
    this.name = new.target.name;
  }
}

/** Not granted within the wait (`timeout`). */
export class LockTimeout extends SidecarError {}
/** Granted, but lost before it could be reported (`lost`): never held. */
export class LostBeforeReported extends SidecarError {}
/** The lock name is not a DNS label (`invalid_lock_name`). */
export class InvalidLockName extends SidecarError {}
/** No DistributedLock of that name in the pod's namespace (`unknown_lock`). */
export class UnknownLock extends SidecarError {}
/** RBAC or the guard refused the claim (`forbidden`). */
export class Forbidden extends SidecarError {}
/** The sidecar is stopping and takes no new holds (`shutting_down`). */
export class ShuttingDown extends SidecarError {}

/** Error codes with a class of their own; every other code is a plain SidecarError. */
export const BY_CODE: Record<string, typeof SidecarError> = {
  timeout: LockTimeout,
  lost: LostBeforeReported,
  invalid_lock_name: InvalidLockName,
  unknown_lock: UnknownLock,
  forbidden: Forbidden,
  shutting_down: ShuttingDown,
};

/** The error an answer's status and body describe. */
export function fromAnswer(lock: string, status: number, body: string): SidecarError {
  let code = "";
  let message = body.trim();
  try {
    const parsed = JSON.parse(body) as { error?: { code?: unknown; message?: unknown } };
    if (typeof parsed.error?.code === "string" && typeof parsed.error.message === "string") {
      code = parsed.error.code;
      message = parsed.error.message;
    }
  } catch {
    // Not JSON: the text is the message.
  }
  const Kind = BY_CODE[code] ?? SidecarError;
  return new Kind(lock, status, code, message);
}
