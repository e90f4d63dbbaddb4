/**
 * The P/D request path on the director, with a scripted leg client instead of HTTP (the HTTP side
 * is tested against simulator pods in test/pd.test.ts): charges of both legs, retries, failures,
 * cancellation, and the ledger back at zero after each.
 */
import { describe, expect, it } from "vitest";
import type { ModelConfig } from "../../../schemas/config.js";
import type { EngineKind, PodEvent, SchedulingPolicy } from "../../../schemas/events.js";
import { checkEvent } from "../../../schemas/validate.js";
import { GatewayState } from "../../views/gateway-state.js";
import { ModelConfigView } from "../../views/model-config.js";
import { Director, type RoutedRequest } from "../director.js";
import { RouteError } from "../errors.js";
import { type LegAnswer, type LegClient, LegError } from "./pd-legs.js";
import { chatBody, FakeClock, MemorySink, MODEL } from "./testing.js";


type Script = (address: string, path: string, body: unknown, signal?: AbortSignal) => Promise<LegAnswer>;

class ScriptedClient implements LegClient {
  calls: Array<{ address: string; path: string; body: Record<string, unknown> }> = [];
  constructor(public script: Script) {}
  post(address: string, path: string, body: Buffer, _h: Readonly<Record<string, string>>, o: { signal?: AbortSignal }): Promise<LegAnswer> {
    const parsed = JSON.parse(body.toString()) as Record<string, unknown>;
    this.calls.push({ address, path, body: parsed });
    return this.script(address, path, parsed, o.signal);
  }
}

const params = (host: string) => ({ do_remote_prefill: true, do_remote_decode: false, remote_block_ids: [1], remote_engine_id: "e1", remote_request_id: "req-1", remote_host: host, remote_port: 5600, tp_size: 1 });
const ok = (host = "0.0.0.0"): Promise<LegAnswer> => Promise.resolve({ status: 200, body: Buffer.from(JSON.stringify({ choices: [], kv_transfer_params: params(host) })) });

function configOf(c: ModelConfig): ModelConfigView {
  const v = new ModelConfigView();
  v.set(MODEL, c);
  return v;
}

function setup(script: Script, o: { engine?: EngineKind; prefill?: number; decode?: number; policy?: { prefill?: SchedulingPolicy; decode?: SchedulingPolicy }; config?: ModelConfig; headers?: Record<string, string>; body?: Record<string, unknown> } = {}) {
  const clock = new FakeClock(1_000_000);
  const state = new GatewayState({ self: "gw" });
  let seq = 0;
  const add = (pod: string, role: PodEvent["role"], i: number) =>
    state.apply({ type: "pod", action: "upsert", model: MODEL, pod, address: `10.0.${role === "prefill" ? 1 : 2}.${i}:8000`, ready: true, engine: o.engine ?? "vllm", role, roleset: "rs", ...(role === "prefill" ? { bootstrapPort: 9100 + i } : {}), ...(o.policy?.[role as "prefill" | "decode"] ? { schedulingPolicy: o.policy[role as "prefill" | "decode"] } : {}), ts: 0 }, { stream: "pods", subject: pod, seq: ++seq, serverTs: 0 });
  for (let i = 0; i < (o.prefill ?? 2); i++) add(`pre-${i}`, "prefill", i);
  for (let i = 0; i < (o.decode ?? 2); i++) add(`dec-${i}`, "decode", i);
  const sink = new MemorySink();
  const client = new ScriptedClient(script);
  // Publishing deferred past the reply runs when the test says so (the gateway: setImmediate).
  const deferred: Array<() => void> = [];
  const runDeferred = () => {
    for (const fn of deferred.splice(0)) fn();
  };
  const director = new Director({ gatewayId: "gw", defaultStrategy: "pd", chargeTtlMs: 60_000, state, sink, clock, now: clock.now, pdLegClient: client, pdLegOptions: { maxRetries: 2 }, defer: (fn) => deferred.push(fn), ...(o.config ? { config: configOf(o.config) } : {}) });
  const ctl = new AbortController();
  const input = { headers: { "x-request-id": "req-1", ":path": "/v1/chat/completions", ...o.headers }, body: chatBody(MODEL, { max_tokens: 8, stream: true, ...o.body }), signal: ctl.signal };
  const outstanding = () => state.ledger.size;
  return { clock, state, sink, client, director, input, ctl, outstanding, deferred, runDeferred };
}

describe("pd legs - vLLM", () => {
  it("sends the prefill leg, then routes decode with the prefill's params pointed at the prefill pod", async () => {
    const s = setup(() => ok());
    const r = await s.director.route(s.input);
    expect(s.client.calls).toHaveLength(1);
    const call = s.client.calls[0] as (typeof s.client.calls)[number];
    expect(call.address.startsWith("10.0.1.")).toBe(true);
    expect(call.body).toMatchObject({ stream: false, max_tokens: 1, kv_transfer_params: { do_remote_decode: true } });
    expect(r.pod.role).toBe("decode");
    const decodeBody = JSON.parse((r.body as Buffer).toString());
    expect(decodeBody.kv_transfer_params).toMatchObject({ remote_engine_id: "e1", remote_host: call.address.split(":")[0] });
    expect(decodeBody.stream).toBe(true);
    // Both legs were charged on the shared stream; the prefill's charge is already off the ledger
    // and its release published (in order among the charges); its record waits for the reply (deferred).
    expect(s.sink.charges.map((c) => c.phase)).toEqual(["decode", "prefill"]);
    expect(s.outstanding()).toBe(1);
    expect([s.sink.releases.length, s.sink.decisions.length, s.deferred.length]).toEqual([1, 0, 1]);
    expect(s.sink.releases.map((x) => x.id)).toEqual([`${r.chargeId}.p1`]);
    s.runDeferred();
    expect([s.sink.releases.length, s.sink.decisions.length]).toEqual([1, 1]);
    s.director.finish(r, "completed", { status: 200, completionTokens: 8 });
    expect(s.outstanding()).toBe(0);
    const [pre, dec] = s.sink.decisions;
    expect(pre?.pd).toMatchObject({ leg: "prefill", roleset: "rs", engine: "vllm", attempts: 1 });
    expect(dec?.pd).toMatchObject({ leg: "decode", prefillPod: pre?.pick, decodePod: r.pod.pod, attempts: 1 });
    for (const d of s.sink.decisions) expect(checkEvent("decision", d).ok).toBe(true);
  });

  it("a request that ends before its deferred prefill record went out publishes the prefill's first, once", async () => {
    const s = setup(() => ok());
    const r = await s.director.route(s.input);
    s.director.finish(r, "completed", { status: 200, completionTokens: 8 });
    expect(s.sink.decisions.map((d) => d.pd?.leg)).toEqual(["prefill", "decode"]);
    expect(s.sink.releases.map((x) => x.id)).toEqual([`${r.chargeId}.p1`, r.chargeId]);
    s.runDeferred();
    expect([s.sink.decisions.length, s.sink.releases.length, s.outstanding()]).toEqual([2, 2, 0]);
  });

  it("a request is counted once in every replica's rate windows and usage, retries included", async () => {
    let n = 0;
    const s = setup(() => (++n === 1 ? Promise.resolve({ status: 503, body: Buffer.from("{}") }) : ok()));
    const r = await s.director.route({ ...s.input, headers: { ...s.input.headers, user: "bob" } });
    expect(s.sink.charges.map((c) => c.phase)).toEqual(["decode", "prefill", "prefill"]);
    const peer = new GatewayState({ self: "peer" });
    for (const [i, c] of s.sink.charges.entries()) peer.apply(c, { stream: "charges", subject: `c${i}`, seq: i + 1, serverTs: c.ts });
    for (const st of [s.state, peer]) {
      expect(st.rates.userRequests("bob", s.clock.t)).toBe(1);
      expect(st.rates.modelRequests(MODEL, s.clock.t)).toBe(1);
    }
    s.director.finish(r, "completed", { status: 200 });
  });

  it("a 503 or a refused connection is retried on the other prefill pod", async () => {
    let n = 0;
    const s = setup(() => (++n === 1 ? Promise.resolve({ status: 503, body: Buffer.from("{}") }) : ok()));
    const r = await s.director.route(s.input);
    expect(new Set(s.client.calls.map((c) => c.address)).size).toBe(2);
    expect(r.pd?.attempts).toBe(2);
    s.runDeferred();
    expect(s.sink.releases.map((x) => x.outcome)).toEqual(["error", "completed"]);
    s.director.finish(r, "completed", { status: 200 });
    expect(s.outstanding()).toBe(0);
  });

  it("every prefill pod failing ends the request with a 502, nothing left charged", async () => {
    const s = setup(() => Promise.reject(new LegError({ kind: "connect", code: "ECONNREFUSED" })));
    const err = await Promise.resolve(s.director.route(s.input)).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(RouteError);
    expect((err as RouteError).status).toBe(502);
    expect((err as RouteError).afterRouting).toBe(true);
    expect(s.client.calls).toHaveLength(2); // two prefill pods, the retry bound not reached
    expect(s.outstanding()).toBe(0);
    const dec = s.sink.decisions.find((d) => d.pd?.leg === "decode");
    expect(dec).toMatchObject({ status: 502, outcome: "error", errorCode: "prefill_failed", pd: { error: "connect" } });
  });

  it("a timeout is not retried; the engine's own 400 reaches the client as a 400", async () => {
    const t = setup(() => Promise.reject(new LegError({ kind: "timeout" })));
    expect(((await Promise.resolve(t.director.route(t.input)).catch((e: unknown) => e)) as RouteError).status).toBe(504);
    expect(t.client.calls).toHaveLength(1);
    const b = setup(() => Promise.resolve({ status: 400, body: Buffer.from(JSON.stringify({ error: { message: "too long" } })) }));
    const e = (await Promise.resolve(b.director.route(b.input)).catch((x: unknown) => x)) as RouteError;
    expect([e.status, e.message]).toEqual([400, expect.stringContaining("too long")]);
    expect(b.outstanding()).toBe(0);
  });

  it("a client cancel mid-prefill aborts the leg and releases both charges", async () => {
    const s = setup((_a, _p, _b, signal) => new Promise((_resolve, reject) => signal?.addEventListener("abort", () => reject(new LegError({ kind: "cancelled" })))));
    const routed = Promise.resolve(s.director.route(s.input)).catch((e: unknown) => e);
    expect(s.outstanding()).toBe(2);
    s.ctl.abort();
    const err = (await routed) as RouteError;
    expect(err.code).toBe("client_cancelled");
    expect(s.outstanding()).toBe(0);
    expect(s.sink.releases.map((x) => x.outcome)).toEqual(["cancelled", "cancelled"]);
    expect(s.sink.decisions.find((d) => d.pd?.leg === "decode")).toMatchObject({ outcome: "cancelled", status: 499 });
    expect(s.client.calls).toHaveLength(1);
  });

  it("a prefill answer without transfer params still gets an answer (decode computes it), counted", async () => {
    const s = setup(() => Promise.resolve({ status: 200, body: Buffer.from("{}") }));
    const r = await s.director.route(s.input);
    expect(r.body).toBeUndefined();
    expect(s.director.legs?.stats.paramsMissing).toBe(1);
  });
});

describe("pd legs - SGLang", () => {
  it("routes decode at once with the bootstrap fields of the prefill pod, both legs with one rid and room", async () => {
    let release: (a: LegAnswer) => void = () => {};
    const s = setup(() => new Promise((resolve) => (release = resolve)), { engine: "sglang" });
    const r = s.director.route(s.input) as RoutedRequest;
    expect(r).not.toBeInstanceOf(Promise);
    const decodeBody = JSON.parse((r.body as Buffer).toString());
    const prefill = s.client.calls[0]?.body as Record<string, unknown>;
    const port = Number(r.pd?.prefillPod.address.split(".")[3]?.split(":")[0]) + 9100;
    // The rid is minted (never the client's x-request-id: two clients sending one id must not share a handoff).
    expect(decodeBody.rid).toMatch(/^jr-[0-9a-f-]{36}$/);
    expect(decodeBody).toMatchObject({ bootstrap_host: r.pd?.prefillPod.address.split(":")[0], bootstrap_port: port, rid: r.pd?.rid });
    expect(prefill).toMatchObject({ bootstrap_host: decodeBody.bootstrap_host, bootstrap_port: port, rid: decodeBody.rid, stream: true });
    expect(String(prefill.bootstrap_room)).toBe(String(decodeBody.bootstrap_room));
    expect(s.outstanding()).toBe(2);
    release({ status: 200, body: Buffer.from("{}") });
    await new Promise((x) => setImmediate(x));
    expect(s.outstanding()).toBe(1);
    s.director.finish(r, "completed", { status: 200 });
    expect(s.outstanding()).toBe(0);
  });

  it("a failed prefill aborts the decode on its pod and tells the adapter, once", async () => {
    const s = setup((_a, path) => (path === "/abort_request" ? Promise.resolve({ status: 200, body: Buffer.alloc(0) }) : Promise.resolve({ status: 500, body: Buffer.from("{}") })), { engine: "sglang" });
    const r = s.director.route(s.input) as RoutedRequest;
    const failures: RouteError[] = [];
    (r.pd as NonNullable<typeof r.pd>).onFailure = (e) => failures.push(e);
    await new Promise((x) => setImmediate(x));
    expect(failures.map((e) => e.status)).toEqual([502]);
    const abort = s.client.calls.find((c) => c.path === "/abort_request");
    expect(abort).toMatchObject({ address: r.pod.address, body: { rid: r.pd?.rid, abort_all: false } });
    s.director.finish(r, "error", { status: 502, errorCode: "prefill_failed" });
    expect(s.outstanding()).toBe(0);
  });

  it("a prefill that answers after its decode finished is released as completed, not aborted", async () => {
    let release: (a: LegAnswer) => void = () => {};
    const aborts: string[] = [];
    const s = setup(
      (a, path) => {
        if (path !== "/abort_request") return new Promise((resolve) => (release = resolve));
        aborts.push(a);
        return Promise.resolve({ status: 200, body: Buffer.alloc(0) });
      },
      { engine: "sglang" },
    );
    const r = s.director.route(s.input) as RoutedRequest;
    s.ctl.abort(); // the ext_proc stream's signal: grpc-js reports "cancelled" after clean ends too
    s.director.finish(r, "completed", { status: 200 });
    expect(s.outstanding()).toBe(1);
    release({ status: 200, body: Buffer.from("{}") });
    await new Promise((x) => setImmediate(x));
    expect(s.outstanding()).toBe(0);
    expect(aborts).toEqual([]);
    expect(s.sink.releases.map((x) => x.outcome)).toEqual(["completed", "completed"]);
  });

  it("a client cancel reaches the prefill leg too", async () => {
    const aborted: string[] = [];
    const s = setup(
      (a, path, _b, signal) => {
        if (path === "/abort_request") {
          aborted.push(a);
          return Promise.resolve({ status: 200, body: Buffer.alloc(0) });
        }
        return new Promise((_r, reject) => signal?.addEventListener("abort", () => reject(new LegError({ kind: "cancelled" }))));
      },
      { engine: "sglang" },
    );
    const r = s.director.route(s.input) as RoutedRequest;
    s.director.finish(r, "cancelled", { status: 499 });
    await new Promise((x) => setImmediate(x));
    expect(aborted).toEqual([r.pd?.prefillPod.address]);
    expect(s.outstanding()).toBe(0);
  });
});

describe("pd legs - engine priority (issue 36)", () => {
  const config = { flowControl: { objectives: { interactive: { priority: 10 }, batch: { priority: 0 } }, defaultObjective: "batch" } } as unknown as ModelConfig;
  const interactive = { "x-jetroute-objective": "interactive" };

  it("vLLM: each leg gets its own pod's priority; an FCFS prefill pod gets the client's own, and the records say which", async () => {
    const s = setup(() => ok(), { config, headers: interactive, policy: { decode: "priority" }, body: { priority: 3 } });
    const r = await s.director.route(s.input);
    // The prefill pod runs FCFS: the client's value as sent, not the decode pod's -10.
    expect(s.client.calls[0]?.body.priority).toBe(3);
    expect(JSON.parse((r.body as Buffer).toString()).priority).toBe(-10);
    s.runDeferred();
    s.director.finish(r, "completed", { status: 200 });
    const [pre, dec] = s.sink.decisions;
    expect([pre?.pd?.leg, pre?.enginePriority]).toEqual(["prefill", "fcfs-pod"]);
    expect([dec?.pd?.leg, dec?.enginePriority, dec?.flow?.band]).toEqual(["decode", -10, 10]);
    for (const d of s.sink.decisions) expect(checkEvent("decision", d).ok).toBe(true);
  });

  it("vLLM: a prefill pod scheduling by priority gets it too, also on a retry; a client without one sends none to an FCFS decode", async () => {
    let n = 0;
    const s = setup(() => (n++ === 0 ? Promise.resolve({ status: 503, body: Buffer.from("{}") }) : ok()), { config, policy: { prefill: "priority" } });
    const r = await s.director.route(s.input);
    expect(s.client.calls.map((c) => c.body.priority)).toEqual([0, 0]);
    expect(JSON.parse((r.body as Buffer).toString())).not.toHaveProperty("priority");
    s.runDeferred();
    s.director.finish(r, "completed", { status: 200 });
    expect(s.sink.decisions.map((d) => [d.pd?.leg, d.enginePriority])).toEqual([
      ["prefill", 0],
      ["prefill", 0],
      ["decode", "fcfs-pod"],
    ]);
  });

  it("SGLang: one room and rid, and each leg's priority in its own pod's convention", async () => {
    const s = setup(() => new Promise(() => {}), { engine: "sglang", config, headers: interactive, policy: { prefill: "priority-low-values-first", decode: "priority" } });
    const r = s.director.route(s.input) as RoutedRequest;
    const decodeBody = JSON.parse((r.body as Buffer).toString());
    const prefill = s.client.calls[0]?.body as Record<string, unknown>;
    expect([prefill.priority, decodeBody.priority]).toEqual([-10, 10]);
    expect([prefill.rid, String(prefill.bootstrap_room)]).toEqual([decodeBody.rid, String(decodeBody.bootstrap_room)]);
    s.director.finish(r, "cancelled", { status: 499 });
    expect(s.outstanding()).toBe(0);
  });

  it("no flow control for the model: neither leg gets a priority, nor its record", async () => {
    const s = setup(() => ok(), { policy: { prefill: "priority", decode: "priority" } });
    const r = await s.director.route(s.input);
    expect(s.client.calls[0]?.body).not.toHaveProperty("priority");
    expect(JSON.parse((r.body as Buffer).toString())).not.toHaveProperty("priority");
    s.runDeferred();
    s.director.finish(r, "completed", { status: 200 });
    expect(s.sink.decisions.map((d) => d.enginePriority)).toEqual([undefined, undefined]);
  });
});

describe("pd legs - rolesets and batches", () => {
  it("a retry stays in the plan's roleset (its decode pod reads the KV from it)", async () => {
    let n = 0;
    const s = setup(() => (++n === 1 ? Promise.resolve({ status: 503, body: Buffer.from("{}") }) : ok()), { prefill: 1 });
    // A second roleset with an idle prefill pod: not a candidate for this request's retry.
    s.state.apply({ type: "pod", action: "upsert", model: MODEL, pod: "other-pre", address: "10.0.9.1:8000", ready: true, engine: "vllm", role: "prefill", roleset: "other", ts: 0 }, { stream: "pods", subject: "x1", seq: 90, serverTs: 0 });
    s.state.apply({ type: "pod", action: "upsert", model: MODEL, pod: "other-dec", address: "10.0.9.2:8000", ready: true, engine: "vllm", role: "decode", roleset: "other", ts: 0 }, { stream: "pods", subject: "x2", seq: 91, serverTs: 0 });
    // Each roleset has one prefill pod: whichever the plan chose, a 503 there has nowhere to go in it.
    const err = await Promise.resolve(s.director.route(s.input)).catch((e: unknown) => e);
    expect((err as RouteError).status).toBe(502);
    expect(s.client.calls).toHaveLength(1);
    const rs = s.sink.decisions.find((d) => d.pd?.leg === "decode")?.pd?.roleset;
    expect(s.client.calls[0]?.address.startsWith(rs === "other" ? "10.0.9." : "10.0.1.")).toBe(true);
    expect(s.outstanding()).toBe(0);
  });

  it("n > 1 and batched prompts are refused under pd with a 400 naming the field", () => {
    const s = setup(() => ok());
    expect(() => s.director.route({ ...s.input, body: chatBody(MODEL, { n: 2 }) })).toThrow(expect.objectContaining({ status: 400, param: "n" }));
    const batch = Buffer.from(JSON.stringify({ model: MODEL, prompt: ["a", "b"], max_tokens: 4 }));
    expect(() => s.director.route({ ...s.input, headers: { ...s.input.headers, ":path": "/v1/completions" }, body: batch })).toThrow(expect.objectContaining({ status: 400, param: "prompt" }));
    expect(s.outstanding()).toBe(0);
  });
});

describe("pd legs - combined fallback", () => {
  it("no decode pod ready: the request goes to a combined pod, recorded as a fallback", async () => {
    const s = setup(() => ok(), { decode: 0 });
    s.state.apply({ type: "pod", action: "upsert", model: MODEL, pod: "c0", address: "10.0.3.0:8000", ready: true, engine: "vllm", ts: 0 }, { stream: "pods", subject: "c0", seq: 99, serverTs: 0 });
    const r = await s.director.route(s.input);
    expect([r.pod.pod, r.fallback, r.pd]).toEqual(["c0", "combined:no-usable-roleset", undefined]);
    expect(s.client.calls).toHaveLength(0);
    const t = setup(() => ok(), { decode: 0 });
    expect(() => t.director.route(t.input)).toThrow(/no usable prefill\/decode roleset and no combined pod/);
  });
});
