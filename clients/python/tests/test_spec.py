"""Every path, field, event and error code this client uses is in docs/sidecar-api.yaml."""

import pathlib
import re
import unittest

from leasehold import client, errors

SPEC = pathlib.Path(__file__).resolve().parents[3] / "docs" / "sidecar-api.yaml"
KEY = re.compile(r"^( *)([^ #:'-][^:]*|'[^']*'):(.*)$")


def spec_keys():
    """The document's key paths ("paths./v1/...", "components.schemas.X.properties.f")
    and its `enum: [...]` lists, keyed by the path that holds them."""
    keys, enums, stack, block = set(), {}, [], -1
    for line in SPEC.read_text().splitlines():
        indent = len(line) - len(line.lstrip(" "))
        if not line.strip() or (block >= 0 and indent > block):
            continue
        block = -1
        match = KEY.match(line)
        if not match:
            continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, match[2].strip("'")))
        path = ".".join(name for _, name in stack)
        keys.add(path)
        value = match[3].strip()
        if value == "|":
            block = indent
        if match[2] == "enum" and value.startswith("["):
            enums[path.rsplit(".", 1)[0]] = [v.strip() for v in value.strip("[]").split(",")]
    assert keys, "no keys read from the OpenAPI document"
    return keys, enums


class Spec(unittest.TestCase):
    def test_every_path_this_client_uses_is_in_the_openapi_document(self):
        keys, _ = spec_keys()
        for path in (client.PATH_ACQUIRE, client.PATH_RELEASE_HANDLE):
            self.assertIn(f"paths.{path}.post", keys, f"POST {path} is not in the OpenAPI document")

    def test_every_field_this_client_uses_is_in_the_openapi_document(self):
        keys, _ = spec_keys()
        for schema, fields in client.FIELDS.items():
            for field in fields:
                self.assertIn(f"components.schemas.{schema}.properties.{field}", keys, f"{schema}.{field}")

    def test_every_event_and_error_code_this_client_names_is_in_the_openapi_document(self):
        _, enums = spec_keys()
        events = enums["components.schemas.SessionEvent.properties.event"]
        self.assertLessEqual(set(client.ENDING_EVENTS), set(events), events)
        codes = enums["components.schemas.Error.properties.error.properties.code"]
        self.assertLessEqual(set(errors.BY_CODE), set(codes), codes)


if __name__ == "__main__":
    unittest.main()
