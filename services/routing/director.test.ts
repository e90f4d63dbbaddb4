import { describe, expect, it } from "vitest";
import type { DecisionRecord, } from "../../schemas/events.js";
import { checkEvent } from "../../schemas/validate.js";
import { configureSessionSigning } from "./strategies/session-affinity.js";
import { Director, type PlannedContext, type PrefixSupport, type RoutedRequest, type RouteInput } from "./director.js";
import { RouteError } from "./errors.js";
import type { Committer } from "./stages/commit.js";
import { chatBody, FakeClock, MemorySink, MODEL, stateWithPods } from "./stages/testing.js";


function setup(o: { strictFor?: (m: string) => boolean } = {}) {
  const clock = new FakeClock(1_000_000);
  const state = stateWithPods(3, "gw");
  const sink = new MemorySink();
  const director = new Director({ gatewayId: "gw", defaultStrategy: "least-request", chargeTtlMs: 60_000, state, sink, config: state.configs, clock, now: clock.now, ...(o.strictFor ? { strictFor: o.strictFor } : {}) });
  const input = (headers: Record<string, string> = {}): RouteInput => ({ headers: { "x-request-id": "req-1", ...headers }, body: chatBody(MODEL, { max_tokens: 7 }) });
  return { clock, state, sink, director, input };
}

describe("director - the request path on an in-memory sink", () => {
  it("routes, charges once (locally and on the sink) and records a v2 decision that replay can use", () => {
    const { clock, state, sink, director, input } = setup();
    const cursorsBefore = { ...state.cursors };
    const r = director.route(input()) as RoutedRequest;
    expect(sink.charges).toHaveLength(1);
    expect(state.ledger.outstanding(MODEL, r.pod.pod).requests).toBe(1);
    clock.advance(50);
    director.firstToken(r);
    clock.advance(20);
    expect(state.ledger.outstanding(MODEL, r.pod.pod).prefillRequests).toBe(0);
    expect(director.finish(r, "completed", { status: 200, promptTokens: 12, completionTokens: 3 })).toBe(true);
    expect(director.finish(r, "completed", { status: 200 })).toBe(false);
    expect(state.ledger.size).toBe(0);
    expect(sink.releases).toEqual([expect.objectContaining({ id: r.chargeId, outcome: "completed", promptTokens: 12, chargedPromptTokens: r.promptTokens })]);
    const rec = sink.decisions[0] as DecisionRecord;
    expect(checkEvent("decision", rec)).toEqual({ ok: true, event: rec });
    expect(rec).toMatchObject({ v: 2, id: "req-1", charge: r.chargeId, pick: r.pod.pod, cursors: cursorsBefore, maxTokens: 7, routedPromptTokens: r.promptTokens, ttftMs: 50, status: 200 });
  });

  it("a request over its user's limit is refused before anything is charged; a held one is charged once its charges are read back and the fake clock passes the hold", async () => {
    const { clock, state, sink, director, input } = setup();
    state.apply({ type: "config-entry", key: "limits", operation: "PUT", value: { users: { bob: { rpm: 3 } } } }, { stream: "config", subject: "limits", seq: 1, serverTs: 0 });
    state.apply({ type: "heartbeat", gateway: "peer", ts: clock.t, intervalMs: 1000, startedAt: 0, state: "up" }, { stream: "charges", subject: "hb", seq: 1, serverTs: clock.t });
    // Seen + room for as many unseen at the peer: 0 + 0 and 1 + 1 stay below 3; 2 + 2 would reach it: held.
    expect(director.route(input({ user: "bob" }))).not.toBeInstanceOf(Promise);
    expect(director.route(input({ user: "bob" }))).not.toBeInstanceOf(Promise);
    const held = director.route(input({ user: "bob" }));
    expect(held).toBeInstanceOf(Promise);
    expect(sink.charges).toHaveLength(2);
    let settled = false;
    void Promise.resolve(held).finally(() => {
      settled = true;
    });
    // Past --rate-confirm-ms, but the two charges have not come back through the stream: still held.
    clock.advance(30);
    await Promise.resolve();
    expect(settled).toBe(false);
    expect(sink.charges).toHaveLength(2);
    for (const c of sink.charges) state.ownEchoed(c.id, clock.t);
    // Read back now: the peer reads them about as late, so the hold lasts --rate-confirm-ms more.
    clock.advance(5);
    await Promise.resolve();
    expect(settled).toBe(false);
    clock.advance(25);
    await expect(held).resolves.toMatchObject({ user: "bob" });
    expect(sink.charges).toHaveLength(3);
    expect(() => director.route(input({ user: "bob" }))).toThrow(RouteError);
    expect(sink.charges).toHaveLength(3);
  });

  it("picks the committer by the model's consistency: strict models go to the strict committer", async () => {
    const { director, input, sink } = setup({ strictFor: (m) => m === MODEL });
    const seen: PlannedContext[] = [];
    const strict: Committer = {
      commit(ctx, port) {
        seen.push(ctx);
        return Promise.resolve(port.section(ctx, { publish: false }));
      },
    };
    director.useStrictCommitter(strict);
    const r = await director.route(input());
    expect(seen).toHaveLength(1);
    // publish: false = the strict committer publishes itself (with a compare-and-set).
    expect(sink.charges).toHaveLength(0);
    director.finish(r, "completed", { status: 200 });
    expect(sink.decisions[0]?.consistency).toBe("strict");
  });

  it("a charge left to its committer (publish: false) records its routed prefix only once committed; a retracted one never", () => {
    const routed: Array<{ pod: string; chargeId: string }> = [];
    const prefix: PrefixSupport = {
      tokenizer: { tokenize: () => Promise.reject(new Error("token ids only")) },
      match: (_m, candidates, tokens) => ({ info: { queried: tokens.length, blockSize: 16, matched: () => 0 }, hashes: [1n, 2n], detail: candidates.map((c) => ({ pod: c.pod, indexBlocks: 0, indexGpuBlocks: 0, indexWeighted: 0, routedBlocks: 0 })) }),
      recordRouted: (pod, _hashes, _now, chargeId) => void routed.push({ pod: pod.pod, chargeId }),
      blocks: () => ({ size: 16, mode: "precise", hashes: [] }),
    };
    const { clock, state, sink } = setup();
    const director = new Director({ gatewayId: "gw", defaultStrategy: "prefix-cache", chargeTtlMs: 60_000, state, sink, clock, now: clock.now, prefix });
    const input: RouteInput = { headers: { "x-request-id": "p-1" }, body: Buffer.from(JSON.stringify({ model: MODEL, prompt: [1, 2, 3, 4] })) };
    const port = director.commitPort;
    const prepared = director.prepare(input) as PlannedContext;
    const lost = port.section(prepared, { publish: false });
    expect(routed).toEqual([]);
    director.retract(lost, true);
    const won = port.section(prepared, { publish: false, carry: lost });
    expect(routed).toEqual([]);
    director.committed(won);
    director.committed(won);
    expect(routed).toEqual([{ pod: won.pod.pod, chargeId: won.chargeId }]);
    // Published at once (eventual): recorded at once.
    const eventual = port.section(director.prepare({ ...input, headers: { "x-request-id": "p-2" } }) as PlannedContext, { publish: true });
    expect(routed).toEqual([{ pod: won.pod.pod, chargeId: won.chargeId }, { pod: eventual.pod.pod, chargeId: eventual.chargeId }]);
  });

  it("the tokenizer gets the raw tool-JSON problem from the body's text as parsed, and a pod address only in remote mode", async () => {
    const seen: Array<{ problem: string | undefined; address: string | undefined }> = [];
    for (const mode of ["hf", "remote"]) {
      const prefix: PrefixSupport = {
        tokenizer: {
          modeFor: () => mode,
          tokenize: (_m, input, address) => {
            seen.push({ problem: input.rawToolJsonProblem, address });
            return Promise.resolve({ tokens: Uint32Array.of(1, 2, 3), mode });
          },
        },
        match: (_m, candidates, tokens) => ({ info: { queried: tokens.length, blockSize: 16, matched: () => 0 }, hashes: [1n], detail: candidates.map((c) => ({ pod: c.pod, indexBlocks: 0, indexGpuBlocks: 0, indexWeighted: 0, routedBlocks: 0 })) }),
        recordRouted: () => {},
        blocks: () => ({ size: 16, mode: "precise", hashes: [] }),
      };
      const { clock, state, sink } = setup();
      const director = new Director({ gatewayId: "gw", defaultStrategy: "prefix-cache", chargeTtlMs: 60_000, state, sink, clock, now: clock.now, prefix });
      // 20.0 is 20 once parsed: only the text shows it.
      const body = `{"model":${JSON.stringify(MODEL)},"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","default":20.0}}}]}`;
      await director.prepare({ headers: { "x-request-id": `t-${mode}` }, body: Buffer.from(body) });
    }
    expect(seen.map((s) => s.problem !== undefined)).toEqual([true, true]);
    expect(seen[0]?.address).toBeUndefined();
    expect(seen[1]?.address).toBeDefined();
  });

  it("a rejection is recorded; draining releases every request in flight as shutdown and refuses new ones", () => {
    const { director, input, sink } = setup();
    director.reject({ "x-request-id": "bad" }, MODEL, new RouteError("invalidJson", "x"));
    expect(sink.decisions[0]).toMatchObject({ id: "bad", outcome: "rejected", status: 400, pick: null });
    director.route(input());
    director.route(input({ "x-request-id": "req-2" }));
    expect(director.drain()).toBe(2);
    expect(sink.releases.map((r) => r.outcome)).toEqual(["shutdown", "shutdown"]);
    expect(() => director.route(input())).toThrow(/shutting down/);
  });
});

describe("director - opaque session ids", () => {
  it("resolves an opaque x-session-id against the model's ready pods, sticks to that pod, and records its address for replay", () => {
    configureSessionSigning("fleet-secret");
    try {
      const { director, input, sink, state } = setup();
      const first = director.route(input({ "routing-strategy": "session-affinity" })) as RoutedRequest;
      const id = first.responseHeaders?.["x-session-id"] as string;
      expect(id).toMatch(/^[A-Za-z0-9_-]{16}$/);
      director.finish(first, "completed", { status: 200 });
      for (let i = 0; i < 3; i++) {
        // Each one adds to its pod's load: without the session the next would go to another pod.
        const again = director.route(input({ "routing-strategy": "session-affinity", "x-session-id": id, "x-request-id": `req-${i + 2}` })) as RoutedRequest;
        expect(again.pod.pod).toBe(first.pod.pod);
        expect(again.fallback).toBeUndefined();
        expect(again.responseHeaders).toEqual({ "x-session-id": id });
      }
      expect(state.ledger.outstanding(MODEL, first.pod.pod).requests).toBe(3);
      const rec = sink.decisions[0] as DecisionRecord;
      expect(rec.session).toBeUndefined();
      director.drain();
      const withSession = sink.decisions.find((d) => d.id === "req-2") as DecisionRecord;
      expect(withSession.session).toEqual({ address: first.pod.address });
      expect(checkEvent("decision", withSession)).toEqual({ ok: true, event: withSession });
    } finally {
      configureSessionSigning(undefined);
    }
  });
});
