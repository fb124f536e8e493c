package dev.leasehold.client;

import com.fasterxml.jackson.databind.JsonNode;
import java.util.List;
import java.util.Map;

/** The parts of the API this client uses, checked against docs/sidecar-api.yaml by a test. */
final class Protocol {
  static final String PATH_ACQUIRE = "/v1/locks/{name}/acquire";
  static final String PATH_RELEASE_HANDLE = "/v1/locks/{name}/holds/{handle}/release";

  /** The fields it sends or reads, by schema. */
  static final Map<String, List<String>> FIELDS =
      Map.of(
          "AcquireRequest", List.of("waitSeconds", "session"),
          "Acquired", List.of("lock", "fencingToken", "handle", "validUntilBoottimeMs"),
          "SessionEvent", List.of("event", "validUntilBoottimeMs", "reason"));

  /** Session events that end the hold. */
  static final List<String> ENDING_EVENTS = List.of("lost", "released");

  private Protocol() {}

  /** What one stream line means: a new deadline (ms on CLOCK_BOOTTIME, 0: unchanged) or, when
   * the hold ended, why (else null). */
  record Step(long validUntilMs, String ended) {}

  static Step step(JsonNode event) {
    String name = event.path("event").asText();
    if (ENDING_EVENTS.contains(name)) {
      String reason = event.path("reason").asText("");
      return new Step(0, name + ": " + (reason.isEmpty() ? name : reason));
    }
    return new Step(event.path("validUntilBoottimeMs").asLong(0), null);
  }
}
