package dev.leasehold.client;

import com.fasterxml.jackson.databind.JsonNode;
import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStream;
import java.io.InterruptedIOException;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.TimeUnit;

/** One session-bound hold. Use it in try-with-resources, or call {@link #release()}. */
public final class Hold implements AutoCloseable {
  /** Ends holds whose deadline passes with no renewal word. */
  private static final ScheduledExecutorService DEADLINES =
      Executors.newSingleThreadScheduledExecutor(
          task -> {
            Thread thread = new Thread(task, "leasehold-deadlines");
            thread.setDaemon(true);
            return thread;
          });

  private final LeaseholdClient client;
  private final String lock;
  private final long token;
  private final String handle;
  private final InputStream stream;
  private final CompletableFuture<String> lost = new CompletableFuture<>();
  private volatile long validUntilMs;
  private ScheduledFuture<?> deadline;
  private boolean released;

  Hold(LeaseholdClient client, String lock, JsonNode grant, BufferedReader lines, InputStream stream) {
    this.client = client;
    this.lock = lock;
    this.token = grant.path("fencingToken").asLong();
    this.handle = grant.path("handle").asText();
    this.validUntilMs = grant.path("validUntilBoottimeMs").asLong(0);
    this.stream = stream;
    watchDeadline();
    Thread follower = new Thread(() -> follow(lines), "leasehold-" + lock);
    follower.setDaemon(true);
    follower.start();
  }

  /** The lock's name. */
  public String lock() {
    return lock;
  }

  /** The fencing token: present it to every resource the work writes. */
  public long token() {
    return token;
  }

  /** The owner handle naming this hold. */
  public String handle() {
    return handle;
  }

  /**
   * True only while no {@code lost}/{@code released} word arrived, the stream is open, and
   * CLOCK_BOOTTIME is before the last deadline the sidecar sent (false if the clock is
   * unreadable).
   */
  public boolean held() {
    if (lost.isDone()) {
      return false;
    }
    try {
      return BootClock.heldAt(validUntilMs, BootClock.upperMs());
    } catch (IOException unreadable) {
      return false;
    }
  }

  /**
   * Completes, with why, once the hold is not held any more: an event, the stream ending, a
   * release, or its deadline passing with no renewal word. Never completes exceptionally.
   */
  public CompletableFuture<String> lost() {
    return lost;
  }

  /**
   * Gives the hold back with its owner handle and closes the stream. Idempotent. An interrupt
   * while it waits for the sidecar's answer is an {@link InterruptedIOException} (the thread
   * stays interrupted); the stream is closed all the same, which lets go too.
   */
  public void release() throws SidecarException, IOException {
    synchronized (this) {
      if (released) {
        return;
      }
      released = true;
    }
    try {
      client.releaseHandle(lock, handle);
    } catch (InterruptedException interrupted) {
      Thread.currentThread().interrupt();
      throw new InterruptedIOException("interrupted while releasing lock " + lock);
    } finally {
      end("released by its owner");
      stream.close();
    }
  }

  @Override
  public void close() throws SidecarException, IOException {
    release();
  }

  private void end(String reason) {
    synchronized (this) {
      if (deadline != null) {
        deadline.cancel(false);
      }
    }
    lost.complete(reason);
  }

  private void watchDeadline() {
    long left;
    try {
      left = validUntilMs - BootClock.upperMs();
    } catch (IOException unreadable) {
      left = 0;
    }
    if (!held()) {
      end("its deadline passed with no renewal word from the sidecar");
      return;
    }
    synchronized (this) {
      if (deadline != null) {
        deadline.cancel(false);
      }
      if (!lost.isDone()) {
        deadline = DEADLINES.schedule(this::watchDeadline, Math.max(left, 0) + 1, TimeUnit.MILLISECONDS);
      }
    }
  }

  private void follow(BufferedReader lines) {
    try {
      for (String line; (line = lines.readLine()) != null; ) {
        if (line.isBlank()) {
          continue; // a keep-alive
        }
        Protocol.Step step = Protocol.step(client.json.readTree(line));
        if (step.ended() != null) {
          end(step.ended());
          return;
        }
        if (step.validUntilMs() != 0) {
          validUntilMs = step.validUntilMs();
          watchDeadline();
        }
      }
      end("the session stream ended");
    } catch (IOException error) {
      end("the session stream ended: " + error.getMessage());
    }
  }
}
