import { describe, expect, it } from "vitest";
import { modelsVisibleTo } from "./api-keys.js";

describe("GET /v1/models as a key sees it", () => {
  it("a key restricted by models sees only those (adapters included by name); an unrestricted one everything", () => {
    const served = ["team-a/model", "team-a/lora", "team-b/private-model"];
    expect(modelsVisibleTo(served, ["team-a/model", "team-a/lora", "not-served"])).toEqual(["team-a/model", "team-a/lora"]);
    expect(modelsVisibleTo(served, undefined)).toEqual(served);
    expect(modelsVisibleTo(served, [])).toEqual([]);
  });
});
