package dev.leasehold.client;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * CLOCK_BOOTTIME for Java, which has no clock_gettime of it: {@code /proc/uptime}'s first
 * number is that clock (Linux's uptime_proc_show reads ktime_get_boottime_ts64, so it counts
 * time suspended, as the sidecar's deadlines do), in seconds with two decimals, rounded down.
 * {@code System.nanoTime} is CLOCK_MONOTONIC, which stops during suspend: it would let a
 * deadline be counted past.
 */
public final class BootClock {
  /** The resolution of {@code /proc/uptime}: a reading may be this much behind the clock. */
  static final long RESOLUTION_MS = 10;

  private static final Pattern UPTIME = Pattern.compile("^(\\d+)(?:\\.(\\d{1,3}))?$");

  private BootClock() {}

  /**
   * The latest CLOCK_BOOTTIME the clock can be at, in ms: the reading plus its resolution, so
   * a deadline compared with it is never counted past.
   */
  public static long upperMs() throws IOException {
    return upperMs(Files.readString(Path.of("/proc/uptime")));
  }

  static long upperMs(String uptime) throws IOException {
    String first = uptime.strip().split("\\s+")[0];
    Matcher m = UPTIME.matcher(first);
    if (!m.matches()) {
      throw new IOException("unreadable /proc/uptime: \"" + uptime.strip() + "\"");
    }
    String fraction = m.group(2) == null ? "" : m.group(2);
    long ms = Long.parseLong((fraction + "000").substring(0, 3));
    return Long.parseLong(m.group(1)) * 1000 + ms + RESOLUTION_MS;
  }

  /** The "still held?" decision: the deadline is strictly after the latest the clock can be. */
  static boolean heldAt(long validUntilMs, long nowUpperMs) {
    return validUntilMs > 0 && nowUpperMs < validUntilMs;
  }
}
