import http from "node:http";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { quietLog } from "../../test/harness/env.js";
import { type SimFleet, startSimFleet } from "../sim/fleet.js";
import { tokenizeChat } from "../tokenizer/sim-tokenizer.js";
import { approximateTokens } from "../tokenizer/prompt-tokens.js";
import { Tokenizer } from "./tokenization.js";

const messages = [
  { role: "system", content: "You are terse." },
  { role: "user", content: "Hello there" },
];

describe("tokenization - remote, local, approximate", () => {
  let fleet: SimFleet;
  let slow: http.Server;
  let slowAddress = "";
  beforeAll(async () => {
    fleet = await startSimFleet({ pods: 1, model: "m", kvEvents: false, logger: quietLog });
    slow = http.createServer(() => undefined); // never answers
    await new Promise<void>((r) => slow.listen(0, "127.0.0.1", r));
    slowAddress = `127.0.0.1:${(slow.address() as { port: number }).port}`;
  });
  afterAll(async () => {
    slow?.closeAllConnections();
    slow?.close();
    await fleet?.close();
  });

  it("remote asks the engine's /tokenize with messages (chat template applied) and caches the answer", async () => {
    const t = new Tokenizer({ defaultMode: "remote", timeoutMs: 1_000 });
    const address = fleet.pods[0]?.address as string;
    const a = await t.tokenize("m", { messages }, address);
    expect(a.mode).toBe("remote");
    expect(a.tokens).toEqual(tokenizeChat(messages, { addGenerationPrompt: true }));
    const b = await t.tokenize("m", { messages }, address);
    expect(b.cached).toBe(true);
    expect(t.stats).toMatchObject({ remote: 1, cacheHits: 1, fallbacks: 0 });
  });

  it("a slow engine makes that request approximate, counted", async () => {
    const t = new Tokenizer({ defaultMode: "remote", timeoutMs: 100 });
    const r = await t.tokenize("m", { messages }, slowAddress);
    expect(r.mode).toBe("approximate");
    expect(r.tokens).toEqual(approximateTokens({ messages }));
    expect(t.stats.fallbacks).toBe(1);
  });

  it("modes are per model", async () => {
    const t = new Tokenizer({ defaultMode: "approximate", modes: { exact: "local" } });
    expect((await t.tokenize("exact", { messages }, undefined)).tokens).toEqual(tokenizeChat(messages, { addGenerationPrompt: true }));
    expect((await t.tokenize("other", { messages }, undefined)).mode).toBe("approximate");
  });
});
