/**
 * Prefill/decode disaggregation against real simulated pods over HTTP and the real KV channel
 * sockets: vLLM's kv_transfer_params legs, SGLang's bootstrap legs, fault injection, abort.
 */
import { afterEach, describe, expect, it } from "vitest";
import { type SimFleet, startSimFleet } from "./fleet.js";
import { waitFor } from "../../test/harness/wait.js";
import { json, metricValue, postJson, scrape, sseData } from "./testing.js";

const MODEL = "demo/llama-3.1-8b";
const fleets: SimFleet[] = [];

async function fleet(options: Partial<Parameters<typeof startSimFleet>[0]> = {}): Promise<SimFleet> {
  const f = await startSimFleet({ pods: 2, model: MODEL, timeScale: 100, role: ["prefill", "decode"], ...options });
  fleets.push(f);
  return f;
}

afterEach(async () => {
  await Promise.all(fleets.splice(0).map((f) => f.close()));
});

const addr = (f: SimFleet, i: number): string => f.pods[i]?.address ?? "";
const state = (address: string) => json(fetch(`http://${address}/debug/state`));
type State = Awaited<ReturnType<typeof state>>;
const PROMPT = "Disaggregated serving moves the prompt's KV cache between engines. ".repeat(8);
const withId = (id: string): RequestInit => ({ headers: { "content-type": "application/json", "x-request-id": id } });

/** The prefill leg exactly as engines.md §5 describes it. */
const prefillLeg = (extra: object = {}) => ({
  model: MODEL,
  prompt: PROMPT,
  max_tokens: 1,
  stream: false,
  kv_transfer_params: {
    do_remote_decode: true,
    do_remote_prefill: false,
    remote_engine_id: null,
    remote_block_ids: null,
    remote_host: null,
    remote_port: null,
  },
  ...extra,
});

async function runPrefill(address: string, id: string) {
  const res = await postJson(address, "/v1/completions", prefillLeg(), withId(id));
  // The body says why, should a prefill fail (it did on loaded runs: the engine finished the prefill
  // inside submit; services/sim/generate.test.ts covers that case).
  expect(res.status, res.status === 200 ? "" : await res.clone().text()).toBe(200);
  return json(res);
}

describe("vLLM prefill/decode legs", () => {
  it("prefill holds its blocks and answers the params; the decode reads them and decodes without prefill", async () => {
    const f = await fleet();
    const [prefill, decode] = [addr(f, 0), addr(f, 1)];
    const p = await runPrefill(prefill, "req-pd-1");
    expect(p.usage.completion_tokens).toBe(1);
    const params = p.kv_transfer_params;
    expect(params).toMatchObject({
      do_remote_prefill: true,
      do_remote_decode: false,
      remote_request_id: "req-pd-1",
      remote_host: "127.0.0.1",
      tp_size: 1,
    });
    expect(typeof params.remote_engine_id).toBe("string");
    expect(Number.isInteger(params.remote_port)).toBe(true);
    const blocks = Math.ceil(p.usage.prompt_tokens / 16);
    expect(params.remote_block_ids).toHaveLength(blocks);
    // Held: counted as used KV until the decode reads it.
    const held = await state(prefill);
    expect(held.pd.heldRequests).toBe(1);
    expect(held.usedBlocks).toBe(blocks);
    expect(metricValue(await scrape(prefill), "jetroute_sim_kv_transfer_held_requests")).toBe(1);
    expect(metricValue(await scrape(prefill), "vllm:kv_cache_usage_perc")).toBeGreaterThan(0);

    const res = await postJson(
      decode,
      "/v1/completions",
      { model: MODEL, prompt: PROMPT, max_tokens: 6, stream: true, kv_transfer_params: params },
      withId("req-pd-1"),
    );
    expect(res.status).toBe(200);
    const events = sseData(await res.text());
    expect(events.at(-1)).toBe("[DONE]");
    expect(events).toHaveLength(7);

    const after = await state(prefill);
    expect(after.pd.heldRequests).toBe(0);
    expect(after.usedBlocks).toBe(0);
    const d = await state(decode);
    expect(d.pd).toMatchObject({ reads: 1, misses: 0, localPrefills: 0, leaks: 0 });
    expect(Object.values(d.pd.failures)).toEqual([0, 0, 0, 0]);
    const text = await scrape(decode);
    expect(metricValue(text, "jetroute_sim_kv_transfer_reads_total")).toBe(1);
    expect(metricValue(text, "jetroute_sim_kv_transfer_misses_total")).toBe(0);
    // The decode pod cached the transferred prompt (and announced it), as a vLLM decode does.
    expect((await json(fetch(`http://${decode}/debug/cache`))).blocks.length).toBeGreaterThanOrEqual(blocks - 1);
  });

  it("a second read of the same request is unknown: the decode recomputes and counts the failure", async () => {
    const f = await fleet();
    const p = await runPrefill(addr(f, 0), "req-twice");
    const decodeBody = { model: MODEL, prompt: PROMPT, max_tokens: 2, kv_transfer_params: p.kv_transfer_params };
    expect((await postJson(addr(f, 1), "/v1/completions", decodeBody)).status).toBe(200);
    const again = await postJson(addr(f, 1), "/v1/completions", decodeBody);
    expect(again.status).toBe(200);
    expect((await json(again)).usage.completion_tokens).toBe(2);
    expect((await state(addr(f, 1))).pd).toMatchObject({ reads: 1, failures: { unknown_request: 1 } });
  });

  it("incomplete params are a transfer miss (computed locally); no params on a decode pod a local prefill", async () => {
    const f = await fleet();
    const p = await runPrefill(addr(f, 0), "req-miss");
    const { remote_host: _dropped, ...incomplete } = p.kv_transfer_params;
    const res = await postJson(addr(f, 1), "/v1/completions", { model: MODEL, prompt: PROMPT, max_tokens: 3, kv_transfer_params: { ...incomplete, remote_host: null } });
    expect(res.status).toBe(200);
    expect((await json(res)).usage.completion_tokens).toBe(3);
    const plain = await postJson(addr(f, 1), "/v1/completions", { model: MODEL, prompt: PROMPT, max_tokens: 3 });
    expect(plain.status).toBe(200);
    expect((await state(addr(f, 1))).pd).toMatchObject({ reads: 0, misses: 1, localPrefills: 1 });
    // Nobody read the prefill's KV: it is still held.
    expect((await state(addr(f, 0))).pd.heldRequests).toBe(1);
  });

  it.each([
    ["refuse", {}, "refused"],
    ["drop", {}, "timeout"],
    ["delay", { sideChannelDelayMs: 2_000 }, "timeout"],
  ] as const)("side channel %s: the failure is counted and the decode still answers", async (mode, extra, reason) => {
    const f = await fleet({ kvReadTimeoutMs: 200 });
    const p = await runPrefill(addr(f, 0), `req-${mode}`);
    f.setFaults(f.pods[0]?.name ?? "", { sideChannel: mode, ...extra });
    const res = await postJson(addr(f, 1), "/v1/chat/completions", {
      model: MODEL,
      messages: [{ role: "user", content: PROMPT }],
      max_tokens: 4,
      kv_transfer_params: p.kv_transfer_params,
    });
    expect(res.status).toBe(200);
    expect((await json(res)).usage.completion_tokens).toBe(4);
    const d = await state(addr(f, 1));
    expect(d.pd.reads).toBe(0);
    expect(d.pd.failures[reason]).toBe(1);
    expect(metricValue(await scrape(addr(f, 1)), "jetroute_sim_kv_transfer_failures_total", { reason })).toBe(1);
  });

  it("a delayed side channel that answers within the read timeout still transfers", async () => {
    const f = await fleet({ kvReadTimeoutMs: 2_000 });
    const p = await runPrefill(addr(f, 0), "req-slow");
    f.setFaults(f.pods[0]?.name ?? "", { sideChannel: "delay", sideChannelDelayMs: 50 });
    const res = await postJson(addr(f, 1), "/v1/completions", { model: MODEL, prompt: PROMPT, max_tokens: 2, kv_transfer_params: p.kv_transfer_params });
    expect(res.status).toBe(200);
    expect((await state(addr(f, 1))).pd.reads).toBe(1);
  });

  it("frees a prefill's blocks after kvAbortTimeoutMs without a decode and counts a leak", async () => {
    // 2 simulated seconds at time scale 100: 20 wall ms.
    const f = await fleet({ kvAbortTimeoutMs: 2_000 });
    await runPrefill(addr(f, 0), "req-leak");
    let s: State;
    await waitFor(async () => (s = await state(addr(f, 0))).pd.leaks === 1, 5_000, "a leak counted", 10);
    expect(s.pd).toMatchObject({ leaks: 1, heldRequests: 0 });
    expect(s.usedBlocks).toBe(0);
    expect(metricValue(await scrape(addr(f, 0)), "jetroute_sim_kv_transfer_leaks_total")).toBe(1);
  });

  it("a prefill leg whose client leaves frees its blocks without a leak", async () => {
    // Slow prefill (1 simulated ms per token, real time) so the client leaves mid-prefill.
    const f = await fleet({ timeScale: 1, prefillMsPerToken: 20, kvAbortTimeoutMs: 1 });
    const ac = new AbortController();
    const pending = postJson(addr(f, 0), "/v1/completions", prefillLeg(), { ...withId("req-gone"), signal: ac.signal }).catch((e: Error) => e);
    await waitFor(async () => (await state(addr(f, 0))).running === 1, 5_000, "the prefill running", 10);
    ac.abort();
    await pending;
    let s: State;
    await waitFor(
      async () => {
        s = await state(addr(f, 0));
        return s.running === 0 && s.usedBlocks === 0;
      },
      5_000,
      "nothing running, no block used",
      10,
    );
    expect(s.running).toBe(0);
    expect(s.usedBlocks).toBe(0);
    expect(s.pd).toMatchObject({ leaks: 0, heldRequests: 0 });
    expect(s.totals.finished.abort).toBe(1);
  });

  it("a restart forgets held KV: the old params then read as unknown", async () => {
    const f = await fleet();
    const p = await runPrefill(addr(f, 0), "req-restart");
    f.restart(f.pods[0]?.name ?? "");
    expect((await state(addr(f, 0))).pd.heldRequests).toBe(0);
    const res = await postJson(addr(f, 1), "/v1/completions", { model: MODEL, prompt: PROMPT, max_tokens: 2, kv_transfer_params: p.kv_transfer_params });
    expect(res.status).toBe(200);
    expect((await state(addr(f, 1))).pd.failures.unknown_request).toBe(1);
  });

  it("a prefill leg on a decode pod is served without holding anything", async () => {
    const f = await fleet({ pods: 1, role: "decode" });
    const body = await json(postJson(addr(f, 0), "/v1/completions", prefillLeg()));
    expect(body.kv_transfer_params).toBeUndefined();
    expect((await state(addr(f, 0))).pd.heldRequests).toBe(0);
  });

  it("a combined pod serves both legs itself", async () => {
    const f = await fleet({ pods: 1, role: "combined" });
    const p = await runPrefill(addr(f, 0), "req-both");
    const res = await postJson(addr(f, 0), "/v1/completions", { model: MODEL, prompt: PROMPT, max_tokens: 2, kv_transfer_params: p.kv_transfer_params });
    expect(res.status).toBe(200);
    expect((await state(addr(f, 0))).pd).toMatchObject({ reads: 1, heldRequests: 0 });
  });
});

const ROOM = "9223372036854775807";
const ROOM_NEIGHBOUR = "9223372036854775806"; // the same JS number as ROOM

describe("SGLang prefill/decode legs", () => {
  const sglang = () => fleet({ engine: "sglang" });
  /** Both legs share the body; the room goes in as raw JSON text so no digit is lost on our side. */
  const legBody = (f: SimFleet, room: string, asString: boolean, extra: Record<string, unknown> = {}): string => {
    const base = JSON.stringify({
      model: MODEL,
      prompt: PROMPT,
      max_tokens: 5,
      rid: `rid-${room}`,
      bootstrap_host: "127.0.0.1",
      bootstrap_port: f.pods[0]?.bootstrapPort,
      ...extra,
    });
    return `${base.slice(0, -1)},"bootstrap_room":${asString ? `"${room}"` : room}}`;
  };

  it.each([
    ["prefill first", false],
    ["decode first", true],
  ])("%s, non-streaming: the prefill answers after the decode took the KV", async (_name, decodeFirst) => {
    const f = await sglang();
    expect(f.pods[0]?.bootstrapPort).toBeGreaterThan(0);
    expect(f.pods[1]?.bootstrapPort).toBeUndefined();
    const sendPrefill = () => postJson(addr(f, 0), "/v1/completions", legBody(f, ROOM, false));
    const sendDecode = () => postJson(addr(f, 1), "/v1/completions", legBody(f, ROOM, true));
    let first: Promise<Response>;
    let second: Promise<Response>;
    if (decodeFirst) {
      first = sendDecode();
      await waitFor(async () => (await state(addr(f, 1))).pd.decodePreallocQueue === 1, 5_000, "the decode in the prealloc queue", 10);
      second = sendPrefill();
    } else {
      first = sendPrefill();
      await waitFor(async () => (await state(addr(f, 0))).pd.prefillBootstrapQueue === 1, 5_000, "the prefill in the bootstrap queue", 10);
      expect(metricValue(await scrape(addr(f, 0)), "sglang:num_prefill_bootstrap_queue_reqs")).toBe(1);
      second = sendDecode();
    }
    const [a, b] = await Promise.all([first, second]);
    const [decodeRes, prefillRes] = decodeFirst ? [a, b] : [b, a];
    expect(prefillRes.status).toBe(200);
    expect((await json(prefillRes)).usage.completion_tokens).toBe(1);
    expect(decodeRes.status).toBe(200);
    expect((await json(decodeRes)).usage.completion_tokens).toBe(5);
    const p = await state(addr(f, 0));
    expect(p.pd).toMatchObject({ heldRequests: 0, prefillBootstrapQueue: 0, leaks: 0 });
    expect(p.usedBlocks).toBe(0);
    const d = await state(addr(f, 1));
    expect(d.pd).toMatchObject({ reads: 1, decodePreallocQueue: 0 });
    expect(metricValue(await scrape(addr(f, 1)), "sglang:num_decode_prealloc_queue_reqs")).toBe(0);
  });

  it("streams the decode leg when both legs are sent at once", async () => {
    const f = await sglang();
    const [prefillRes, decodeRes] = await Promise.all([
      postJson(addr(f, 0), "/v1/chat/completions", legBody(f, "42", false, { messages: [{ role: "user", content: PROMPT }], prompt: undefined, stream: true })),
      postJson(addr(f, 1), "/v1/chat/completions", legBody(f, "42", false, { messages: [{ role: "user", content: PROMPT }], prompt: undefined, stream: true })),
    ]);
    expect(prefillRes.status).toBe(200);
    expect(prefillRes.headers.get("content-type")).toMatch(/application\/json/);
    const events = sseData(await decodeRes.text());
    expect(events.at(-1)).toBe("[DONE]");
    expect(events.filter((e) => e !== "[DONE]" && JSON.parse(e).choices[0]?.delta?.content)).toHaveLength(5);
    expect((await state(addr(f, 1))).pd.reads).toBe(1);
  });

  it("compares rooms exactly: a room one apart (the same JS number) does not match", async () => {
    const f = await fleet({ engine: "sglang", disaggTimeoutMs: 3_000 });
    const [prefillRes, decodeRes] = await Promise.all([
      postJson(addr(f, 0), "/v1/completions", legBody(f, ROOM, false)),
      postJson(addr(f, 1), "/v1/completions", legBody(f, ROOM_NEIGHBOUR, false)),
    ]);
    expect(prefillRes.status).toBe(500);
    expect(decodeRes.status).toBe(500);
    expect((await state(addr(f, 0))).pd.leaks).toBe(1);
    expect((await state(addr(f, 1))).pd.failures.timeout).toBe(1);
  });

  it("bootstrap drop: the decode times out (stream: error event, then end) and the prefill leaks", async () => {
    const f = await fleet({ engine: "sglang", disaggTimeoutMs: 5_000 });
    f.setFaults(f.pods[0]?.name ?? "", { bootstrap: "drop" });
    const [prefillRes, decodeRes] = await Promise.all([
      postJson(addr(f, 0), "/v1/completions", legBody(f, "7", false)),
      postJson(addr(f, 1), "/v1/completions", legBody(f, "7", false, { stream: true })),
    ]);
    expect(decodeRes.status).toBe(200);
    const events = sseData(await decodeRes.text());
    expect(JSON.parse(events[0] ?? "{}").error).toMatchObject({ code: 500 });
    expect(events.at(-1)).toBe("[DONE]");
    expect(prefillRes.status).toBe(500);
    expect((await json(prefillRes)).error.message).toContain("timed out");
    expect((await state(addr(f, 1))).pd.failures.timeout).toBe(1);
    const p = await state(addr(f, 0));
    expect(p.pd).toMatchObject({ leaks: 1, heldRequests: 0, prefillBootstrapQueue: 0 });
    expect(p.usedBlocks).toBe(0);
  });

  it("bootstrap refuse: a non-streaming decode fails at once with a 500", async () => {
    const f = await sglang();
    f.setFaults(f.pods[0]?.name ?? "", { bootstrap: "refuse" });
    const res = await postJson(addr(f, 1), "/v1/completions", legBody(f, "8", false));
    expect(res.status).toBe(500);
    expect((await json(res)).error).toMatchObject({ type: "InternalServerError", code: 500 });
    expect((await state(addr(f, 1))).pd.failures.refused).toBe(1);
  });

  it("/abort_request ends a waiting decode with finish_reason abort; an unknown rid is fine too", async () => {
    const f = await sglang();
    const pending = postJson(addr(f, 1), "/v1/completions", legBody(f, "9", false, { stream: true }));
    await waitFor(async () => (await state(addr(f, 1))).pd.decodePreallocQueue === 1, 5_000, "the decode in the prealloc queue", 10);
    const unknown = await postJson(addr(f, 1), "/abort_request", { rid: "nobody", abort_all: false });
    expect(unknown.status).toBe(200);
    expect((await state(addr(f, 1))).pd.decodePreallocQueue).toBe(1);
    expect((await postJson(addr(f, 1), "/abort_request", { rid: "rid-9", abort_all: false })).status).toBe(200);
    const res = await pending;
    const events = sseData(await res.text());
    expect(events.at(-1)).toBe("[DONE]");
    expect(JSON.parse(events.at(-2) ?? "{}").choices[0].finish_reason).toBe("abort");
    const d = await state(addr(f, 1));
    expect(d.pd).toMatchObject({ decodePreallocQueue: 0, failures: { timeout: 0, refused: 0 } });
  });

  it("/abort_request ends a running request and a prefill waiting for its decode, freeing their blocks", async () => {
    const f = await fleet({ engine: "sglang", pods: 2, timeScale: 1, decodeMsPerStep: 50 });
    const prefill = postJson(addr(f, 0), "/v1/completions", legBody(f, "10", false));
    const plain = postJson(addr(f, 0), "/v1/completions", { model: MODEL, prompt: "a plain request", max_tokens: 1000, rid: "plain-1" });
    await waitFor(
      async () => {
        const v = await state(addr(f, 0));
        return v.pd.prefillBootstrapQueue === 1 && v.running === 1;
      },
      5_000,
      "the prefill in the bootstrap queue and the plain request running",
      10,
    );
    await postJson(addr(f, 0), "/abort_request", { rid: "rid-10" });
    await postJson(addr(f, 0), "/abort_request", { rid: "plain-1" });
    const [p, q] = await Promise.all([prefill, plain]);
    expect((await json(p)).choices[0].finish_reason).toBe("abort");
    expect((await json(q)).choices[0].finish_reason).toBe("abort");
    const s = await state(addr(f, 0));
    expect(s).toMatchObject({ running: 0, usedBlocks: 0 });
    expect(s.pd).toMatchObject({ leaks: 0, heldRequests: 0, prefillBootstrapQueue: 0 });
  });

  it("a restart drops a prefill waiting for its decode and a decode waiting for its room", async () => {
    const f = await sglang();
    const prefill = postJson(addr(f, 0), "/v1/completions", legBody(f, "11", false)).catch((e: Error) => e);
    const decode = postJson(addr(f, 1), "/v1/completions", legBody(f, "12", false)).catch((e: Error) => e);
    await waitFor(async () => (await state(addr(f, 0))).pd.prefillBootstrapQueue === 1, 5_000, "the prefill in the bootstrap queue", 10);
    await waitFor(async () => (await state(addr(f, 1))).pd.decodePreallocQueue === 1, 5_000, "the decode in the prealloc queue", 10);
    f.restart(f.pods[0]?.name ?? "");
    f.restart(f.pods[1]?.name ?? "");
    expect(await prefill).toBeInstanceOf(Error);
    expect(await decode).toBeInstanceOf(Error);
    const p = await state(addr(f, 0));
    expect(p.pd).toMatchObject({ heldRequests: 0, prefillBootstrapQueue: 0, leaks: 0 });
    expect(p.usedBlocks).toBe(0);
  });

  it("a decode pod refuses a request without bootstrap fields", async () => {
    const f = await sglang();
    const res = await postJson(addr(f, 1), "/v1/completions", { model: MODEL, prompt: "x" });
    expect(res.status).toBe(400);
    expect((await json(res)).error.message).toContain("bootstrap");
    const bad = await postJson(addr(f, 1), "/v1/completions", legBody(f, "-1", false));
    expect(bad.status).toBe(400);
  });

  it("takes bootstrap ports from bootstrapBasePort", async () => {
    const probe = await startSimFleet({ pods: 1, model: MODEL, engine: "sglang", role: "prefill" });
    const port = probe.pods[0]?.bootstrapPort ?? 0;
    await probe.close();
    const f = await fleet({ engine: "sglang", bootstrapBasePort: port, roleset: "rs-a" });
    expect(f.pods.map((p) => [p.role, p.roleset, p.bootstrapPort])).toEqual([
      ["prefill", "rs-a", port],
      ["decode", "rs-a", undefined],
    ]);
  });
});

describe("fault injection", () => {
  it("answers the next `count` completion requests with the status, then serves again", async () => {
    const f = await fleet({ pods: 1, role: "combined" });
    const set = await postJson(addr(f, 0), "/debug/faults", { status: 503, count: 2 });
    expect(await json(set)).toMatchObject({ status: 503, count: 2 });
    for (let i = 0; i < 2; i++) {
      const res = await postJson(addr(f, 0), "/v1/completions", { model: MODEL, prompt: "x", max_tokens: 1 });
      expect(res.status).toBe(503);
      expect((await json(res)).error).toMatchObject({ code: 503 });
    }
    expect((await postJson(addr(f, 0), "/v1/completions", { model: MODEL, prompt: "x", max_tokens: 1 })).status).toBe(200);
    expect((await postJson(addr(f, 0), "/debug/faults", { status: 99 })).status).toBe(400);
    expect((await postJson(addr(f, 0), "/debug/faults", { sideChannel: "maybe" })).status).toBe(400);
  });

  it("hangs completion requests until cleared, and forgets a hung request whose client left", async () => {
    const f = await fleet({ pods: 1, role: "combined" });
    f.setFaults(f.pods[0]?.name ?? "", { hang: true });
    const ac = new AbortController();
    const leaving = postJson(addr(f, 0), "/v1/completions", { model: MODEL, prompt: "x", max_tokens: 1 }, { signal: ac.signal }).catch((e: Error) => e);
    let answered = false;
    const staying = postJson(addr(f, 0), "/v1/completions", { model: MODEL, prompt: "x", max_tokens: 1 }).finally(() => {
      answered = true;
    });
    let hung = -1;
    await waitFor(async () => (hung = (await state(addr(f, 0))).hungRequests) === 2, 5_000, "two hung requests", 10);
    expect(hung).toBe(2);
    ac.abort();
    expect(await leaving).toBeInstanceOf(Error);
    await waitFor(async () => (hung = (await state(addr(f, 0))).hungRequests) === 1, 5_000, "one hung request", 10);
    expect(hung).toBe(1);
    expect(answered).toBe(false);
    expect((await state(addr(f, 0))).totals.requests).toBe(0);
    expect((await postJson(addr(f, 0), "/debug/faults", {})).status).toBe(200);
    expect((await staying).status).toBe(200);
    expect((await state(addr(f, 0))).totals.requests).toBe(1);
  });

  it("stop refuses connections and start serves again on the same port", async () => {
    const f = await fleet({ pods: 1, role: "prefill" });
    const p = await runPrefill(addr(f, 0), "req-stop");
    await f.stop(f.pods[0]?.name ?? "");
    await expect(fetch(`http://${addr(f, 0)}/health`)).rejects.toThrow();
    await f.start(f.pods[0]?.name ?? "");
    expect((await fetch(`http://${addr(f, 0)}/health`)).status).toBe(200);
    // The engine kept its state, the side channel listens again on its port.
    expect((await state(addr(f, 0))).pd.heldRequests).toBe(1);
    expect((await state(addr(f, 0))).sideChannel.port).toBe(p.kv_transfer_params.remote_port);
  });
});
