import { readFileSync } from "node:fs";
import path from "node:path";
import { describe, expect, it } from "vitest";
import { renderSchemas, schemaJsonDir } from "./export.js";
import { checkEvent, decodeEvent } from "./validate.js";

const enc = (v: unknown) => new TextEncoder().encode(typeof v === "string" ? v : JSON.stringify(v));

describe("schemas - validators", () => {
  const charge = { type: "charge", id: "r1", gateway: "g", model: "m", pod: "p", ts: 1, ttlMs: 1000, promptTokens: 3 };

  it("accepts a valid event of an allowed type", () => {
    const d = decodeEvent(enc(charge), ["charge", "release"]);
    expect(d.ok).toBe(true);
  });

  it.each([
    ["not JSON", "{", /invalid JSON/],
    ["an array", [], /unexpected event type/],
    ["a type not allowed here", { ...charge, type: "pod" }, /unexpected event type "pod"/],
    ["a missing field", { ...charge, ttlMs: undefined }, /ttlMs/],
    ["a wrong type", { ...charge, promptTokens: "3" }, /promptTokens/],
    ["an unknown field", { ...charge, extra: 1 }, /extra|additional/i],
    ["invalid UTF-8", "\u00ff", /./],
  ])("rejects %s with a reason", (_name, value, reason) => {
    const bytes = typeof value === "string" && value === "\u00ff" ? Uint8Array.of(0xff, 0xfe) : enc(value);
    const d = decodeEvent(bytes, ["charge"]);
    expect(d.ok).toBe(false);
    if (!d.ok) expect(d.reason).toMatch(reason);
  });

  it("checks pod addresses as host:port", () => {
    const pod = { type: "pod", action: "upsert", model: "m", pod: "p", address: "10.0.0.1:8000", ready: true, engine: "vllm", ts: 1 };
    expect(checkEvent("pod", pod).ok).toBe(true);
    expect(checkEvent("pod", { ...pod, address: "10.0.0.1" }).ok).toBe(false);
  });
});

describe("schemas - committed JSON Schema files", () => {
  it("match the TypeBox sources (run `npm run schemas` after changing events.ts)", () => {
    for (const [name, text] of Object.entries(renderSchemas())) {
      expect(readFileSync(path.join(schemaJsonDir(), name), "utf8"), name).toBe(text);
    }
  });
});
