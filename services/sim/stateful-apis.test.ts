import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { tokenizeChat } from "../tokenizer/sim-tokenizer.js";
import { type SimFleet, startSimFleet } from "./fleet.js";
import { SimResponseStore } from "./response-store.js";
import { json, postJson } from "./testing.js";

const MODEL = "demo/llama-3.1-8b";

let fleet: SimFleet;
let address: string;

beforeAll(async () => {
  fleet = await startSimFleet({ pods: 1, model: MODEL, timeScale: 1_000, maxModelLen: 512 });
  address = fleet.pods[0]?.address ?? "";
});
afterAll(() => fleet.close());

/** An SSE body's events as [name, data] pairs. */
function events(text: string): Array<[string, Record<string, unknown>]> {
  return text
    .split("\n\n")
    .filter((e) => e.startsWith("event: "))
    .map((e) => {
      const [head, data] = e.split("\n");
      return [(head ?? "").slice("event: ".length), JSON.parse((data ?? "").slice("data: ".length)) as Record<string, unknown>];
    });
}

describe("POST /v1/responses", () => {
  it("answers a response object with the rendered prompt's input tokens and stores it", async () => {
    const r = await json(postJson(address, "/v1/responses", { model: MODEL, instructions: "Be brief.", input: "Which pod?", max_output_tokens: 5 }));
    expect(r).toMatchObject({ object: "response", status: "completed", model: MODEL, instructions: "Be brief.", previous_response_id: null, store: true });
    expect(r.id).toMatch(/^resp_[0-9a-f]{32}$/);
    const prompt = tokenizeChat([{ role: "system", content: "Be brief." }, { role: "user", content: "Which pod?" }]);
    expect(r.usage).toMatchObject({ input_tokens: prompt.length, output_tokens: 5, total_tokens: prompt.length + 5 });
    expect(r.output[0]).toMatchObject({ type: "message", role: "assistant", status: "completed" });
    expect(r.output[0].content[0].type).toBe("output_text");
    expect(r.output[0].content[0].text.length).toBeGreaterThan(0);
    const got = await json(fetch(`http://${address}/v1/responses/${r.id}`));
    expect(got).toEqual(r);
    const state = await json(fetch(`http://${address}/debug/state`));
    expect(state.responseStore.size).toBeGreaterThanOrEqual(1);
    expect(state.responseStore.bytes).toBeGreaterThan(JSON.stringify(r).length);
  });

  it("streams vLLM's events in order, usage in response.completed, no [DONE]", async () => {
    const res = await postJson(address, "/v1/responses", { model: MODEL, input: [{ role: "user", content: [{ type: "input_text", text: "hello" }] }], max_output_tokens: 3, stream: true });
    expect(res.headers.get("content-type")).toMatch(/^text\/event-stream/);
    const text = await res.text();
    expect(text).not.toContain("[DONE]");
    const ev = events(text);
    expect(ev.map(([n]) => n)).toEqual([
      "response.created",
      "response.in_progress",
      "response.output_item.added",
      "response.content_part.added",
      "response.output_text.delta",
      "response.output_text.delta",
      "response.output_text.delta",
      "response.output_text.done",
      "response.content_part.done",
      "response.output_item.done",
      "response.completed",
    ]);
    expect(ev.map(([, d]) => d.sequence_number)).toEqual(ev.map((_, i) => i));
    expect(ev.every(([n, d]) => d.type === n)).toBe(true);
    const created = ev[0]?.[1].response as { id: string; status: string; usage: unknown };
    expect(created.status).toBe("in_progress");
    expect(created.usage).toBeNull();
    const done = ev.at(-1)?.[1].response as { id: string; usage: { output_tokens: number; input_tokens: number } };
    expect(done.id).toBe(created.id);
    expect(done.usage.output_tokens).toBe(3);
    const deltas = ev.filter(([n]) => n === "response.output_text.delta").map(([, d]) => d.delta).join("");
    expect(ev.find(([n]) => n === "response.output_text.done")?.[1].text).toBe(deltas);
  });

  it("previous_response_id prepends the stored chain; instructions are not carried over", async () => {
    const first = await json(postJson(address, "/v1/responses", { model: MODEL, instructions: "Long instructions here.", input: "turn one", max_output_tokens: 4 }));
    const second = await json(postJson(address, "/v1/responses", { model: MODEL, input: "turn two", previous_response_id: first.id, max_output_tokens: 4 }));
    expect(second.previous_response_id).toBe(first.id);
    expect(second.instructions).toBeNull();
    const chain = tokenizeChat([
      { role: "user", content: "turn one" },
      { role: "assistant", content: first.output[0].content[0].text },
      { role: "user", content: "turn two" },
    ]);
    expect(second.usage.input_tokens).toBe(chain.length);
    // A third turn chains through the second (its stored history holds the first).
    const third = await json(postJson(address, "/v1/responses", { model: MODEL, instructions: "New.", input: "turn three", previous_response_id: second.id, max_output_tokens: 4 }));
    const chain3 = tokenizeChat([
      { role: "system", content: "New." },
      { role: "user", content: "turn one" },
      { role: "assistant", content: first.output[0].content[0].text },
      { role: "user", content: "turn two" },
      { role: "assistant", content: second.output[0].content[0].text },
      { role: "user", content: "turn three" },
    ]);
    expect(third.usage.input_tokens).toBe(chain3.length);
  });

  it("an unknown id is vLLM's 404 (create, retrieve, cancel); store: false keeps nothing; cancel of a finished one is 400", async () => {
    const unknown = await postJson(address, "/v1/responses", { model: MODEL, input: "x", previous_response_id: "resp_nope" });
    expect(unknown.status).toBe(404);
    expect(await unknown.json()).toEqual({ error: { message: "Response with id 'resp_nope' not found.", type: "invalid_request_error", param: "response_id", code: 404 } });
    const get = await fetch(`http://${address}/v1/responses/resp_nope`);
    expect(get.status).toBe(404);
    expect((await json(get)).error.param).toBe("response_id");
    const unstored = await json(postJson(address, "/v1/responses", { model: MODEL, input: "x", store: false, max_output_tokens: 2 }));
    expect(unstored.store).toBe(false);
    expect((await fetch(`http://${address}/v1/responses/${unstored.id}`)).status).toBe(404);
    expect((await postJson(address, "/v1/responses", { model: MODEL, input: "y", previous_response_id: unstored.id })).status).toBe(404);
    const stored = await json(postJson(address, "/v1/responses", { model: MODEL, input: "z", max_output_tokens: 2 }));
    const cancel = await postJson(address, `/v1/responses/${stored.id}/cancel`, {});
    expect(cancel.status).toBe(400);
    expect((await json(cancel)).error.message).toBe("Cannot cancel a synchronous response.");
    expect((await postJson(address, "/v1/responses/resp_nope/cancel", {})).status).toBe(404);
    const del = await fetch(`http://${address}/v1/responses/${stored.id}`, { method: "DELETE" });
    expect(del.status).toBe(405);
  });

  it("a restart empties the store", async () => {
    const r = await json(postJson(address, "/v1/responses", { model: MODEL, input: "before restart", max_output_tokens: 2 }));
    expect((await fetch(`http://${address}/v1/responses/${r.id}`)).status).toBe(200);
    fleet.restart(fleet.pods[0]?.name ?? "");
    expect((await fetch(`http://${address}/v1/responses/${r.id}`)).status).toBe(404);
  });

  it("bad input is a 400 naming the field", async () => {
    const res = await postJson(address, "/v1/responses", { model: MODEL, input: [{ type: "item_reference", id: "x" }] });
    expect(res.status).toBe(400);
    expect((await json(res)).error.param).toBe("input[0].type");
    const noInput = await postJson(address, "/v1/responses", { model: MODEL });
    expect((await json(noInput)).error.param).toBe("input");
  });
});

describe("POST /v1/messages", () => {
  const body = { model: MODEL, system: "Be brief.", messages: [{ role: "user", content: "Which pod?" }], max_tokens: 4 };
  const prompt = tokenizeChat([{ role: "system", content: "Be brief." }, { role: "user", content: "Which pod?" }]);

  it("answers an Anthropic message with usage", async () => {
    const m = await json(postJson(address, "/v1/messages", body));
    expect(m).toMatchObject({ type: "message", role: "assistant", model: MODEL, stop_reason: "max_tokens", stop_sequence: null, usage: { input_tokens: prompt.length, output_tokens: 4 } });
    expect(m.id).toMatch(/^msg_/);
    expect(m.content).toHaveLength(1);
    expect(m.content[0].type).toBe("text");
  });

  it("streams Anthropic's events, output tokens in message_delta", async () => {
    const res = await postJson(address, "/v1/messages", { ...body, stream: true });
    const ev = events(await res.text());
    expect(ev.map(([n]) => n)).toEqual(["message_start", "content_block_start", "ping", "content_block_delta", "content_block_delta", "content_block_delta", "content_block_delta", "content_block_stop", "message_delta", "message_stop"]);
    const start = ev[0]?.[1] as { message: { usage: { input_tokens: number } } };
    expect(start.message.usage.input_tokens).toBe(prompt.length);
    expect(ev[8]?.[1]).toEqual({ type: "message_delta", delta: { stop_reason: "max_tokens", stop_sequence: null }, usage: { output_tokens: 4 } });
  });

  it("errors in Anthropic's shape", async () => {
    const missing = await postJson(address, "/v1/messages", { model: MODEL, messages: [{ role: "user", content: "x" }] });
    expect(missing.status).toBe(400);
    expect(await missing.json()).toEqual({ type: "error", error: { type: "invalid_request_error", message: "max_tokens: Field required" } });
    const model = await postJson(address, "/v1/messages", { ...body, model: "nope" });
    expect(model.status).toBe(404);
    expect((await json(model)).error.type).toBe("not_found_error");
  });
});

describe("SimResponseStore", () => {
  it("is bounded by entries and bytes, oldest out first", () => {
    const s = new SimResponseStore({ maxEntries: 2, maxBytes: 10_000 });
    const entry = (id: string, text = "x") => ({ id, response: { id }, history: [{ role: "user", content: text }], outputText: text });
    s.put(entry("a"));
    s.put(entry("b"));
    s.put(entry("c"));
    expect([s.get("a"), s.get("b")?.id, s.get("c")?.id]).toEqual([undefined, "b", "c"]);
    expect(s.evicted).toBe(1);
    s.put(entry("big", "y".repeat(4_950)));
    expect(s.get("big")).toBeDefined();
    expect(s.get("b")).toBeUndefined();
    expect(s.bytes).toBeLessThanOrEqual(10_000);
    // One response over the bound on its own is still kept (the newest always is).
    s.put(entry("huge", "z".repeat(20_000)));
    expect([s.size, s.get("huge")?.id]).toEqual([1, "huge"]);
    s.clear();
    expect([s.size, s.bytes]).toEqual([0, 0]);
  });
});
