/**
 * The Responses API and the Anthropic Messages API through the routing plane, driven by the
 * official clients (the `openai` and `@anthropic-ai/sdk` devDependencies): a real nats-server,
 * simulated vLLM pods with KV events over ZMQ, the kv-bridge, a gateway with `--auth required`
 * and prefix-cache routing, and the dev front. Usage from each API's own events reaches the
 * decision records and the ledger's releases, and counts against a user's tokens-per-minute
 * limit; errors on /v1/messages arrive as the Anthropic SDK's typed errors; a long shared
 * `instructions` / `system` prefix routes the next request to the pod that cached it.
 */
import Anthropic from "@anthropic-ai/sdk";
import { Kvm } from "@nats-io/kv";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { RATE_LIMITS_KEY } from "../schemas/config.js";
import type { DecisionRecord } from "../schemas/events.js";
import { type FrontServer, startFront } from "../services/front/front.js";
import { apiKeyBucketKey, generateApiKey, hashApiKey } from "../services/gateway/auth.js";
import type { GatewayHandle } from "../services/gateway/gateway.js";
import { startKvBridge } from "../services/kv-bridge/bridge.js";
import { type SimFleet, startSimFleet } from "../services/sim/fleet.js";
import { configBucketName, streamName } from "../streams/definitions.js";
import { MODEL, minuteStartClock, quietLog, startTestEnv, type TestEnv, waitFor } from "./harness/env.js";
import { bridgeCaughtUp, bridgeJoined } from "./harness/kv-bridge.js";

const BLOCK = 16;
/** A model served by one pod: a follow-up by `previous_response_id` finds its state there. */
const SOLO = "org/solo-model";

interface Release {
  id: string;
  promptTokens?: number;
  completionTokens?: number;
}

describe("Responses and Messages APIs - official clients, front, gateway, simulated pods", () => {
  let env: TestEnv;
  let fleet: SimFleet;
  let solo: SimFleet;
  let bridge: Awaited<ReturnType<typeof startKvBridge>>;
  let gw: GatewayHandle;
  let front: FrontServer;
  let base: string;
  const keys = { alice: "", limited: "", admin: "" };
  const decisions = new Map<string, DecisionRecord>();
  const releases = new Map<string, Release>();

  beforeAll(async () => {
    env = await startTestEnv();
    fleet = await startSimFleet({ pods: 3, model: MODEL, timeScale: 50, blockSize: BLOCK, kvCacheBlocks: 512, maxModelLen: 4096, kvEventsEncoding: "map", logger: quietLog });
    solo = await startSimFleet({ pods: 1, model: SOLO, namePrefix: "solo-", timeScale: 50, maxModelLen: 4096, kvEvents: false, logger: quietLog });
    for (const p of fleet.pods) await env.publishPod({ pod: p.name, address: p.address, kvEvents: p.kvEvents });
    for (const p of solo.pods) await env.publishPod({ pod: p.name, address: p.address, model: SOLO });
    bridge = await startKvBridge({ nats: env.server.url, log: quietLog });
    await bridgeJoined(bridge, 3);
    const kv = await new Kvm(env.nats.nc).open(configBucketName("jr"));
    const put = async (user: string, admin = false) => {
      const key = generateApiKey();
      await kv.create(apiKeyBucketKey(hashApiKey(key)), JSON.stringify({ user, createdAt: Date.now(), ...(admin ? { admin } : {}) }));
      return key;
    };
    keys.alice = await put("alice");
    keys.limited = await put("limited");
    keys.admin = await put("operator", true);
    await kv.put(RATE_LIMITS_KEY, JSON.stringify({ users: { limited: { tpm: 200 } } }));
    gw = await env.gateway({ id: "stateful-gw", auth: "required", tokenizerMode: "local", defaultStrategy: "prefix-cache", adminPort: 0, clock: minuteStartClock() });
    await waitFor(() => gw.apiKeys.size === 3, 5_000, "the keys to reach the gateway");
    front = await startFront({ port: 0, host: "127.0.0.1", gateways: [`127.0.0.1:${gw.port}`], logger: quietLog });
    base = `http://127.0.0.1:${front.port}`;
    env.nats.nc.subscribe(env.subjects.all("decisions"), { callback: (_e, m) => void decisions.set(m.json<DecisionRecord>().id, m.json<DecisionRecord>()) });
    env.nats.nc.subscribe(env.subjects.all("releases"), {
      callback: (_e, m) => {
        const r = m.json<Release & { releases?: Release[] }>();
        for (const x of r.releases ?? [r]) releases.set(x.id, x);
      },
    });
    await env.nats.nc.flush();
    // The gateway answers 503 until its views caught up with the pods and the limits.
    await waitFor(
      async () => {
        const r = await fetch(`${base}/v1/chat/completions`, { method: "POST", headers: { "content-type": "application/json", authorization: `Bearer ${keys.alice}` }, body: JSON.stringify({ model: SOLO, messages: [{ role: "user", content: "hi" }], max_tokens: 1 }) });
        await r.arrayBuffer();
        return r.status === 200;
      },
      10_000,
      "the gateway routes",
    );
  }, 60_000);
  afterAll(async () => {
    await front?.close();
    await bridge?.close();
    await solo?.close();
    await fleet?.close();
    await env?.stop();
  });

  const openai = (key = keys.alice) => new OpenAI({ baseURL: `${base}/v1`, apiKey: key, maxRetries: 0 });
  const anthropic = (key = keys.alice) => new Anthropic({ baseURL: base, apiKey: key, maxRetries: 0 });
  const decisionOf = async (id: string) => {
    await waitFor(() => decisions.has(id), 10_000, `the decision record of ${id}`);
    return decisions.get(id) as DecisionRecord;
  };
  /** The record of a finished request and its release, once both are published. */
  const settled = async (id: string) => {
    const rec = await decisionOf(id);
    await waitFor(() => releases.has(rec.charge as string), 10_000, `the release of ${id}`);
    return { rec, release: releases.get(rec.charge as string) as Release };
  };

  it("responses.create: the answer, and its usage in the decision record and the ledger's release", async () => {
    const r = await openai().responses.create({ model: SOLO, instructions: "Answer briefly.", input: "Which pod serves this?", max_output_tokens: 6 }, { headers: { "x-request-id": "resp-plain" } });
    expect(r.id).toMatch(/^resp_/);
    expect(r.status).toBe("completed");
    expect(r.output_text.length).toBeGreaterThan(0);
    expect(r.usage?.output_tokens).toBe(6);
    const { rec, release } = await settled("resp-plain");
    expect(rec).toMatchObject({ outcome: "completed", status: 200, model: SOLO, promptTokens: r.usage?.input_tokens, completionTokens: 6 });
    expect(release).toMatchObject({ promptTokens: r.usage?.input_tokens, completionTokens: 6 });
  });

  it("responses.stream: the events, the final response, usage and first token in the record", async () => {
    const stream = openai().responses.stream({ model: SOLO, input: [{ role: "user", content: [{ type: "input_text", text: "Stream me a few words." }] }], max_output_tokens: 5 }, { headers: { "x-request-id": "resp-stream" } });
    const types: string[] = [];
    let deltas = "";
    for await (const ev of stream) {
      types.push(ev.type);
      if (ev.type === "response.output_text.delta") deltas += ev.delta;
    }
    const final = await stream.finalResponse();
    expect(types[0]).toBe("response.created");
    expect(types.at(-1)).toBe("response.completed");
    expect(types.filter((t) => t === "response.output_text.delta")).toHaveLength(5);
    expect(final.output_text).toBe(deltas);
    const { rec, release } = await settled("resp-stream");
    expect(rec).toMatchObject({ outcome: "completed", promptTokens: final.usage?.input_tokens, completionTokens: 5 });
    expect(rec.ttftMs).toBeGreaterThanOrEqual(0);
    expect(release.completionTokens).toBe(5);
    // create({stream: true}) gives the same events.
    const raw = await openai().responses.create({ model: SOLO, input: "again", max_output_tokens: 2, stream: true });
    const seen: string[] = [];
    for await (const ev of raw) seen.push(ev.type);
    expect(seen.at(-1)).toBe("response.completed");
  });

  it("multi-turn by previous_response_id: each turn carries the chain, counted in its usage", async () => {
    const client = openai();
    const t1 = await client.responses.create({ model: SOLO, instructions: "You are terse.", input: "First question?", max_output_tokens: 4 }, { headers: { "x-request-id": "turn-1" } });
    const t2 = await client.responses.create({ model: SOLO, previous_response_id: t1.id, input: "Second question?", max_output_tokens: 4 }, { headers: { "x-request-id": "turn-2" } });
    const t3 = await client.responses.create({ model: SOLO, previous_response_id: t2.id, input: "Third?", max_output_tokens: 4 }, { headers: { "x-request-id": "turn-3" } });
    expect(t2.previous_response_id).toBe(t1.id);
    expect(t3.previous_response_id).toBe(t2.id);
    // The engine prepends the earlier turns: the prompt grows with each.
    const inputs = [t1, t2, t3].map((t) => t.usage?.input_tokens ?? 0);
    expect(inputs[1]).toBeGreaterThan(inputs[0] as number);
    expect(inputs[2]).toBeGreaterThan(inputs[1] as number);
    // The ledger counts the engine's numbers, chain included.
    expect((await settled("turn-3")).release.promptTokens).toBe(inputs[2]);
    // An id no pod holds: the engine's 404, as the OpenAI client's typed error.
    const err = await client.responses.create({ model: SOLO, previous_response_id: "resp_unknown", input: "x" }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(OpenAI.NotFoundError);
    expect((err as InstanceType<typeof OpenAI.NotFoundError>).message).toMatch(/resp_unknown/);
  });

  it("a malformed Responses body is a 400 naming the field, before routing", async () => {
    const err = await openai()
      .responses.create({ model: SOLO, input: [{ type: "item_reference", id: "x" }] as never })
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(OpenAI.BadRequestError);
    expect((err as { error: { param: string; code: string } }).error).toMatchObject({ param: "input[0].type", code: "invalid_request_body" });
  });

  it("messages.create and messages.stream with x-api-key: answers, usage in the records and releases", async () => {
    const client = anthropic();
    const m = await client.messages.create({ model: SOLO, max_tokens: 6, system: "Be brief.", messages: [{ role: "user", content: "Which pod?" }] }, { headers: { "x-request-id": "msg-plain" } });
    expect(m.type).toBe("message");
    expect(m.content[0]?.type).toBe("text");
    expect(m.usage.output_tokens).toBe(6);
    const plain = await settled("msg-plain");
    expect(plain.rec).toMatchObject({ outcome: "completed", promptTokens: m.usage.input_tokens, completionTokens: 6 });
    expect(plain.release.completionTokens).toBe(6);

    const stream = client.messages.stream({ model: SOLO, max_tokens: 5, messages: [{ role: "user", content: [{ type: "text", text: "Stream, please." }] }] }, { headers: { "x-request-id": "msg-stream" } });
    let text = "";
    stream.on("text", (t) => {
      text += t;
    });
    const final = await stream.finalMessage();
    expect(final.usage.output_tokens).toBe(5);
    expect(final.stop_reason).toBe("max_tokens");
    expect((final.content[0] as { text: string }).text).toBe(text);
    const streamed = await settled("msg-stream");
    expect(streamed.rec).toMatchObject({ promptTokens: final.usage.input_tokens, completionTokens: 5 });
    expect(streamed.rec.ttftMs).toBeGreaterThanOrEqual(0);
  });

  it("errors on /v1/messages are Anthropic's shape, seen by the SDK as its typed errors", async () => {
    const unknown = await anthropic()
      .messages.create({ model: "nobody/serves-this", max_tokens: 4, messages: [{ role: "user", content: "x" }] })
      .catch((e: unknown) => e);
    expect(unknown).toBeInstanceOf(Anthropic.NotFoundError);
    expect((unknown as { error: unknown }).error).toMatchObject({ type: "error", error: { type: "not_found_error" } });
    const badKey = await anthropic("sk-not-a-key")
      .messages.create({ model: SOLO, max_tokens: 4, messages: [{ role: "user", content: "x" }] })
      .catch((e: unknown) => e);
    expect(badKey).toBeInstanceOf(Anthropic.AuthenticationError);
    expect((badKey as { error: unknown }).error).toMatchObject({ type: "error", error: { type: "authentication_error" } });
    // An engine's own error (the prompt plus max_tokens beyond the context): normalised, then Anthropic-shaped.
    const tooLong = await anthropic()
      .messages.create({ model: SOLO, max_tokens: 5_000, messages: [{ role: "user", content: "x" }] })
      .catch((e: unknown) => e);
    expect(tooLong).toBeInstanceOf(Anthropic.BadRequestError);
    expect((tooLong as { error: unknown }).error).toMatchObject({ type: "error", error: { type: "invalid_request_error", message: expect.stringMatching(/maximum context length is 4096 tokens/) } });
    // A Messages sub-path the gateway does not route: still Anthropic's shape.
    const countTokens = await fetch(`${base}/v1/messages/count_tokens`, { method: "POST", headers: { "content-type": "application/json", "x-api-key": keys.alice }, body: JSON.stringify({ model: SOLO, messages: [{ role: "user", content: "x" }] }) });
    expect(countTokens.status).toBe(404);
    expect(((await countTokens.json()) as { error: { type: string } }).error.type).toBe("not_found_error");
    const noMax = await fetch(`${base}/v1/messages`, { method: "POST", headers: { "content-type": "application/json", "x-api-key": keys.alice }, body: JSON.stringify({ model: SOLO, messages: [{ role: "user", content: "x" }] }) });
    expect(noMax.status).toBe(400);
    expect(await noMax.json()).toEqual({ type: "error", error: { type: "invalid_request_error", message: "invalid_request_body: `max_tokens` is required" } });
  });

  it("a user's tokens-per-minute limit counts the Messages API's output tokens: the next request is a RateLimitError", async () => {
    const client = anthropic(keys.limited);
    // ~20 prompt tokens admitted against 200; the engine then reports 250 output tokens.
    const first = await client.messages.create({ model: SOLO, max_tokens: 250, messages: [{ role: "user", content: "Write at length." }] }, { headers: { "x-request-id": "tpm-1" } });
    expect(first.usage.output_tokens).toBe(250);
    await settled("tpm-1");
    const err = await client.messages.create({ model: SOLO, max_tokens: 4, messages: [{ role: "user", content: "More." }] }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(Anthropic.RateLimitError);
    expect((err as { error: unknown }).error).toMatchObject({ type: "error", error: { type: "rate_limit_error" } });
  });

  describe("prefix routing on rendered prompts", () => {
    /** Waits until what the engines cached is in the gateway's prefix index. */
    const indexed = async () => {
      await bridgeCaughtUp(fleet, bridge);
      const last = (await env.nats.jsm.streams.info(streamName("jr", "KV"))).state.last_seq;
      await waitFor(() => gw.kvLastSeq() >= last, 10_000, "the gateway caught up with KV");
    };
    const matched = (rec: DecisionRecord) => Object.fromEntries(rec.candidates.map((c) => [c.pod, c.score]));

    it("two Responses requests sharing long instructions go to the pod that cached them", async () => {
      const instructions = `Agent instructions: ${"read the repository, plan the change, write the patch, run the tests. ".repeat(12)}`;
      await openai().responses.create({ model: MODEL, instructions, input: "task one", max_output_tokens: 2 }, { headers: { "x-request-id": "px-resp-1" } });
      const first = await decisionOf("px-resp-1");
      expect(first.fallback).toBe("least-request (no match)");
      await indexed();
      await openai().responses.create({ model: MODEL, instructions, input: [{ role: "user", content: "task two, different" }], max_output_tokens: 2 }, { headers: { "x-request-id": "px-resp-2" } });
      const second = await decisionOf("px-resp-2");
      expect(second.pick).toBe(first.pick);
      expect(second.fallback).toBeUndefined();
      expect(matched(second)[first.pick as string]).toBeGreaterThanOrEqual(8);
      // /debug/explain reads a body as the API its `path` names: the same match, nothing charged.
      const explain = async (path: string) => {
        const res = await fetch(`http://127.0.0.1:${gw.adminPort}/debug/explain?path=${encodeURIComponent(path)}`, {
          method: "POST",
          headers: { authorization: `Bearer ${keys.admin}`, "x-request-id": "px-explain" },
          body: JSON.stringify({ model: MODEL, instructions, input: "task three", max_output_tokens: 2 }),
        });
        return { status: res.status, body: (await res.json()) as { pick?: { pod: string }; fallback?: string; error?: { param: string } } };
      };
      const explained = await explain("/v1/responses");
      expect(explained.status).toBe(200);
      expect(explained.body.pick?.pod).toBe(first.pick);
      expect(explained.body.fallback).toBeUndefined();
      expect((await explain("/v1/nope")).body.error?.param).toBe("path");
      // Read as a chat body (no `messages`: no prompt to match), the same request falls back.
      expect((await explain("/v1/chat/completions")).body.fallback).toMatch(/^least-request/);
    });

    it("two Messages requests sharing a long system prompt go to the pod that cached it", async () => {
      const system = [{ type: "text" as const, text: `Claude-style system prompt: ${"use the tools, cite the files you read, keep answers short. ".repeat(12)}` }];
      await anthropic().messages.create({ model: MODEL, max_tokens: 2, system, messages: [{ role: "user", content: "question one" }] }, { headers: { "x-request-id": "px-msg-1" } });
      const first = await decisionOf("px-msg-1");
      expect(first.fallback).toBe("least-request (no match)");
      await indexed();
      await anthropic().messages.create({ model: MODEL, max_tokens: 2, system, messages: [{ role: "user", content: "question two" }] }, { headers: { "x-request-id": "px-msg-2" } });
      const second = await decisionOf("px-msg-2");
      expect(second.pick).toBe(first.pick);
      expect(matched(second)[first.pick as string]).toBeGreaterThanOrEqual(8);
    });
  });
});
