package dev.leasehold.client;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStream;
import java.io.InputStreamReader;
import java.net.URI;
import java.net.URLEncoder;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Map;

/**
 * A client of the Leasehold sidecar's lock API for the app in its pod, on {@code
 * java.net.http}. {@link #acquire} takes a session-bound hold: it lasts while the hold's
 * stream stays open and ends at once when it is released, or when the process dies and the
 * kernel closes the connection. The stream is followed by a background thread; {@link
 * Hold#held()} reports the hold only while the sidecar has not said it was lost and its
 * deadline on CLOCK_BOOTTIME is ahead of the clock, so a frozen sidecar or a paused process is
 * never told "held" late.
 */
public final class LeaseholdClient {
  public static final String DEFAULT_URL = "http://127.0.0.1:7070";
  public static final Duration DEFAULT_WAIT = Duration.ofSeconds(30);
  private static final Duration MAX_WAIT = Duration.ofSeconds(3600);

  private final String baseUrl;
  private final HttpClient http;
  final ObjectMapper json = new ObjectMapper();

  /** The sidecar at {@code baseUrl}, such as {@code http://127.0.0.1:7070}. */
  public LeaseholdClient(String baseUrl) {
    this.baseUrl = baseUrl.replaceAll("/+$", "");
    // HTTP/1.1: the session is one connection, and the sidecar speaks nothing else.
    this.http = HttpClient.newBuilder().version(HttpClient.Version.HTTP_1_1).build();
  }

  /** The sidecar of this pod: {@code $LEASEHOLD_URL} (set in every app container). */
  public static LeaseholdClient fromEnvironment() {
    String url = System.getenv("LEASEHOLD_URL");
    return new LeaseholdClient(url == null || url.isEmpty() ? DEFAULT_URL : url);
  }

  /** {@link #acquire(String, Duration)} with the default wait (30 s). */
  public Hold acquire(String lock) throws SidecarException, IOException, InterruptedException {
    return acquire(lock, DEFAULT_WAIT);
  }

  /**
   * Waits up to {@code wait} (0 to 3600 s; 0 is a try-lock) for {@code lock} and takes a
   * session-bound hold. Interrupting the thread while it waits leaves the queue.
   *
   * @throws SidecarException an error answer, such as {@link SidecarException.LockTimeout}
   */
  public Hold acquire(String lock, Duration wait)
      throws SidecarException, IOException, InterruptedException {
    Duration bounded = wait.isNegative() ? Duration.ZERO : wait.compareTo(MAX_WAIT) > 0 ? MAX_WAIT : wait;
    String body =
        json.writeValueAsString(Map.of("waitSeconds", bounded.toMillis() / 1000.0, "session", true));
    HttpRequest request =
        HttpRequest.newBuilder(uri(Protocol.PATH_ACQUIRE, lock, ""))
            .timeout(bounded.plusSeconds(30)) // until the answer's headers, not the stream
            .header("Content-Type", "application/json")
            .POST(HttpRequest.BodyPublishers.ofString(body))
            .build();
    HttpResponse<InputStream> answer = http.send(request, HttpResponse.BodyHandlers.ofInputStream());
    InputStream stream = answer.body();
    try {
      if (answer.statusCode() != 200) {
        String text = new String(stream.readAllBytes(), StandardCharsets.UTF_8);
        throw SidecarException.fromAnswer(json, lock, answer.statusCode(), text);
      }
      BufferedReader lines =
          new BufferedReader(new InputStreamReader(stream, StandardCharsets.UTF_8));
      String first = lines.readLine();
      if (first == null) {
        throw new IOException("failed to acquire lock " + lock + ": the stream ended before the grant");
      }
      JsonNode grant = json.readTree(first);
      return new Hold(this, lock, grant, lines, stream);
    } catch (SidecarException | IOException | RuntimeException error) {
      stream.close();
      throw error;
    }
  }

  void releaseHandle(String lock, String handle)
      throws SidecarException, IOException, InterruptedException {
    HttpRequest request =
        HttpRequest.newBuilder(uri(Protocol.PATH_RELEASE_HANDLE, lock, handle))
            .timeout(Duration.ofSeconds(30))
            .POST(HttpRequest.BodyPublishers.noBody())
            .build();
    HttpResponse<String> answer = http.send(request, HttpResponse.BodyHandlers.ofString());
    if (answer.statusCode() != 200) {
      throw SidecarException.fromAnswer(json, lock, answer.statusCode(), answer.body());
    }
  }

  private URI uri(String template, String lock, String handle) {
    String path =
        template
            .replace("{name}", URLEncoder.encode(lock, StandardCharsets.UTF_8))
            .replace("{handle}", URLEncoder.encode(handle, StandardCharsets.UTF_8));
    return URI.create(baseUrl + path);
  }
}
