/**
 * Prefill/decode disaggregation end to end: client -> dev front (Envoy's part, applying the
 * gateway's body mutation) -> ext_proc -> two gateway replicas on one NATS -> simulated vLLM and
 * SGLang prefill and decode pods that enforce the handoff protocol (services/sim/pd-legs.ts).
 * After every scenario the ledgers of both replicas return to zero.
 */
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

/** Polls an async condition (a pod's /debug/state) until it holds. */
async function eventually(what: string, cond: () => Promise<boolean>, timeoutMs = 3_000): Promise<void> {
  const t0 = performance.now();
  while (!(await cond())) {
    if (performance.now() - t0 > timeoutMs) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}
const PD = { prefillTimeoutMs: 2_000, maxRetries: 2, firstChunkTimeoutMs: 1_500, idleTimeoutMs: 1_500 };

describe("P/D - vLLM and SGLang through the front, two replicas", () => {
  let env: TestEnv;
  let vllm: SimFleet;
  let sglang: SimFleet;
  let gws: GatewayHandle[] = [];
  let front: FrontServer;
  let base: string;
  const decisions: DecisionRecord[] = [];

  beforeAll(async () => {
    env = await startTestEnv();
    vllm = await startSimFleet({ pods: 4, model: MODEL, role: ["prefill", "prefill", "decode", "decode"], roleset: "rs-a", namePrefix: "v", decodeMsPerStep: 5, logger: quietLog });
    sglang = await startSimFleet({ pods: 2, model: SG_MODEL, engine: "sglang", role: ["prefill", "decode"], roleset: "rs-s", namePrefix: "s", decodeMsPerStep: 5, disaggTimeoutMs: 60_000, logger: quietLog });
    for (const p of [...vllm.pods, ...sglang.pods]) {
      await env.publishPod({ model: p.engine === "sglang" ? SG_MODEL : MODEL, pod: p.name, address: p.address, engine: p.engine, role: p.role, ...(p.roleset ? { roleset: p.roleset } : {}), ...(p.bootstrapPort ? { bootstrapPort: p.bootstrapPort } : {}) });
    }
    gws = [await env.gateway({ id: "pd-gw-1", defaultStrategy: "pd", pd: PD }), await env.gateway({ id: "pd-gw-2", defaultStrategy: "pd", pd: PD })];
    await waitFor(() => gws.every((g) => g.views.pods.readyPods(MODEL).length === 4 && g.views.pods.readyPods(SG_MODEL).length === 2), 5_000, "pods in both replicas");
    front = await startFront({ port: 0, host: "127.0.0.1", gateways: gws.map((g) => `127.0.0.1:${g.port}`), logger: quietLog });
    base = `http://127.0.0.1:${front.port}`;
    const sub = env.nats.nc.subscribe("jr.decisions.>");
    (async () => {
      for await (const m of sub) decisions.push(m.json() as DecisionRecord);
    })();
  });
  afterAll(async () => {
    await front?.close();
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
  const post = (body: unknown, signal?: AbortSignal) => fetch(`${base}/v1/chat/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body), ...(signal ? { signal } : {}) });
  const state = async (fleet: SimFleet, pod: string) => ((await (await fetch(`http://${fleet.pods.find((p) => p.name === pod)?.address}/debug/state`)).json()) as { pd: PdState; hungRequests: number; running: number });
  const sum = async (fleet: SimFleet, names: string[], f: (s: PdState) => number) => (await Promise.all(names.map((n) => state(fleet, n)))).reduce((a, s) => a + f(s.pd), 0);
  const decodes = ["v2", "v3"];
  const prefills = ["v0", "v1"];

  it("vLLM: non-streaming and streaming answers through both legs; the decode really used the transfer", async () => {
    const before = await sum(vllm, decodes, (s) => s.reads);
    const r1 = await post(chat(MODEL));
    expect(r1.status).toBe(200);
    expect(prefills).toContain(r1.headers.get("prefill-target-pod"));
    expect(r1.headers.get("prefill-target-pod-ip")).toMatch(/^127\.0\.0\.1:\d+$/);
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
    vllm.setFaults("v1", {});
    for (let i = 0; i < 4; i++) {
      const r = await post(chat(MODEL));
      expect(r.status).toBe(200);
      expect(r.headers.get("prefill-target-pod")).toBe("v1");
    }
    vllm.setFaults("v0", {});
    await vllm.stop("v1");
    try {
      const r = await post(chat(MODEL));
      expect(r.status).toBe(200);
      expect(r.headers.get("prefill-target-pod")).toBe("v0");
    } finally {
      await vllm.start("v1");
    }
  });

  it("vLLM: every prefill pod failing, or a timeout, ends the request with a clean OpenAI error", async () => {
    vllm.setFaults("v0", { status: 503 });
    vllm.setFaults("v1", { status: 503 });
    const t0 = performance.now();
    const r = await post(chat(MODEL));
    expect(r.status).toBe(502);
    expect(r.headers.get("content-type")).toContain("application/json");
    expect(((await r.json()) as { error: { code: string } }).error.code).toBe("prefill_failed");
    expect(performance.now() - t0).toBeLessThan(1_000);
    vllm.setFaults("v0", { hang: true });
    vllm.setFaults("v1", { hang: true });
    const t = await post(chat(MODEL));
    expect(t.status).toBe(504);
    expect(((await t.json()) as { error: { code: string } }).error.code).toBe("prefill_timeout");
  });

  it("vLLM: a stuck decode is ended by the watchdog with a 504 before headers", async () => {
    vllm.setFaults("v2", { hang: true });
    vllm.setFaults("v3", { hang: true });
    const t0 = performance.now();
    const r = await post(chat(MODEL, { stream: true }));
    expect(r.status).toBe(504);
    expect(((await r.json()) as { error: { code: string } }).error.code).toBe("decode_timeout");
    expect(performance.now() - t0).toBeGreaterThanOrEqual(PD.firstChunkTimeoutMs - 50);
  });

  it("vLLM: a client cancel mid-prefill ends both legs", async () => {
    vllm.setFaults("v0", { hang: true });
    vllm.setFaults("v1", { hang: true });
    const ctl = new AbortController();
    const pending = post(chat(MODEL), ctl.signal).catch((e: unknown) => e);
    // Wait until both legs are charged on a replica, then leave.
    await waitFor(() => gws.some((g) => g.views.ledger.size >= 2), 3_000, "both legs charged");
    ctl.abort();
    await pending;
    await waitFor(() => gws.every((g) => g.views.ledger.size === 0), 3_000, "charges released");
    // The prefill pod saw its client (the gateway's leg) leave: nothing hangs there any more.
    await eventually("no hung prefill", async () => (await state(vllm, "v0")).hungRequests + (await state(vllm, "v1")).hungRequests === 0);
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
      expect(ms).toBeLessThan(1_000);
      expect(text).toContain("prefill_failed");
      if (!stream) expect(r.status).toBe(502);
    }
    // The decode pod was told to stop: nothing waits for a handoff any more.
    await eventually("decode prealloc queue empty", async () => ((await state(sglang, "s1")).pd.decodePreallocQueue ?? 0) === 0, 1_000);
  });

  it("SGLang: a decode whose handoff never comes is ended by the watchdog and aborted on its pod", async () => {
    sglang.setFaults("s0", { bootstrap: "drop" });
    const t0 = performance.now();
    const r = await post(chat(SG_MODEL, { stream: true }));
    const text = await r.text();
    expect(text).toContain("decode_timeout");
    expect(performance.now() - t0).toBeLessThan(PD.firstChunkTimeoutMs + 1_500);
    // /abort_request reached the decode pod: it no longer waits for the room.
    await eventually("decode prealloc queue empty", async () => ((await state(sglang, "s1")).pd.decodePreallocQueue ?? 0) === 0, 1_000);
  });

  it("both replicas see each other's prefill and decode charges while requests are in flight", async () => {
    vllm.setFaults("v2", { hang: true });
    vllm.setFaults("v3", { hang: true });
    const ctls = Array.from({ length: 8 }, () => new AbortController());
    const reqs = ctls.map((c) => post(chat(MODEL, { stream: true }), c.signal).catch((e: unknown) => e));
    // Decodes hang after their prefill: 8 pending decode charges, seen by both replicas.
    await waitFor(() => gws.every((g) => decodes.reduce((a, p) => a + g.views.ledger.outstanding(MODEL, p).requests, 0) === 8), 4_000, "8 decode charges on both replicas");
    for (const g of gws) {
      const perPod = decodes.map((p) => g.views.ledger.outstanding(MODEL, p).requests);
      expect(Math.max(...perPod) / (8 / decodes.length)).toBeLessThanOrEqual(1.25);
    }
    for (const c of ctls) c.abort();
    await Promise.all(reqs);
  });

  it("prefill load is shared too: hung prefills spread over the prefill pods, as both replicas see", async () => {
    vllm.setFaults("v0", { hang: true });
    vllm.setFaults("v1", { hang: true });
    const ctls = Array.from({ length: 8 }, () => new AbortController());
    const reqs = ctls.map((c) => post(chat(MODEL), c.signal).catch((e: unknown) => e));
    await waitFor(() => gws.every((g) => prefills.reduce((a, p) => a + g.views.ledger.outstanding(MODEL, p).requests, 0) === 8), 4_000, "8 prefill charges on both replicas");
    for (const g of gws) {
      const perPod = prefills.map((p) => g.views.ledger.outstanding(MODEL, p).requests);
      expect(Math.max(...perPod) / (8 / prefills.length)).toBeLessThanOrEqual(1.25);
    }
    for (const c of ctls) c.abort();
    await Promise.all(reqs);
  });

  it("combined fallback when no decode pod is ready", async () => {
    await env.publishPod({ model: MODEL, pod: "c0", address: vllm.pods[0]?.address as string, engine: "vllm", role: "combined" });
    for (const p of ["v2", "v3"]) await env.publishPod({ model: MODEL, pod: p, address: vllm.pods.find((x) => x.name === p)?.address as string, role: "decode", roleset: "rs-a", ready: false });
    try {
      await waitFor(() => gws.every((g) => g.views.pods.readyPods(MODEL).every((p) => p.role !== "decode")), 3_000, "decode pods not ready");
      const r = await post(chat(MODEL));
      expect(r.status).toBe(200);
      expect(r.headers.get("target-pod")).toBe(vllm.pods[0]?.address);
      expect(r.headers.get("prefill-target-pod")).toBeNull();
    } finally {
      for (const p of ["v2", "v3"]) await env.publishPod({ model: MODEL, pod: p, address: vllm.pods.find((x) => x.name === p)?.address as string, role: "decode", roleset: "rs-a" });
      await env.publishPod({ model: MODEL, pod: "c0", address: vllm.pods[0]?.address as string, engine: "vllm", role: "combined", ready: false });
    }
  });
});
