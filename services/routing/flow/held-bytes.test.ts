import { describe, expect, it } from "vitest";
import { BYTES_PER_TOKEN, HELD_OVERHEAD_BYTES, heldBytesOf } from "./held-bytes.js";

describe("held bytes", () => {
  const MiB = 1024 * 1024;
  it("an ASCII body counts twice (the Buffer and the parsed JSON's one-byte strings), plus the fixed part", () => {
    expect(heldBytesOf({ bodyBytes: 4 * MiB, textChars: 4 * MiB })).toBe(HELD_OVERHEAD_BYTES + 8 * MiB);
    expect(heldBytesOf({ bodyBytes: 4 * MiB })).toBe(HELD_OVERHEAD_BYTES + 8 * MiB);
  });

  it("multi-byte text counts two bytes per character of the parse (V8's two-byte strings)", () => {
    // 3-byte UTF-8 characters: 4 MiB of body, 4/3 Mi characters, 8/3 MiB of strings.
    const chars = Math.floor((4 * MiB) / 3);
    expect(heldBytesOf({ bodyBytes: 4 * MiB, textChars: chars })).toBe(HELD_OVERHEAD_BYTES + 4 * MiB + 2 * chars);
  });

  it("a salted copy and token ids count on top", () => {
    expect(heldBytesOf({ bodyBytes: 1_000, textChars: 1_000, upstreamBytes: 1_030, tokens: 250 })).toBe(HELD_OVERHEAD_BYTES + 2_000 + 1_030 + 250 * BYTES_PER_TOKEN);
  });

  it("token ids count 4 bytes each (the router's Uint32Array); a prompt sent as ids also 8 bytes each for the parsed body's array", () => {
    expect(BYTES_PER_TOKEN).toBe(Uint32Array.BYTES_PER_ELEMENT);
    expect(heldBytesOf({ bodyBytes: 1_000, tokens: 250, bodyTokenIds: 250 })).toBe(HELD_OVERHEAD_BYTES + 2_000 + 250 * 4 + 250 * 8);
  });
});
