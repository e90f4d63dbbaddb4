import { describe, expect, it } from "vitest";
import { contextOf, upstreamBodyOf } from "../context.js";
import type { StageEnv } from "../pipeline.js";
import type { ModelRewrites } from "../ports.js";
import { modelRewriteStage } from "./model-rewrite.js";
import { parseStage } from "./parse.js";
import { chatBody, MODEL } from "./testing.js";

const envWith = (modelRewrites?: ModelRewrites) => ({ ...(modelRewrites ? { modelRewrites } : {}) }) as unknown as StageEnv;

function run(rw: ModelRewrites | undefined, body = chatBody("alias", { max_tokens: 3 }), headers: Record<string, string> = { "x-request-id": "r-1" }) {
  const ctx = contextOf({ headers, body });
  parseStage.run(ctx, envWith(rw));
  modelRewriteStage.run(ctx, envWith(rw));
  return ctx;
}

describe("model-rewrite stage", () => {
  it("rewrites the parsed model once: the engine's body carries the target, the context records the rule", () => {
    const asked: Array<[string, string]> = [];
    const ctx = run({ active: () => true, rewrite: (m, id) => {
        asked.push([m, id]);
        return { model: MODEL, rule: "r#0", pool: "ns/p" };
      } });
    expect(asked).toEqual([["alias", "r-1"]]);
    expect(ctx.parsed?.model).toBe(MODEL);
    expect(ctx.rewrite).toEqual({ from: "alias", to: MODEL, rule: "r#0", pool: "ns/p" });
    expect(JSON.parse((upstreamBodyOf(ctx) as Buffer).toString())).toEqual({ model: MODEL, messages: [{ role: "user", content: "hello there" }], max_tokens: 3 });
  });

  it("no rules, no match, or a rewrite to the same model: the client's body goes as sent", () => {
    for (const rw of [undefined, { active: () => false, rewrite: () => ({ model: MODEL, rule: "r#0", pool: "p" }) }, { active: () => true, rewrite: () => undefined }, { active: () => true, rewrite: () => ({ model: "alias", rule: "r#0", pool: "p" }) }]) {
      const ctx = run(rw);
      expect(ctx.parsed?.model).toBe("alias");
      expect(ctx.rewrite).toBeUndefined();
      expect(upstreamBodyOf(ctx)).toBeUndefined();
    }
  });

  it("a request without an id gets one, used for the weighted pick and kept for the routing that follows", () => {
    let seen = "";
    const ctx = run({ active: () => true, rewrite: (_m, id) => {
        seen = id;
        return undefined;
      } }, chatBody("alias"), {});
    expect(seen).toMatch(/^[0-9a-f-]{36}$/);
    expect(ctx.requestId).toBe(seen);
  });
});
