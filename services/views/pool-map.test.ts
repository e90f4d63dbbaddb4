import { describe, expect, it } from "vitest";
import { PoolMap } from "./pool-map.js";

describe("PoolMap", () => {
  it("maps each listed model to its pool, follows changes and removals", () => {
    const m = new PoolMap();
    m.set("chat", ["a", "b"]);
    m.set("code", ["c"]);
    expect([m.poolOf("a"), m.poolOf("b"), m.poolOf("c"), m.poolOf("z")]).toEqual(["chat", "chat", "code", undefined]);
    m.set("chat", ["b"]);
    expect(m.poolOf("a")).toBeUndefined();
    m.set("code", undefined);
    expect(m.poolOf("c")).toBeUndefined();
    expect(m.names()).toEqual(["chat"]);
    expect(m.modelsOf("chat")).toEqual(["b"]);
    expect(m.modelsOf("code")).toBeUndefined();
  });

  it("gives a model two pools list to the pool whose name sorts first, whatever the order they were set in, and reports the clash", () => {
    const m = new PoolMap();
    m.set("zeta", ["x"]);
    m.set("alpha", ["x", "y"]);
    expect(m.poolOf("x")).toBe("alpha");
    expect(m.conflicts()).toEqual([{ model: "x", pools: ["alpha", "zeta"] }]);
    m.set("alpha", ["y"]);
    expect(m.poolOf("x")).toBe("zeta");
    expect(m.conflicts()).toEqual([]);
  });
});
