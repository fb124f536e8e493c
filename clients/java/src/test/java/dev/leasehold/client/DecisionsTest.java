package dev.leasehold.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.CsvSource;
import org.junit.jupiter.api.Test;

/** The pure decisions: is it still held, what a stream line means, which error an answer is. */
class DecisionsTest {
  private final ObjectMapper json = new ObjectMapper();

  @ParameterizedTest
  @CsvSource({"10000, 5000, true", "10000, 9999, true", "10000, 10000, false", "10000, 12000, false", "0, 1, false"})
  void heldOnlyStrictlyBeforeTheBoottimeDeadline(long validUntil, long now, boolean held) {
    assertEquals(held, BootClock.heldAt(validUntil, now));
  }

  @Test
  void aProcUptimeReadingCountsItsResolutionSoItIsNeverBehindTheClock() throws IOException {
    assertEquals(12_345_670 + BootClock.RESOLUTION_MS, BootClock.upperMs("12345.67 54321.00\n"));
    assertEquals(3_000 + BootClock.RESOLUTION_MS, BootClock.upperMs("3.00 1.00"));
    assertThrows(IOException.class, () -> BootClock.upperMs(""));
    assertThrows(IOException.class, () -> BootClock.upperMs("abc 1"));
    assertTrue(BootClock.upperMs() > 0);
  }

  @ParameterizedTest
  @CsvSource(
      delimiter = '|',
      value = {
        "{\"event\": \"held\", \"remainingMs\": 900, \"validUntilBoottimeMs\": 5000} | 5000 |",
        "{\"event\": \"renew-late\", \"validUntilBoottimeMs\": 4000} | 4000 |",
        "{\"event\": \"lost\", \"reason\": \"revoked\", \"validUntilBoottimeMs\": 9000} | 0 | lost: revoked",
        "{\"event\": \"released\", \"reason\": \"released\"} | 0 | released: released",
        "{\"event\": \"lost\"} | 0 | lost: lost",
        "{\"event\": \"lagged\", \"missed\": 3} | 0 |",
      })
  void streamLinesMoveTheDeadlineOrEndTheHold(String line, long validUntil, String ended) throws IOException {
    assertEquals(new Protocol.Step(validUntil, ended), Protocol.step(json.readTree(line)));
  }

  @Test
  void errorAnswersBecomeTypedErrors() {
    SidecarException timeout =
        SidecarException.fromAnswer(json, "orders", 409, "{\"error\": {\"code\": \"timeout\", \"message\": \"not granted within 0s\"}}");
    assertInstanceOf(SidecarException.LockTimeout.class, timeout);
    assertEquals("lock orders: not granted within 0s (409 timeout)", timeout.getMessage());
    assertInstanceOf(
        SidecarException.UnknownLock.class,
        SidecarException.fromAnswer(json, "x", 404, "{\"error\": {\"code\": \"unknown_lock\", \"message\": \"m\"}}"));
    SidecarException other =
        SidecarException.fromAnswer(json, "x", 409, "{\"error\": {\"code\": \"handle_required\", \"message\": \"m\"}}");
    assertEquals(SidecarException.class, other.getClass());
    SidecarException text = SidecarException.fromAnswer(json, "x", 502, "bad gateway");
    assertEquals("", text.code());
    assertEquals("bad gateway", text.detail());
  }
}
