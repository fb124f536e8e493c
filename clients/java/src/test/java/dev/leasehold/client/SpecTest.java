package dev.leasehold.client;

import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.dataformat.yaml.YAMLFactory;
import java.io.IOException;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.Test;

/** Every path, field, event and error code this client uses is in docs/sidecar-api.yaml. */
class SpecTest {
  private static JsonNode spec() throws IOException {
    return new ObjectMapper(new YAMLFactory()).readTree(Path.of("../../docs/sidecar-api.yaml").toFile());
  }

  private static List<String> values(JsonNode list) {
    List<String> out = new ArrayList<>();
    list.forEach(v -> out.add(v.asText()));
    return out;
  }

  @Test
  void everyPathThisClientUsesIsInTheOpenApiDocument() throws IOException {
    JsonNode paths = spec().path("paths");
    for (String path : List.of(Protocol.PATH_ACQUIRE, Protocol.PATH_RELEASE_HANDLE)) {
      assertTrue(paths.path(path).has("post"), "POST " + path + " is not in the OpenAPI document");
    }
  }

  @Test
  void everyFieldThisClientUsesIsInTheOpenApiDocument() throws IOException {
    JsonNode schemas = spec().path("components").path("schemas");
    Protocol.FIELDS.forEach(
        (schema, fields) -> {
          for (String field : fields) {
            assertTrue(schemas.path(schema).path("properties").has(field), schema + "." + field);
          }
        });
  }

  @Test
  void everyEventAndErrorCodeThisClientNamesIsInTheOpenApiDocument() throws IOException {
    JsonNode schemas = spec().path("components").path("schemas");
    List<String> events = values(schemas.at("/SessionEvent/properties/event/enum"));
    assertTrue(events.containsAll(Protocol.ENDING_EVENTS), events.toString());
    List<String> codes = values(schemas.at("/Error/properties/error/properties/code/enum"));
    assertTrue(codes.containsAll(SidecarException.BY_CODE.keySet()), codes.toString());
  }
}
