import { describe, expect, it } from "vitest";
import { parseWindowBound } from "./window.js";

const NOW = Date.parse("2026-12-01T12:00:00Z");

describe("replay window - --from/--to", () => {
  it.each([
    ["now", { kind: "time", ms: NOW }],
    ["-15m", { kind: "time", ms: NOW - 900_000 }],
    ["-2h", { kind: "time", ms: NOW - 7_200_000 }],
    ["-1.5s", { kind: "time", ms: NOW - 1_500 }],
    ["2026-12-01T10:00:00Z", { kind: "time", ms: Date.parse("2026-12-01T10:00:00Z") }],
    ["1764583200000", { kind: "time", ms: 1764583200000 }],
    ["seq:42", { kind: "seq", seq: 42 }],
  ])("%s", (text, want) => {
    expect(parseWindowBound(text, NOW)).toEqual(want);
  });

  it.each(["yesterday", "seq:0", "seq:x", "12345", "-5y"])("refuses %s with a message saying what is accepted", (text) => {
    expect(() => parseWindowBound(text, NOW)).toThrow(/seq:|time/);
  });
});
