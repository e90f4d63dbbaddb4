import { describe, expect, it } from "vitest";
import { mulberry32 } from "../shared/seeded-random.js";
import { normaliseToolCalls, parsedJsonProblem, rawToolJsonInexact, rawToolJsonScanNeeded } from "./tool-json.js";

/** What the render reports without the raw text (chat-template.ts `job`): the parsed tools, and each assistant's tool calls normalised (arguments scanned as raw JSON) then checked. */
function problemWithoutRaw(body: Record<string, unknown>): boolean {
  if (Array.isArray(body.tools) && body.tools.length > 0 && parsedJsonProblem(body.tools)) return true;
  for (const m of body.messages as Record<string, unknown>[]) {
    if (m.tool_calls === undefined || m.tool_calls === null) continue;
    try {
      const calls = m.role === "assistant" ? normaliseToolCalls(m.tool_calls, true) : m.tool_calls;
      if (parsedJsonProblem(calls)) return true;
    } catch {
      return true;
    }
  }
  return false;
}

const LITERALS = ["20", "20.0", "1e5", "1.5", "1e-05", "12345678901234567890", "-0.0", "0", '"s"', "true", "null", "1e400", "2.5e1", "7"];
const KEYS = ["a", "1", "b", "arguments", "20"];

describe("raw tool JSON: the body's text scanned again only when the parse may have hidden a literal", () => {
  it("whenever the scan is skipped, every problem it would find is reported from the parse as well", () => {
    const rnd = mulberry32(35);
    const pick = <T>(xs: readonly T[]): T => xs[Math.floor(rnd() * xs.length)] as T;
    const obj = (depth: number): string => {
      const n = 1 + Math.floor(rnd() * 3);
      const parts: string[] = [];
      const used = new Set<string>();
      for (let i = 0; i < n; i++) {
        const k = pick(KEYS);
        if (used.has(k)) continue;
        used.add(k);
        parts.push(`${JSON.stringify(k)}:${depth > 0 && rnd() < 0.3 ? obj(depth - 1) : pick(LITERALS)}`);
      }
      return `{${parts.join(",")}}`;
    };
    let skipped = 0;
    let hiddenCaught = 0;
    for (let c = 0; c < 3000; c++) {
      const tools = rnd() < 0.6 ? `,"tools":[{"type":"function","function":{"name":"f","parameters":${obj(2)}}}]` : "";
      const messages = ['{"role":"user","content":"run it"}'];
      for (let m = 0; m < 1 + Math.floor(rnd() * 3); m++) {
        const role = rnd() < 0.85 ? "assistant" : "tool";
        const args = rnd() < 0.8 ? JSON.stringify(obj(1)) : obj(1);
        const extra = rnd() < 0.2 ? `,"index":${pick(LITERALS)}` : "";
        messages.push(`{"role":"${role}","content":"","tool_calls":[{"id":"c${m}","type":"function"${extra},"function":{"name":"f","arguments":${args}}}]}`);
      }
      const raw = `{"model":"m","messages":[${messages.join(",")}]${tools}}`;
      const body = JSON.parse(raw) as Record<string, unknown>;
      const needed = rawToolJsonScanNeeded(body.tools, body.messages as unknown[]);
      const rawProblem = rawToolJsonInexact(raw);
      if (!needed) {
        skipped++;
        expect(rawProblem === undefined || problemWithoutRaw(body), raw).toBe(true);
      } else if (rawProblem !== undefined && !problemWithoutRaw(body)) hiddenCaught++;
    }
    // Both kinds occur: scans skipped, and problems only the raw text shows (the scan was needed).
    expect(skipped).toBeGreaterThan(100);
    expect(hiddenCaught).toBeGreaterThan(50);
  });

  it("an agent session's body (string schemas, assistant tool calls) skips it; an integer-valued float, a tool's tool calls or an integer keep it", () => {
    // As agent sessions send them (loadtest/workloads/agent-sessions.ts): string-typed schemas, assistant tool calls and tool results.
    const tools = ["read_file", "grep"].map((name) => ({ type: "function", function: { name, description: `${name} in the workspace`, parameters: { type: "object", properties: { path: { type: "string" }, limit: { type: "integer" } }, required: ["path"] } } }));
    const messages: Record<string, unknown>[] = [{ role: "system", content: "you are an agent" }, { role: "user", content: "fix the build" }];
    for (let i = 0; i < 12; i++) {
      messages.push({ role: "assistant", content: "", tool_calls: [{ id: `call_${i}`, type: "function", function: { name: "grep", arguments: JSON.stringify({ path: `src/f${i}.ts`, limit: 10 + i }) } }] });
      messages.push({ role: "tool", tool_call_id: `call_${i}`, content: `result ${i}` });
    }
    expect(rawToolJsonScanNeeded(tools, messages)).toBe(false);
    const schema = (p: unknown) => [{ type: "function", function: { name: "f", parameters: p } }];
    expect(rawToolJsonScanNeeded(schema({ default: 20 }), [])).toBe(true);
    expect(rawToolJsonScanNeeded(schema({ default: 1.5 }), [])).toBe(false);
    expect(rawToolJsonScanNeeded({ not: "a list" }, [])).toBe(true);
    const call = { id: "c", type: "function", function: { name: "f", arguments: '{"x": 20.0}' } };
    expect(rawToolJsonScanNeeded(undefined, [{ role: "assistant", tool_calls: [call] }])).toBe(false);
    expect(rawToolJsonScanNeeded(undefined, [{ role: "tool", tool_calls: [call] }])).toBe(true);
    expect(rawToolJsonScanNeeded(undefined, [{ role: "assistant", tool_calls: [{ ...call, index: 0 }] }])).toBe(true);
  });
});
