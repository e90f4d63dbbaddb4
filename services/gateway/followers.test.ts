/** The own-echo id read from a charge's bytes, as this gateway serializes it. */
import { describe, expect, it } from "vitest";
import { ownEventId } from "./followers.js";

describe("followers - an own charge's id from its echo, unparsed", () => {
  const marker = (id: string) => `"gateway":${JSON.stringify(id)},`;
  it("reads the id that precedes the gateway marker in a serialized charge", () => {
    const charge = { type: "charge", id: "gw-a-1a2b-17", gateway: "gw-a", model: "m", pod: "p", ts: 1, ttlMs: 1, promptTokens: 3 };
    const bytes = new TextEncoder().encode(JSON.stringify(charge));
    const at = Buffer.from(bytes).indexOf(marker("gw-a"));
    expect(at).toBeGreaterThan(0);
    expect(ownEventId(bytes, at)).toBe("gw-a-1a2b-17");
  });
  it("answers undefined for bytes of another shape, never throws", () => {
    for (const text of ['{"gateway":"gw-a","id":"x"}', '{"type":"charge","idx":"x","gateway":"gw-a",', '"gateway":"gw-a",', `{"id":"${"x".repeat(200)}","gateway":"gw-a",`]) {
      const bytes = new TextEncoder().encode(text);
      const at = Buffer.from(bytes).indexOf(marker("gw-a"));
      expect(ownEventId(bytes, at)).toBeUndefined();
    }
  });
});
