import { describe, expect, it } from "vitest";
import { publishDecision } from "./decision-record.js";

describe("publishDecision - which records go onto DECISIONS", () => {
  const never = () => {
    throw new Error("the budget must not be consulted");
  };
  it("a routed request's record always, without touching the rejection budget", () => {
    for (const outcome of ["completed", "error", "cancelled", "shutdown"] as const) expect(publishDecision({ outcome }, never)).toBe(true);
  });
  it("a rejection within the budget; over it: counted as budget", () => {
    expect(publishDecision({ outcome: "rejected", errorCode: "model_not_found" }, () => true)).toBe(true);
    expect(publishDecision({ outcome: "rejected", errorCode: "rate_limit_exceeded" }, () => false)).toBe("budget");
  });
  it("a path jetroute does not route: never, and the budget is left for the others", () => {
    expect(publishDecision({ outcome: "rejected", errorCode: "unsupported_path" }, never)).toBe("unknown_path");
  });
});
