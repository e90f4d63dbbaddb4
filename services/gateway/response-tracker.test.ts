/** Usage and the first token as each API reports them (chat, Responses, Messages), read from bodies cut at any byte. */
import { describe, expect, it } from "vitest";
import { ResponseTracker, trailingUsage, usageIn } from "./response-tracker.js";

const ev = (name: string, data: object) => `event: ${name}\ndata: ${JSON.stringify({ type: name, ...data })}\n\n`;

/** Feeds `text` in chunks of `size` bytes; returns the offset of the chunk after which a token was first seen (-1: never) and the usage. */
function feed(t: ResponseTracker, text: string, size: number): { firstAt: number; usage: ReturnType<ResponseTracker["end"]> } {
  const bytes = Buffer.from(text);
  let firstAt = -1;
  for (let i = 0; i < bytes.length; i += size) if (t.push(bytes.subarray(i, i + size)) && firstAt < 0) firstAt = i;
  return { firstAt, usage: t.end() };
}

/** The offset of the chunk (of `size` bytes) holding the newline that ends `line` in `text`. */
const chunkOf = (text: string, line: string, size: number) => Math.floor(Buffer.byteLength(text.slice(0, text.indexOf(line) + line.length)) / size) * size;

const responsesStream =
  ev("response.created", { sequence_number: 0, response: { id: "resp_1", status: "in_progress", usage: null } }) +
  ev("response.in_progress", { sequence_number: 1, response: { id: "resp_1", status: "in_progress", usage: null } }) +
  ev("response.output_item.added", { sequence_number: 2, output_index: 0, item: { type: "message" } }) +
  ev("response.output_text.delta", { sequence_number: 3, delta: " hi" }) +
  ev("response.completed", { sequence_number: 4, response: { id: "resp_1", output: [{ content: [{ text: " hi" }] }], usage: { input_tokens: 21, output_tokens: 1, total_tokens: 22 } } });

const messagesStream =
  ev("message_start", { message: { id: "msg_1", usage: { input_tokens: 13, output_tokens: 1 } } }) +
  ev("content_block_start", { index: 0, content_block: { type: "text", text: "" } }) +
  ev("ping", {}) +
  ev("content_block_delta", { index: 0, delta: { type: "text_delta", text: " hi" } }) +
  ev("content_block_stop", { index: 0 }) +
  ev("message_delta", { delta: { stop_reason: "max_tokens" }, usage: { output_tokens: 5 } }) +
  ev("message_stop", {});

describe("ResponseTracker - the Responses and Messages APIs", () => {
  it.each([1, 7, 64, 100_000])("Responses stream in %i-byte chunks: usage from response.completed; the first token is the first event past created/in_progress", (size) => {
    const { firstAt, usage } = feed(new ResponseTracker("text/event-stream; charset=utf-8", "responses"), responsesStream, size);
    expect(usage).toEqual({ promptTokens: 21, completionTokens: 1 });
    // Seen with the chunk that completes the first event line past the preamble, not before.
    expect(firstAt).toBe(chunkOf(responsesStream, "event: response.output_item.added", size));
  });

  it.each([1, 9, 100_000])("Messages stream in %i-byte chunks: input tokens from message_start, output from message_delta", (size) => {
    const { firstAt, usage } = feed(new ResponseTracker("text/event-stream", "messages"), messagesStream, size);
    expect(usage).toEqual({ promptTokens: 13, completionTokens: 5 });
    expect(firstAt).toBe(chunkOf(messagesStream, "event: content_block_delta", size));
  });

  it("a stream of only the preamble (no token yet) has seen no token; chat's first bytes are its first token", () => {
    const t = new ResponseTracker("text/event-stream", "responses");
    expect(t.push(Buffer.from(ev("response.created", { response: { usage: null } }) + ev("response.in_progress", { response: {} })))).toBe(false);
    expect(new ResponseTracker("text/event-stream", "chat").push(Buffer.from("data: {}\n\n"))).toBe(true);
    expect(new ResponseTracker("text/event-stream").push(Buffer.from("d"))).toBe(true);
  });

  it("a named event's data is not scanned for a type: vLLM's response.created lists the request's tools (a nested \"type\") before its own", () => {
    const t = new ResponseTracker("text/event-stream", "responses");
    const created = `event: response.created\ndata: ${JSON.stringify({ response: { id: "resp_1", tools: [{ type: "function", name: "f" }], usage: null }, type: "response.created" })}\n\n`;
    expect(t.push(Buffer.from(created))).toBe(false);
    expect(t.push(Buffer.from(ev("response.in_progress", { response: { tool_choice: { type: "function" } } })))).toBe(false);
    expect(t.push(Buffer.from(ev("response.output_text.delta", { delta: " hi" })))).toBe(true);
  });

  it("JSON bodies: top-level usage with input/output names (Responses and Messages)", () => {
    const r = new ResponseTracker("application/json", "responses");
    expect(r.push(Buffer.from('{"id":"resp_1","object":"response","usage":{"input_tokens":4,"output_tokens":2,"total_tokens":6}}'))).toBe(true);
    expect(r.end()).toEqual({ promptTokens: 4, completionTokens: 2 });
    const m = new ResponseTracker("application/json", "messages");
    m.push(Buffer.from('{"type":"message","usage":{"input_tokens":9,"output_tokens":3}}'));
    expect(m.end()).toEqual({ promptTokens: 9, completionTokens: 3 });
  });

  it("a response.completed line longer than the kept tail still gives its usage (the tail holds it)", () => {
    const long = ev("response.completed", { response: { id: "r", output: [{ content: [{ text: "w".repeat(200_000) }] }], usage: { input_tokens: 30, output_tokens: 50_000, total_tokens: 50_030 } } });
    const { usage } = feed(new ResponseTracker("text/event-stream", "responses"), ev("response.created", { response: {} }) + long, 4096);
    expect(usage).toEqual({ promptTokens: 30, completionTokens: 50_000 });
  });

  it("the Responses API's response id: from response.created, or the JSON body; bounded; not for other APIs", () => {
    for (const size of [1, 50, 100_000]) {
      const t = new ResponseTracker("text/event-stream", "responses");
      feed(t, responsesStream, size);
      expect(t.responseId).toBe("resp_1");
    }
    const noUsageField = new ResponseTracker("text/event-stream", "responses");
    noUsageField.push(Buffer.from('event: response.created\ndata: {"type":"response.created","response":{"id":"resp_2"}}\n\n'));
    expect(noUsageField.responseId).toBe("resp_2");
    const json = new ResponseTracker("application/json", "responses");
    json.push(Buffer.from('{"id":"resp_3","object":"response","usage":{"input_tokens":1,"output_tokens":1}}'));
    json.end();
    expect(json.responseId).toBe("resp_3");
    const long = new ResponseTracker("application/json", "responses");
    long.push(Buffer.from(JSON.stringify({ id: "r".repeat(300), object: "response" })));
    long.end();
    expect(long.responseId).toBeUndefined();
    const chat = new ResponseTracker("application/json", "chat");
    chat.push(Buffer.from('{"id":"resp_4","object":"response"}'));
    chat.end();
    expect(chat.responseId).toBeUndefined();
  });

  it("usageIn and trailingUsage", () => {
    expect(usageIn({ usage: null, response: { usage: { input_tokens: 1 } } })).toEqual({ input_tokens: 1 });
    expect(usageIn({ message: { usage: { output_tokens: 2 } } })).toEqual({ output_tokens: 2 });
    expect(usageIn({ choices: [] })).toBeUndefined();
    expect(trailingUsage('ut":"x"}]}],"usage":{"input_tokens":3,"input_tokens_details":{"cached_tokens":0},"output_tokens":4}}}')).toEqual({ input_tokens: 3, input_tokens_details: { cached_tokens: 0 }, output_tokens: 4 });
    expect(trailingUsage('"usage":{"input_tokens":3')).toBeUndefined();
    expect(trailingUsage("no usage here")).toBeUndefined();
  });
});
