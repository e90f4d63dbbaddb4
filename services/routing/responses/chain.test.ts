import { describe, expect, it } from "vitest";
import { type ChainTurn, expandedBody, expandInput, inputItems, walkChain } from "./chain.js";

const msg = (role: string, text: string) => ({ type: "message", role, content: text });
const out = (text: string) => ({ type: "message", role: "assistant", id: `msg_${text}`, status: "completed", content: [{ type: "output_text", text, annotations: [] }] });

const store = (turns: ChainTurn[]) => {
  const byId = new Map(turns.map((t) => [t.id, t]));
  const asked: string[] = [];
  const lookup = async (id: string) => {
    asked.push(id);
    return byId.get(id);
  };
  return { asked, lookup };
};

const t1: ChainTurn = { id: "resp_1", input: [msg("user", "hi")], output: [out("hello")] };
const t2: ChainTurn = { id: "resp_2", previousResponseId: "resp_1", input: [msg("user", "and?")], output: [{ type: "reasoning", id: "rs_1", encrypted_content: "opaque", summary: [] }, out("more")] };
const t3: ChainTurn = { id: "resp_3", previousResponseId: "resp_2", input: [msg("user", "ok")], output: [{ type: "reasoning", id: "rs_2", summary: [], content: [{ type: "reasoning_text", text: "thinking" }] }, out("fine")] };

describe("chain expansion", () => {
  it("walks previous_response_id links back to the first turn, oldest first", async () => {
    const s = store([t1, t2, t3]);
    const w = await walkChain("resp_3", s.lookup);
    expect(w).toEqual({ ok: true, turns: [t1, t2, t3] });
    expect(s.asked).toEqual(["resp_3", "resp_2", "resp_1"]);
  });

  it("a missing link, a cycle or a chain past the depth bound is refused", async () => {
    expect(await walkChain("resp_3", store([t3, t1]).lookup)).toEqual({ ok: false, reason: "missing", id: "resp_2" });
    const a: ChainTurn = { id: "resp_a", previousResponseId: "resp_b", input: [], output: [] };
    const b: ChainTurn = { id: "resp_b", previousResponseId: "resp_a", input: [], output: [] };
    expect(await walkChain("resp_a", store([a, b]).lookup)).toEqual({ ok: false, reason: "cycle", id: "resp_a" });
    expect(await walkChain("resp_3", store([t1, t2, t3]).lookup, 2)).toEqual({ ok: false, reason: "too-deep", id: "resp_1" });
  });

  it("builds every turn's input then output, then the new input; drops encrypted reasoning and counts it", () => {
    const e = expandInput([t1, t2, t3], inputItems("last") ?? []);
    expect(e?.input).toEqual([msg("user", "hi"), out("hello"), msg("user", "and?"), out("more"), msg("user", "ok"), t3.output[0], out("fine"), msg("user", "last")]);
    expect(e?.dropped).toBe(1);
    expect(e?.turns).toBe(3);
  });

  it("refuses an expansion past the item bound", () => {
    expect(expandInput([t1, t2, t3], [msg("user", "x")], 5)).toBeUndefined();
  });

  it("the expanded body keeps the request's own instructions and fields, and drops previous_response_id", () => {
    const e = expandInput([t1], [msg("user", "next")]);
    if (!e) throw new Error("no expansion");
    const body = expandedBody({ model: "m", input: "next", previous_response_id: "resp_1", instructions: "be brief", tools: [], store: true }, e);
    expect(body).toEqual({ model: "m", input: [msg("user", "hi"), out("hello"), msg("user", "next")], instructions: "be brief", tools: [], store: true });
  });

  it("reads a string input as one user message and refuses what is not a list of items", () => {
    expect(inputItems("hi")).toEqual([msg("user", "hi")]);
    expect(inputItems([msg("user", "x")])).toEqual([msg("user", "x")]);
    expect(inputItems([1])).toBeUndefined();
    expect(inputItems(undefined)).toBeUndefined();
  });
});
