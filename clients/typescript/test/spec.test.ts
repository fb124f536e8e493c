// Every path, field, event and error code this client uses is in docs/sidecar-api.yaml.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import { BY_CODE } from "../src/errors.js";
import { ENDING_EVENTS, FIELDS, PATH_ACQUIRE, PATH_RELEASE_HANDLE } from "../src/protocol.js";

/** The document's key paths ("paths./v1/...", "components.schemas.X.properties.f") and
 * its `enum: [...]` lists, keyed by the path that holds them. */
function specKeys(): { keys: Set<string>; enums: Map<string, string[]> } {
  const text = readFileSync(new URL("../../../../docs/sidecar-api.yaml", import.meta.url), "utf8");
  const key = /^( *)([^ #:'-][^:]*|'[^']*'):(.*)$/;
  const keys = new Set<string>();
  const enums = new Map<string, string[]>();
  const stack: [number, string][] = [];
  let block = -1;
  for (const line of text.split("\n")) {
    const indent = line.length - line.trimStart().length;
    if (line.trim() === "" || (block >= 0 && indent > block)) continue;
    block = -1;
    const match = key.exec(line);
    if (!match) continue;
    while (stack.length > 0 && stack[stack.length - 1][0] >= indent) stack.pop();
    stack.push([indent, match[2].replace(/^'|'$/g, "")]);
    const path = stack.map(([, name]) => name).join(".");
    keys.add(path);
    const value = match[3].trim();
    if (value === "|") block = indent;
    if (match[2] === "enum" && value.startsWith("[")) {
      const values = value.replace(/^\[|\]$/g, "").split(",").map((v) => v.trim());
      enums.set(path.slice(0, path.lastIndexOf(".")), values);
    }
  }
  assert.ok(keys.size > 0, "no keys read from the OpenAPI document");
  return { keys, enums };
}

test("every path this client uses is in the OpenAPI document", () => {
  const { keys } = specKeys();
  for (const path of [PATH_ACQUIRE, PATH_RELEASE_HANDLE]) {
    assert.ok(keys.has(`paths.${path}.post`), `POST ${path} is not in the OpenAPI document`);
  }
});

test("every field this client uses is in the OpenAPI document", () => {
  const { keys } = specKeys();
  for (const [schema, fields] of Object.entries(FIELDS)) {
    for (const field of fields) {
      assert.ok(keys.has(`components.schemas.${schema}.properties.${field}`), `${schema}.${field}`);
    }
  }
});

test("every event and error code this client names is in the OpenAPI document", () => {
  const { enums } = specKeys();
  const events = enums.get("components.schemas.SessionEvent.properties.event") ?? [];
  for (const event of ENDING_EVENTS) assert.ok(events.includes(event), `${event} not in ${events}`);
  const codes = enums.get("components.schemas.Error.properties.error.properties.code") ?? [];
  for (const code of Object.keys(BY_CODE)) assert.ok(codes.includes(code), `${code} not in ${codes}`);
});
