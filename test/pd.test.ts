/**
 * Prefill/decode disaggregation end to end: client -> dev front (Envoy's part, applying the
 * gateway's body mutation) -> ext_proc -> two gateway replicas on one NATS -> simulated vLLM and
 * SGLang prefill and decode pods that enforce the handoff protocol (services/sim/pd-legs.ts).
 * After every scenario the ledgers of both replicas return to zero.
 */
import { randomUUID } from "node:crypto";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import type { DecisionRecord } from "../schemas/events.js";
import { startFront, type FrontServer } from "../services/front/front.js";
import type { GatewayHandle } from "../services/gateway/gateway.js";
import { type SimFleet, startSimFleet } from "../services/sim/fleet.js";
import { MODEL, quietLog, startTestEnv, type TestEnv, waitFor } from "./harness/env.js";

interface PdState {
  reads: number;
  misses: number;
  localPrefills: number;
  failures: Record<string, number>;
  leaks: number;
  heldRequests: number;
  decodePreallocQueue?: number;
  prefillBootstrapQueue?: number;
}

const SG_MODEL = "org/sglang-model";

const PD = { prefillTimeoutMs: 2_000, maxRetries: 2, firstChunkTimeoutMs: 1_500, idleTimeoutMs: 1_500 };

describe("P/D - vLLM and SGLang through the front, two replicas", () => {
  let env: TestEnv;
  let vllm: SimFleet;
  let sglang: SimFleet;
  let gws: GatewayHandle[] = [];
  let front: FrontServer;
  let base: string;
  const decisions: DecisionRecord[] = [];
  const perReplica: Array<{ front: FrontServer; base: string }> = [];

  beforeAll(async () => {
    env = await startTestEnv();
    vllm = await startSimFleet({ pods: 6, model: MODEL, role: ["prefill", "prefill", "prefill", "decode", "decode", "decode"], roleset: "rs-a", namePrefix: "v", decodeMsPerStep: 5, logger: quietLog });
    sglang = await startSimFleet({ pods: 2, model: SG_MODEL, engine: "sglang", role: ["prefill", "decode"], roleset: "rs-s", namePrefix: "s", decodeMsPerStep: 5, disaggTimeoutMs: 60_000, logger: quietLog });
    for (const p of [...vllm.pods, ...sglang.pods]) {
      await env.publishPod({ model: p.engine === "sglang" ? SG_MODEL : MODEL, pod: p.name, address: p.address, engine: p.engine, role: p.role, ...(p.roleset ? { roleset: p.roleset } : {}), ...(p.bootstrapPort ? { bootstrapPort: p.bootstrapPort } : {}) });
    }
    // AIBrix's response headers, pod addresses included.
    gws = [await env.gateway({ id: "pd-gw-1", defaultStrategy: "pd", pd: PD, exposePodAddresses: true }), await env.gateway({ id: "pd-gw-2", defaultStrategy: "pd", pd: PD, exposePodAddresses: true })];
    await waitFor(() => gws.every((g) => g.views.pods.readyPods(MODEL).length === 6 && g.views.pods.readyPods(SG_MODEL).length === 2), 5_000, "pods in both replicas");
    front = await startFront({ port: 0, host: "127.0.0.1", gateways: gws.map((g) => `127.0.0.1:${g.port}`), logger: quietLog });
    base = `http://127.0.0.1:${front.port}`;
    // One front per replica too, to address each replica on its own.
    for (const g of gws) {
      const f = await startFront({ port: 0, host: "127.0.0.1", gateways: [`127.0.0.1:${g.port}`], logger: quietLog });
      perReplica.push({ front: f, base: `http://127.0.0.1:${f.port}` });
    }
    const sub = env.nats.nc.subscribe("jr.decisions.>");
    (async () => {
      for await (const m of sub) decisions.push(m.json() as DecisionRecord);
    })();
  });
  afterAll(async () => {
    await front?.close();
    for (const r of perReplica) await r.front.close();
    await vllm?.close();
    await sglang?.close();
    await env?.stop();
  });
  afterEach(async () => {
    for (const f of [vllm, sglang]) for (const p of f.pods) f.setFaults(p.name, {});
    // Every leg of every request is released on both replicas (own and folded charges).
    await waitFor(() => gws.every((g) => g.views.ledger.size === 0), 5_000, "both ledgers back at zero");
  });

  const chat = (model: string, extra: Record<string, unknown> = {}) => ({ model, messages: [{ role: "user", content: "Tell me about disaggregated serving of large language models." }], max_tokens: 12, ...extra });
  const post = (body: unknown, signal?: AbortSignal, at = base) => fetch(`${at}/v1/chat/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body), ...(signal ? { signal } : {}) });
  const state = async (fleet: SimFleet, pod: string) => ((await (await fetch(`http://${fleet.pods.find((p) => p.name === pod)?.address}/debug/state`)).json()) as { pd: PdState; hungRequests: number; running: number });
  const sum = async (fleet: SimFleet, names: string[], f: (s: PdState) => number) => (await Promise.all(names.map((n) => state(fleet, n)))).reduce((a, s) => a + f(s.pd), 0);
  const decodes = ["v3", "v4", "v5"];
  const prefills = ["v0", "v1", "v2"];
  const faultAll = (pods: string[], f: Record<string, unknown>) => {
    for (const p of pods) vllm.setFaults(p, f);
  };

  it("vLLM: non-streaming and streaming answers through both legs; the decode really used the transfer", async () => {
    const before = await sum(vllm, decodes, (s) => s.reads);
    const r1 = await post(chat(MODEL));
    // The answer's body in the failure message: a rare 500 from a prefill leg on a loaded host is being tracked down.
    expect(r1.status, r1.status === 200 ? "" : await r1.clone().text()).toBe(200);
    expect(prefills).toContain(r1.headers.get("prefill-target-pod"));
    expect(r1.headers.get("prefill-target-pod-ip")).toBe("127.0.0.1");
    const j = (await r1.json()) as { choices: Array<{ message: { content: string } }>; usage: { completion_tokens: number } };
    expect(j.usage.completion_tokens).toBe(12);
    const r2 = await post(chat(MODEL, { stream: true, stream_options: { include_usage: true } }));
    expect(r2.status).toBe(200);
    const text = await r2.text();
    expect(text).toContain('"completion_tokens":12');
    expect(text.trim().endsWith("data: [DONE]")).toBe(true);
    expect(await sum(vllm, decodes, (s) => s.reads)).toBe(before + 2);
    expect(await sum(vllm, decodes, (s) => s.misses + s.localPrefills)).toBe(0);
    expect(await sum(vllm, prefills, (s) => s.heldRequests + s.leaks)).toBe(0);
    await waitFor(() => decisions.filter((d) => d.pd?.leg === "decode" && d.model === MODEL).length >= 2, 5_000, "decode records");
    const rec = decisions.find((d) => d.pd?.leg === "decode" && d.model === MODEL) as DecisionRecord;
    expect(rec.pd).toMatchObject({ roleset: "rs-a", engine: "vllm", attempts: 1 });
    expect(rec.pd?.prefillMs).toBeGreaterThan(0);
    expect(rec.ttftMs).toBeGreaterThanOrEqual(rec.pd?.prefillMs ?? 0);
  });

  it("vLLM: a prefill pod answering 503 or refusing connections is retried on the other one", async () => {
    vllm.setFaults("v0", { status: 503 });
    for (let i = 0; i < 6; i++) {
      const r = await post(chat(MODEL));
      expect(r.status).toBe(200);
      expect(r.headers.get("prefill-target-pod")).not.toBe("v0");
    }
    vllm.setFaults("v0", {});
    await vllm.stop("v1");
    try {
      for (let i = 0; i < 6; i++) {
        const r = await post(chat(MODEL));
        expect(r.status).toBe(200);
        expect(r.headers.get("prefill-target-pod")).not.toBe("v1");
      }
    } finally {
      await vllm.start("v1");
    }
  });

  it("vLLM: every prefill pod failing, or a timeout, ends the request with a clean OpenAI error", async () => {
    faultAll(prefills, { status: 503 });
    const t0 = performance.now();
    const r = await post(chat(MODEL));
    expect(r.status).toBe(502);
    expect(r.headers.get("content-type")).toContain("application/json");
    expect(((await r.json()) as { error: { code: string } }).error.code).toBe("prefill_failed");
    // "Within about a second" (peers: minutes), with room for a loaded 2-core CI machine.
    expect(performance.now() - t0).toBeLessThan(1_500);
    faultAll(prefills, { hang: true });
    const t = await post(chat(MODEL));
    expect(t.status).toBe(504);
    expect(((await t.json()) as { error: { code: string } }).error.code).toBe("prefill_timeout");
  });

  it("vLLM: a stuck decode is ended by the watchdog with a 504 before headers", async () => {
    faultAll(decodes, { hang: true });
    const t0 = performance.now();
    const r = await post(chat(MODEL, { stream: true }));
    expect(r.status).toBe(504);
    expect(((await r.json()) as { error: { code: string } }).error.code).toBe("decode_timeout");
    expect(performance.now() - t0).toBeGreaterThanOrEqual(PD.firstChunkTimeoutMs - 50);
  });

  it("vLLM: a non-streamed answer longer than the first-chunk timeout is not cut by the watchdog", async () => {
    // 400 tokens x 5 ms: about 2 s, beyond the 1.5 s first-chunk timeout; the body arrives whole at the end.
    const r = await post(chat(MODEL, { max_tokens: 400 }));
    expect(r.status).toBe(200);
    expect(((await r.json()) as { usage: { completion_tokens: number } }).usage.completion_tokens).toBe(400);
  });

  it("vLLM: a client cancel mid-prefill ends both legs", async () => {
    faultAll(prefills, { hang: true });
    const ctl = new AbortController();
    const pending = post(chat(MODEL), ctl.signal).catch((e: unknown) => e);
    // Wait until both legs are charged on a replica, then leave.
    await waitFor(() => gws.some((g) => g.views.ledger.size >= 2), 3_000, "both legs charged");
    ctl.abort();
    await pending;
    await waitFor(() => gws.every((g) => g.views.ledger.size === 0), 3_000, "charges released");
    // The prefill pod saw its client (the gateway's leg) leave: nothing hangs there any more.
    await waitFor(async () => (await Promise.all(prefills.map((p) => state(vllm, p)))).every((x) => x.hungRequests === 0), 3_000, "no hung prefill", 20);
    const rec = decisions.filter((d) => d.pd?.leg === "decode").at(-1);
    await waitFor(() => decisions.some((d) => d.pd?.leg === "decode" && d.outcome === "cancelled"), 3_000, "the cancelled request's record");
    expect(rec).toBeDefined();
  });

  it("a client body carrying kv_transfer_params or bootstrap fields is refused with a 400", async () => {
    for (const extra of [{ kv_transfer_params: { remote_host: "169.254.169.254" } }, { bootstrap_host: "10.0.0.1" }]) {
      const r = await post(chat(MODEL, extra));
      expect(r.status).toBe(400);
      expect(((await r.json()) as { error: { code: string } }).error.code).toBe("pd_controlled_field");
    }
  });

  it("SGLang: both legs at once with one bootstrap room, streaming and not", async () => {
    const r1 = await post(chat(SG_MODEL));
    expect(r1.status).toBe(200);
    expect(r1.headers.get("prefill-target-pod")).toBe("s0");
    expect(((await r1.json()) as { usage: { completion_tokens: number } }).usage.completion_tokens).toBe(12);
    const r2 = await post(chat(SG_MODEL, { stream: true }));
    const text = await r2.text();
    expect(r2.status).toBe(200);
    expect(text).not.toContain('"error"');
    expect(text.trim().endsWith("data: [DONE]")).toBe(true);
    const dec = await state(sglang, "s1");
    expect(dec.pd.reads).toBeGreaterThanOrEqual(2);
    expect(Object.values(dec.pd.failures).reduce((a, b) => a + b, 0)).toBe(0);
  });

  it("SGLang: a failed prefill ends the waiting decode within a second, and the client gets an OpenAI error", async () => {
    sglang.setFaults("s0", { status: 500 });
    for (const stream of [false, true]) {
      const t0 = performance.now();
      const r = await post(chat(SG_MODEL, { stream }));
      const text = await r.text();
      const ms = performance.now() - t0;
      expect(ms).toBeLessThan(1_500);
      expect(text).toContain("prefill_failed");
      if (!stream) expect(r.status).toBe(502);
    }
    // The decode pod was told to stop: nothing waits for a handoff any more.
    await waitFor(async () => ((await state(sglang, "s1")).pd.decodePreallocQueue ?? 0) === 0, 1_000, "decode prealloc queue empty", 20);
  });

  it("SGLang: a decode whose handoff never comes is ended by the watchdog and aborted on its pod", async () => {
    sglang.setFaults("s0", { bootstrap: "drop" });
    const t0 = performance.now();
    const r = await post(chat(SG_MODEL, { stream: true }));
    const text = await r.text();
    expect(text).toContain("decode_timeout");
    expect(performance.now() - t0).toBeLessThan(PD.firstChunkTimeoutMs + 1_500);
    // /abort_request reached the decode pod: it no longer waits for the room.
    await waitFor(async () => ((await state(sglang, "s1")).pd.decodePreallocQueue ?? 0) === 0, 1_000, "decode prealloc queue empty", 20);
  });

  /**
   * 9 requests, each sent once both replicas hold the previous one's charges, alternating between
   * the replicas, every leg held: with the legs' charges shared, each replica sees 3 per pod; a
   * replica that saw only its own (5 or 4 requests spread over 3 pods on its own) would pile 4 onto
   * some pod now and then.
   */
  const spreadOf = async (pods: string[], hold: string[], stream: boolean) => {
    faultAll(hold, { hang: true });
    const ctls = Array.from({ length: 9 }, () => new AbortController());
    const reqs: Array<Promise<unknown>> = [];
    for (let i = 0; i < 9; i++) {
      // A prompt of its own (from the first token on): no cached prefix pulls requests onto one pod.
      const body = { ...chat(MODEL, { stream }), messages: [{ role: "user", content: `${randomUUID()} request ${i} of the spread test` }] };
      reqs.push(post(body, ctls[i]?.signal, perReplica[i % 2]?.base).catch((e: unknown) => e));
      // A deadline, not a pace: on a 2-core host under a parallel suite a charge took over 3 s to
      // reach both replicas once (the wait failed, the spread it guards never did).
      await waitFor(() => gws.every((g) => pods.reduce((a, p) => a + g.views.ledger.outstanding(MODEL, p).requests, 0) === i + 1), 10_000, `${i + 1} charges on ${pods.join(",")} in both replicas`);
    }
    const perPod = gws.map((g) => pods.map((p) => g.views.ledger.outstanding(MODEL, p).requests));
    for (const c of ctls) c.abort();
    await Promise.all(reqs);
    return perPod;
  };

  it("prefill load is shared: 9 held prefills from two replicas land 3 per prefill pod, as both see", async () => {
    expect(await spreadOf(prefills, prefills, false)).toEqual([
      [3, 3, 3],
      [3, 3, 3],
    ]);
  });

  it("pending-decode load is shared: 9 held decodes from two replicas land 3 per decode pod, as both see", async () => {
    expect(await spreadOf(decodes, decodes, true)).toEqual([
      [3, 3, 3],
      [3, 3, 3],
    ]);
  });

  it("combined fallback when no decode pod is ready", async () => {
    await env.publishPod({ model: MODEL, pod: "c0", address: vllm.pods[0]?.address as string, engine: "vllm", role: "combined" });
    for (const p of decodes) await env.publishPod({ model: MODEL, pod: p, address: vllm.pods.find((x) => x.name === p)?.address as string, role: "decode", roleset: "rs-a", ready: false });
    try {
      await waitFor(() => gws.every((g) => g.views.pods.readyPods(MODEL).every((p) => p.role !== "decode")), 3_000, "decode pods not ready");
      const r = await post(chat(MODEL));
      expect(r.status).toBe(200);
      expect(r.headers.get("target-pod")).toBe(vllm.pods[0]?.address);
      expect(r.headers.get("prefill-target-pod")).toBeNull();
    } finally {
      for (const p of decodes) await env.publishPod({ model: MODEL, pod: p, address: vllm.pods.find((x) => x.name === p)?.address as string, role: "decode", roleset: "rs-a" });
      await env.publishPod({ model: MODEL, pod: "c0", address: vllm.pods[0]?.address as string, engine: "vllm", role: "combined", ready: false });
    }
  });
});
