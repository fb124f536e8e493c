package dev.leasehold.client.examples;

import dev.leasehold.client.Hold;
import dev.leasehold.client.LeaseholdClient;
import dev.leasehold.client.SidecarException;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.time.Duration;

/**
 * Takes a session-bound hold on a lock and answers commands on stdin, one a line: {@code held}
 * prints whether it is still held, {@code await-loss} waits until it is not (and says why),
 * {@code release} releases it and exits. End of input exits without releasing (the process's
 * end lets go). A refused acquire prints {@code error CODE} and exits 3.
 *
 * <p>Usage: {@code java -cp ... dev.leasehold.client.examples.Contend LOCK WAIT_SECONDS} (the
 * sidecar at $LEASEHOLD_URL)
 */
public final class Contend {
  private Contend() {}

  public static void main(String[] args) throws Exception {
    Duration wait = Duration.ofMillis(Math.round(Double.parseDouble(args[1]) * 1000));
    Hold hold;
    try {
      hold = LeaseholdClient.fromEnvironment().acquire(args[0], wait);
    } catch (SidecarException refused) {
      System.out.println("error " + refused.code());
      System.exit(3);
      return;
    }
    System.out.println("granted " + hold.token() + " " + hold.held());
    BufferedReader commands = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
    for (String command; (command = commands.readLine()) != null; ) {
      switch (command) {
        case "held" -> System.out.println("held " + hold.held());
        case "await-loss" -> {
          String reason = hold.lost().join();
          System.out.println("lost " + hold.held() + " " + reason);
        }
        case "release" -> {
          hold.release();
          System.out.println("released " + hold.held());
          System.exit(0);
        }
        default -> {
          System.err.println("unknown command \"" + command + "\"");
          System.exit(2);
        }
      }
    }
    System.exit(0);
  }
}
