import { describe, expect, it } from "vitest";
import { ApiShapeError, messagesToChat, renderedChars, responsesToChat } from "./api-messages.js";
import { localTokens, promptInputOf } from "./prompt-tokens.js";
import { tokenizeChat } from "./sim-tokenizer.js";

const shapeParam = (f: () => unknown): string | undefined => {
  try {
    f();
  } catch (err) {
    if (err instanceof ApiShapeError) return err.param;
    throw err;
  }
  return undefined;
};

describe("responsesToChat", () => {
  it("instructions first, then history, then the input (a string is one user message)", () => {
    const history = [
      { role: "user", content: "before" },
      { role: "assistant", content: "reply" },
    ];
    expect(responsesToChat({ instructions: "Be brief.", input: "now" }, history).messages).toEqual([{ role: "system", content: "Be brief." }, ...history, { role: "user", content: "now" }]);
    expect(responsesToChat({ input: "only" }).messages).toEqual([{ role: "user", content: "only" }]);
  });

  it("input items: text parts, function calls and outputs; reasoning skipped; function tools as chat tools", () => {
    const chat = responsesToChat({
      input: [
        { role: "developer", content: "dev note" },
        { type: "message", role: "user", content: [{ type: "input_text", text: "look" }, { type: "input_image", image_url: "data:..." }] },
        { type: "reasoning", id: "rs_1", summary: [], encrypted_content: "opaque" },
        { type: "function_call", call_id: "call_1", name: "ls", arguments: '{"dir":"."}' },
        { type: "function_call_output", call_id: "call_1", output: "a.ts b.ts" },
        { role: "assistant", content: [{ type: "output_text", text: "done" }] },
      ],
      tools: [{ type: "function", name: "ls", description: "list", parameters: { type: "object" } }, { type: "web_search" }],
    });
    expect(chat.messages).toEqual([
      { role: "developer", content: "dev note" },
      { role: "user", content: [{ type: "text", text: "look" }, { type: "input_image" }] },
      { role: "assistant", content: null, tool_calls: [{ id: "call_1", type: "function", function: { name: "ls", arguments: '{"dir":"."}' } }] },
      { role: "tool", tool_call_id: "call_1", content: "a.ts b.ts" },
      { role: "assistant", content: [{ type: "text", text: "done" }] },
    ]);
    expect(chat.tools).toEqual([{ type: "function", function: { name: "ls", description: "list", parameters: { type: "object" } } }]);
  });

  it("a shape mistake names the field", () => {
    expect(shapeParam(() => responsesToChat({}))).toBe("input");
    expect(shapeParam(() => responsesToChat({ input: 5 }))).toBe("input");
    expect(shapeParam(() => responsesToChat({ input: [{ type: "item_reference", id: "x" }] }))).toBe("input[0].type");
    expect(shapeParam(() => responsesToChat({ input: [{ role: "robot", content: "x" }] }))).toBe("input[0].role");
    expect(shapeParam(() => responsesToChat({ input: [{ role: "user", content: [{ type: "input_text" }] }] }))).toBe("input[0].content[0].text");
    expect(shapeParam(() => responsesToChat({ input: "x", instructions: 3 }))).toBe("instructions");
    expect(shapeParam(() => responsesToChat({ input: "x", tools: [{ type: "function" }] }))).toBe("tools[0].name");
  });
});

describe("messagesToChat", () => {
  it("system blocks concatenated; tool_use -> assistant tool call; tool_result -> tool message; thinking skipped", () => {
    const chat = messagesToChat({
      system: [
        { type: "text", text: "Part one. " },
        { type: "text", text: "Part two." },
      ],
      messages: [
        { role: "user", content: "list files" },
        { role: "assistant", content: [{ type: "thinking", thinking: "hmm", signature: "s" }, { type: "text", text: "Listing." }, { type: "tool_use", id: "tu_1", name: "ls", input: { dir: "." } }] },
        { role: "user", content: [{ type: "tool_result", tool_use_id: "tu_1", content: [{ type: "text", text: "a.ts" }] }, { type: "text", text: "and now?" }] },
      ],
      tools: [{ name: "ls", description: "list", input_schema: { type: "object" } }],
    });
    expect(chat.messages).toEqual([
      { role: "system", content: "Part one. Part two." },
      { role: "user", content: "list files" },
      { role: "assistant", content: [{ type: "text", text: "Listing." }], tool_calls: [{ id: "tu_1", type: "function", function: { name: "ls", arguments: '{"dir":"."}' } }] },
      { role: "tool", tool_call_id: "tu_1", content: [{ type: "text", text: "a.ts" }] },
      { role: "user", content: [{ type: "text", text: "and now?" }] },
    ]);
    expect(chat.tools).toEqual([{ type: "function", function: { name: "ls", description: "list", parameters: { type: "object" } } }]);
    expect(renderedChars(chat)).toBe("Part one. Part two.".length + "list files".length + "Listing.".length + 2 + '{"dir":"."}'.length + "a.ts".length + "and now?".length);
  });

  it("a shape mistake names the field", () => {
    expect(shapeParam(() => messagesToChat({}))).toBe("messages");
    expect(shapeParam(() => messagesToChat({ messages: [] }))).toBe("messages");
    expect(shapeParam(() => messagesToChat({ messages: [{ role: "system", content: "x" }] }))).toBe("messages[0].role");
    expect(shapeParam(() => messagesToChat({ messages: [{ role: "user", content: [{ type: "video" }] }] }))).toBe("messages[0].content[0].type");
    expect(shapeParam(() => messagesToChat({ system: [{ type: "image" }], messages: [{ role: "user", content: "x" }] }))).toBe("system[0]");
  });
});

describe("the gateway's prompt input for these APIs", () => {
  it("tokenizes to the ids the simulated engine computes (same rendering, same template)", () => {
    const responses = { instructions: "Shared prefix.", input: [{ role: "user", content: [{ type: "input_text", text: "hello" }] }] };
    const messages = { system: "Shared prefix.", messages: [{ role: "user", content: [{ type: "text", text: "hello" }] }], max_tokens: 4 };
    const engine = tokenizeChat([
      { role: "system", content: "Shared prefix." },
      { role: "user", content: [{ type: "text", text: "hello" }] },
    ]);
    expect(localTokens(promptInputOf(responses, undefined, "responses"))).toEqual(engine);
    expect(localTokens(promptInputOf(messages, undefined, "messages"))).toEqual(engine);
  });
});
