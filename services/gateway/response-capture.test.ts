import { describe, expect, it } from "vitest";
import { ResponseCapture } from "./response-capture.js";

const enc = new TextEncoder();
const final = (id: string, text: string) => ({ id, object: "response", status: "completed", output: [{ id: "msg_1", type: "message", role: "assistant", status: "completed", content: [{ type: "output_text", text, annotations: [] }] }], usage: { input_tokens: 3, output_tokens: 2 } });
const sse = (events: Array<[string, object]>) => events.map(([e, d]) => `event: ${e}\ndata: ${JSON.stringify(d)}\n\n`).join("");

/** Feeds `text` in pieces of `size` bytes. */
function feed(c: ResponseCapture, text: string, size: number) {
  const b = enc.encode(text);
  for (let i = 0; i < b.length; i += size) c.push(b.subarray(i, i + size));
  return c.end();
}

describe("response capture", () => {
  it("reads the id and output of a JSON reply", () => {
    expect(feed(new ResponseCapture("application/json"), JSON.stringify(final("resp_a1", "hi")), 7)).toEqual({ id: "resp_a1", status: "completed", output: final("resp_a1", "hi").output });
  });

  it("reads a streamed reply's terminal event, however the chunks cut its lines (vLLM's field order: type last)", () => {
    const body = sse([
      ["response.created", { response: { id: "resp_s1", status: "in_progress", output: [] }, sequence_number: 0, type: "response.created" }],
      ["response.output_text.delta", { delta: "h", type: "response.output_text.delta" }],
      ["response.completed", { response: final("resp_s1", "hello"), sequence_number: 5, type: "response.completed" }],
    ]);
    for (const size of [1, 13, 4096]) expect(feed(new ResponseCapture("text/event-stream"), body, size)).toEqual({ id: "resp_s1", status: "completed", output: final("resp_s1", "hello").output });
  });

  it("a reply past the bound keeps its id, not its output", () => {
    const big = final("resp_big", "x".repeat(5_000));
    expect(feed(new ResponseCapture("application/json", 1_000), JSON.stringify(big), 100)).toEqual({ id: "resp_big" });
    const body = sse([
      ["response.created", { type: "response.created", response: { id: "resp_big", status: "in_progress" } }],
      ["response.completed", { type: "response.completed", response: big }],
    ]);
    expect(feed(new ResponseCapture("text/event-stream", 1_000), body, 64)).toEqual({ id: "resp_big" });
  });

  it("names the id as soon as the first event arrived, before the reply ends", () => {
    const c = new ResponseCapture("text/event-stream");
    expect(c.id).toBeUndefined();
    c.push(enc.encode(sse([["response.created", { type: "response.created", response: { id: "resp_early", status: "in_progress" } }]])));
    expect(c.id).toBe("resp_early");
  });

  it("a stream cut before its end yields the id of its first event", () => {
    const body = sse([["response.created", { type: "response.created", response: { id: "resp_cut", status: "in_progress" } }]]);
    expect(feed(new ResponseCapture("text/event-stream"), body, 10)).toEqual({ id: "resp_cut" });
  });

  it("ignores ids outside the recorded shape and output that is not a list of items", () => {
    expect(feed(new ResponseCapture("application/json"), JSON.stringify({ id: "resp.bad.id", output: [] }), 50)).toBeUndefined();
    expect(feed(new ResponseCapture("application/json"), JSON.stringify({ id: "resp_ok", output: [1, 2] }), 50)).toEqual({ id: "resp_ok" });
    expect(feed(new ResponseCapture("application/json"), "not json", 50)).toBeUndefined();
  });
});
