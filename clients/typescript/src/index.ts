/**
 * A client of the Leasehold sidecar's lock API for the app in its pod, on Node's global
 * `fetch`. `acquire` takes a session-bound hold: it lasts while the hold's stream stays
 * open and ends at once when it is released, or when the process dies and the kernel closes
 * the connection. The stream is followed in the background; `held()` reports the hold only
 * while the sidecar has not said it was lost and its deadline on CLOCK_BOOTTIME is ahead of
 * the clock, so a frozen sidecar or a paused process is never told "held" late.
 */
import { boottimeUpperMs, heldAt } from "./clock.js";
import { fromAnswer } from "./errors.js";
import { type Acquired, PATH_ACQUIRE, PATH_RELEASE_HANDLE, type SessionEvent, path, step } from "./protocol.js";

export * from "./errors.js";
export { boottimeUpperMs } from "./clock.js";

export const DEFAULT_URL = "http://127.0.0.1:7070";
export const DEFAULT_WAIT_SECONDS = 30;
const MAX_WAIT_SECONDS = 3600;

export interface AcquireOptions {
  /** How long the sidecar waits for the grant, 0 to 3600 s (0: a try-lock). Default 30. */
  waitSeconds?: number;
  /** Aborts the wait (leaving the queue); once granted, the hold no longer follows it. */
  signal?: AbortSignal;
}

/** The sidecar of this pod: `$LEASEHOLD_URL` (set in every app container) by default. */
export class Client {
  readonly baseUrl: string;

  constructor(baseUrl: string = process.env.LEASEHOLD_URL || DEFAULT_URL) {
    this.baseUrl = baseUrl.replace(/\/+$/, "");
  }

  /** Waits for `lock` and takes a session-bound hold. Rejects with a SidecarError. */
  async acquire(lock: string, options: AcquireOptions = {}): Promise<Hold> {
    const waitSeconds = Math.min(Math.max(options.waitSeconds ?? DEFAULT_WAIT_SECONDS, 0), MAX_WAIT_SECONDS);
    const stream = new AbortController();
    const abort = () => stream.abort(options.signal?.reason);
    options.signal?.throwIfAborted();
    options.signal?.addEventListener("abort", abort, { once: true });
    try {
      const answer = await fetch(this.baseUrl + path(PATH_ACQUIRE, lock), {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ waitSeconds, session: true }),
        signal: stream.signal,
      });
      if (answer.status !== 200 || !answer.body) {
        const text = await answer.text();
        throw fromAnswer(lock, answer.status, text);
      }
      const lines = readLines(answer.body.getReader());
      const first = await lines.next();
      if (first.done) {
        throw new Error(`failed to acquire lock ${lock}: the stream ended before the grant`);
      }
      const grant = JSON.parse(first.value) as Acquired;
      options.signal?.removeEventListener("abort", abort);
      return new Hold(this, lock, grant, lines, stream);
    } catch (error) {
      stream.abort();
      throw error;
    } finally {
      options.signal?.removeEventListener("abort", abort);
    }
  }

  /** @internal */
  async releaseHandle(lock: string, handle: string): Promise<void> {
    const answer = await fetch(this.baseUrl + path(PATH_RELEASE_HANDLE, lock, handle), {
      method: "POST",
      signal: AbortSignal.timeout(30_000),
    });
    const text = await answer.text();
    if (answer.status !== 200) {
      throw fromAnswer(lock, answer.status, text);
    }
  }
}

/** One session-bound hold. Release it with `release()`, or `await using`. */
export class Hold implements AsyncDisposable {
  /** The fencing token: present it to every resource the work writes. */
  readonly token: number;
  readonly handle: string;
  /** Resolves, with why, once the hold is not held any more (an event, the stream ending,
   * a release, or its deadline passing with no renewal word). Never rejects. */
  readonly lost: Promise<string>;
  /** Why the hold is no longer held, once it is not. */
  reason: string | undefined;

  private validUntilMs: number;
  private timer: NodeJS.Timeout | undefined;
  private resolveLost!: (reason: string) => void;
  private releasing: Promise<void> | undefined;

  constructor(
    private readonly client: Client,
    readonly lock: string,
    grant: Acquired,
    lines: AsyncGenerator<string>,
    private readonly stream: AbortController,
  ) {
    this.token = grant.fencingToken;
    this.handle = grant.handle;
    this.validUntilMs = grant.validUntilBoottimeMs;
    this.lost = new Promise((resolve) => (this.resolveLost = resolve));
    this.watchDeadline();
    void this.follow(lines);
  }

  /** True only while no `lost`/`released` word arrived, the stream is open, and
   * CLOCK_BOOTTIME is before the last deadline the sidecar sent (false if unreadable). */
  held(): boolean {
    if (this.reason !== undefined) return false;
    try {
      return heldAt(this.validUntilMs, boottimeUpperMs());
    } catch {
      return false;
    }
  }

  /** Gives the hold back with its owner handle and closes the stream. Idempotent. */
  release(): Promise<void> {
    this.releasing ??= (async () => {
      try {
        await this.client.releaseHandle(this.lock, this.handle);
      } finally {
        this.end("released by its owner");
        this.stream.abort();
      }
    })();
    return this.releasing;
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.release();
  }

  private end(reason: string): void {
    if (this.reason !== undefined) return;
    this.reason = reason;
    clearTimeout(this.timer);
    this.resolveLost(reason);
  }

  private watchDeadline(): void {
    clearTimeout(this.timer);
    if (this.reason !== undefined) return;
    if (!this.held()) {
      this.end("its deadline passed with no renewal word from the sidecar");
      return;
    }
    let left: number;
    try {
      left = this.validUntilMs - boottimeUpperMs();
    } catch {
      left = 0;
    }
    this.timer = setTimeout(() => this.watchDeadline(), Math.max(left, 0) + 1);
    this.timer.unref();
  }

  private async follow(lines: AsyncGenerator<string>): Promise<void> {
    try {
      for await (const line of lines) {
        if (line.trim() === "") continue; // a keep-alive
        const { validUntilMs, ended } = step(JSON.parse(line) as SessionEvent);
        if (ended !== undefined) {
          this.end(ended);
          return;
        }
        if (validUntilMs !== undefined) {
          this.validUntilMs = validUntilMs;
          this.watchDeadline();
        }
      }
      this.end("the session stream ended");
    } catch (error) {
      this.end(`the session stream ended: ${error instanceof Error ? error.message : String(error)}`);
    }
  }
}

/** `new Client(url).acquire(lock, options)`. */
export function acquire(lock: string, options: AcquireOptions & { url?: string } = {}): Promise<Hold> {
  return new Client(options.url).acquire(lock, options);
}

async function* readLines(reader: ReadableStreamDefaultReader<Uint8Array>): AsyncGenerator<string> {
  const decoder = new TextDecoder();
  let buffered = "";
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    buffered += decoder.decode(value, { stream: true });
    let newline: number;
    while ((newline = buffered.indexOf("\n")) >= 0) {
      yield buffered.slice(0, newline);
      buffered = buffered.slice(newline + 1);
    }
  }
  if (buffered !== "") yield buffered;
}
