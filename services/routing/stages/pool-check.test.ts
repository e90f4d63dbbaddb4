import { describe, expect, it } from "vitest";
import { PoolMap } from "../../views/pool-map.js";
import { misdirected } from "./pool-check.js";

const pools = new PoolMap();
pools.set("chat", ["m-chat"]);
pools.set("code", ["m-code"]);
const views = (known: string[]) => ({ pods: { knows: (m: string) => known.includes(m) }, pools });

describe("pool check", () => {
  it("a pooled gateway routes what its pods serve (adapters included) and its listed models, whatever the config says", () => {
    expect(misdirected("m-chat", { pool: "chat" }, views([]))).toBeUndefined();
    expect(misdirected("sql-lora", { pool: "chat" }, views(["sql-lora"]))).toBeUndefined();
    expect(misdirected("m-code", { pool: "chat", models: new Set(["m-code"]) }, views([]))).toBeUndefined();
  });

  it("another pool's model gets 421 wrong_pool naming that pool in the message and the header", () => {
    const e = misdirected("m-code", { pool: "chat" }, views(["m-chat"]));
    expect(e?.status).toBe(421);
    expect(e?.code).toBe("wrong_pool");
    expect(e?.param).toBe("model");
    expect(e?.headers).toEqual({ "x-jetroute-pool": "code" });
    expect(e?.message).toContain("pool `code`");
    expect(e?.message).toContain("pool chat");
  });

  it("an unpooled gateway sends pooled models to their pool and leaves the rest to the usual answers", () => {
    expect(misdirected("m-chat", {}, views([]))?.headers).toEqual({ "x-jetroute-pool": "chat" });
    expect(misdirected("free", {}, views([]))).toBeUndefined();
  });

  it("a pooled gateway answers 404 for a model no pool lists, naming its own pool", () => {
    const e = misdirected("free", { pool: "chat" }, views([]));
    expect(e?.status).toBe(404);
    expect(e?.code).toBe("model_not_found");
    expect(e?.message).toContain("gateway pool `chat`");
  });
});
