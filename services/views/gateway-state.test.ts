import { describe, expect, it } from "vitest";
import type { ChargeEvent, KvBatch, KvRouted, ReleaseEvent } from "../../schemas/events.js";
import { type ResponseLocationEvent, tenantDigest } from "../../schemas/responses.js";
import { hashToHex } from "./block-hash.js";
import { type EventMeta, GatewayState, type StateEvent } from "./gateway-state.js";
import { validateModelConfig } from "../routing/config-check.js";

/** A tiny LCG: reproducible histories without reaching into the shells' helpers. */
function lcg(seed: number): () => number {
  let x = seed >>> 0;
  return () => {
    x = (Math.imul(x, 1664525) + 1013904223) >>> 0;
    return x / 2 ** 32;
  };
}

const M = "org/model";
const ALICE = tenantDigest("alice");
const BOB = tenantDigest("bob");
const T0 = 1_700_000_000_000;

type Msg = { ev: StateEvent; meta: EventMeta } | { own: (s: GatewayState) => void } | { sweep: number };

/** A random but reproducible history of every event family, as a gateway's followers would see it. */
function history(seed: number, n: number): Msg[] {
  const rnd = lcg(seed);
  const seqs = { pods: 0, load: 0, charges: 0, kv: 0, config: 0, usage: 0, responses: 0 };
  const msgs: Msg[] = [];
  let t = T0;
  const meta = (stream: EventMeta["stream"], subject = stream): EventMeta => ({ stream, subject, seq: ++seqs[stream], serverTs: t });
  const pods = ["p0", "p1", "p2", "p3"];
  for (const pod of pods) msgs.push({ ev: { type: "pod", action: "upsert", model: M, pod, address: `10.0.0.${pod.slice(1)}:8000`, ready: true, engine: "vllm", ts: t }, meta: meta("pods") });
  msgs.push({ ev: { type: "config-entry", key: "limits", operation: "PUT", value: { users: { alice: { rpm: 100 } } } }, meta: meta("config") });
  msgs.push({ ev: { type: "config-entry", key: "model.org=2Fmodel", operation: "PUT", value: { lockedRoutingStrategy: "least-request" } }, meta: meta("config") });
  const open: Array<{ gw: string; id: string; pod: string }> = [];
  let own = 0;
  for (let i = 0; i < n; i++) {
    t += Math.floor(rnd() * 5);
    const pod = pods[Math.floor(rnd() * pods.length)] as string;
    const r = rnd();
    if (r < 0.25) {
      const gw = rnd() < 0.5 ? "gw-a" : "gw-b";
      const id = `${i.toString(36)}`;
      const ev: ChargeEvent = { type: "charge", id, gateway: gw, model: M, pod, ts: t, ttlMs: 600_000, promptTokens: 10 + i, user: rnd() < 0.5 ? "alice" : "bob" };
      open.push({ gw, id, pod });
      msgs.push({ ev, meta: meta("charges") });
    } else if (r < 0.4 && open.length > 0) {
      const c = open.splice(Math.floor(rnd() * open.length), 1)[0] as { gw: string; id: string; pod: string };
      const ev: ReleaseEvent = { type: "release", id: c.id, gateway: c.gw, model: M, pod: c.pod, ts: t, outcome: "completed", completionTokens: 7, user: "alice" };
      msgs.push({ ev, meta: meta("charges") });
    } else if (r < 0.45) {
      msgs.push({ ev: { type: "heartbeat", gateway: "gw-a", ts: t, intervalMs: 1000, startedAt: T0, state: "up", chargeTtlMs: 600_000, outstanding: open.filter((c) => c.gw === "gw-a").map((c) => ({ id: c.id, model: M, pod: c.pod, promptTokens: 1, ts: t })) }, meta: meta("charges") });
    } else if (r < 0.6) {
      msgs.push({ ev: { type: "load", model: M, pod, ts: t, stale: false, load: null }, meta: meta("load") });
    } else if (r < 0.75) {
      const base = BigInt(i) << 8n;
      const batch: KvBatch = {
        type: "kv", model: M, pod, epoch: "e1", seq: seqs.kv, ts: t,
        events: [{ kind: "stored", engineHashes: [(base + 1n).toString(16)], routerHashes: [hashToHex(base + 7n)], parentEngineHash: null, blockSize: 16, medium: "GPU", lora: null }],
      };
      msgs.push({ ev: batch, meta: meta("kv") });
    } else if (r < 0.77) {
      // Where a Responses API response lives (RESPONSES stream); some of them deleted again.
      const tenant = rnd() < 0.5 ? ALICE : BOB;
      const id = `resp_${Math.floor(rnd() * 300)}`;
      const ev: ResponseLocationEvent = rnd() < 0.8
        ? { type: "response-location", action: "stored", id, tenant, gateway: "gw-a", ts: t, model: M, pod, expiresAt: t + 600_000, stored: true }
        : { type: "response-location", action: "deleted", id, tenant, gateway: "gw-b", ts: t };
      msgs.push({ ev, meta: meta("responses") });
    } else if (r < 0.8) {
      const ev: KvRouted = { type: "kv-routed", model: M, pod, gateway: "gw-b", hashes: [hashToHex(BigInt(i) + 99n)], ts: t, ttlMs: 120_000 };
      msgs.push({ ev, meta: meta("kv") });
    } else if (r < 0.92) {
      const id = `own-${own++}`;
      const at = t;
      const charge: ChargeEvent = { type: "charge", id, gateway: "self", model: M, pod, ts: at, ttlMs: 600_000, promptTokens: 5, user: "alice" };
      msgs.push({ own: (s) => s.ownCharge(charge, at, { admission: { user: "alice", tokens: 5, ts: at } }) });
      msgs.push({ own: (s) => s.ownFirstToken(id) });
      if (rnd() < 0.7) msgs.push({ own: (s) => s.ownRelease({ type: "release", id, gateway: "self", model: M, pod, ts: at + 3, outcome: "completed", promptTokens: 6, chargedPromptTokens: 5, chargedAt: at, completionTokens: 2, user: "alice" }) });
    } else {
      msgs.push({ sweep: t });
    }
  }
  return msgs;
}

function fold(msgs: readonly Msg[]): GatewayState {
  const s = new GatewayState({ self: "self", prefixIndex: { maxEntries: 200 } });
  for (const m of msgs) {
    if ("ev" in m) s.apply(m.ev, m.meta);
    else if ("own" in m) m.own(s);
    else s.sweep(m.sweep);
  }
  return s;
}

describe("GatewayState - one fold", () => {
  it("two instances fed the same messages serialize to identical snapshots", () => {
    for (const seed of [1, 2, 3, 4, 5]) {
      const msgs = history(seed, 2_000);
      const now = T0 + 1_000_000;
      const a = JSON.stringify(fold(msgs).snapshot(now));
      const b = JSON.stringify(fold(msgs).snapshot(now));
      expect(b).toBe(a);
      // And the snapshot is not trivially constant: another history differs.
      expect(JSON.stringify(fold(history(seed + 100, 2_000)).snapshot(now))).not.toBe(a);
    }
  });

  it("tracks the last sequence of every stream, skipped messages included", () => {
    const s = new GatewayState({ self: "self" });
    s.apply({ type: "load", model: M, pod: "p0", ts: T0, stale: true, load: null }, { stream: "load", subject: "x", seq: 5, serverTs: T0 });
    s.skip({ stream: "charges", subject: "y", seq: 9, serverTs: 0 });
    s.skip({ stream: "charges", subject: "y", seq: 3, serverTs: 0 });
    expect(s.cursors).toMatchObject({ load: 5, charges: 9, pods: 0, kv: 0, config: 0 });
  });

  it("ignores its own echoes but counts other gateways' charges in ledger and rate windows", () => {
    const s = new GatewayState({ self: "self" });
    const meta = (seq: number): EventMeta => ({ stream: "charges", subject: "c", seq, serverTs: T0 });
    const own: ChargeEvent = { type: "charge", id: "1", gateway: "self", model: M, pod: "p0", ts: T0, ttlMs: 60_000, promptTokens: 3, user: "u" };
    s.ownCharge(own, T0);
    s.ownRelease({ type: "release", id: "1", gateway: "self", model: M, pod: "p0", ts: T0, outcome: "completed" });
    expect(s.apply(own, meta(1))).toMatchObject({ applied: false, ignored: "own-echo" });
    expect(s.ledger.size).toBe(0);
    expect(s.apply({ ...own, gateway: "other" }, meta(2)).applied).toBe(true);
    expect(s.ledger.outstanding(M, "p0").requests).toBe(1);
    expect(s.rates.userRequests("u", T0)).toBe(2);
  });

  it("uses the message's server time, not a local clock: a routed prefix already expired at publish is not kept", () => {
    const s = new GatewayState({ self: "self" });
    const ev: KvRouted = { type: "kv-routed", model: M, pod: "p0", gateway: "g", hashes: ["ab"], ts: T0, ttlMs: 10 };
    expect(s.apply(ev, { stream: "kv", subject: "k", seq: 1, serverTs: T0 + 10 })).toMatchObject({ ignored: "expired" });
    expect(s.apply({ ...ev, ttlMs: 11 }, { stream: "kv", subject: "k", seq: 2, serverTs: T0 + 10 }).applied).toBe(true);
    expect(s.routed.size).toBe(1);
  });

  it("config entries: a bad model config keeps the previous one, a bad API key record removes the key, stale revisions are ignored", () => {
    const s = new GatewayState({ checkModelConfig: validateModelConfig });
    const at = (seq: number): EventMeta => ({ stream: "config", subject: "k", seq, serverTs: T0 });
    s.apply({ type: "config-entry", key: "model.m", operation: "PUT", value: { lockedRoutingStrategy: "random" } }, at(1));
    const bad = s.apply({ type: "config-entry", key: "model.m", operation: "PUT", value: { lockedRoutingStrategy: 5 } }, at(2));
    expect(bad.note?.rejected).toBe(true);
    expect(s.configs.get("m")?.lockedRoutingStrategy).toBe("random");
    expect(s.apply({ type: "config-entry", key: "model.m", operation: "DEL" }, at(2)).ignored).toBe("stale");
    // Written around the CLI: plugin parameters the strategy does not take would 400 every request; kept out.
    const params = s.apply({ type: "config-entry", key: "model.m", operation: "PUT", value: { defaultProfile: "p", profiles: { p: { strategyParams: { random: { x: 1 } } } } } }, at(2.5));
    expect(params.note?.rejected).toBe(true);
    expect(s.configs.get("m")?.lockedRoutingStrategy).toBe("random");
    const hash = "a".repeat(64);
    s.apply({ type: "config-entry", key: `apikey.${hash}`, operation: "PUT", value: { user: "dave", createdAt: T0 } }, at(3));
    expect(s.apiKeys.get(hash)?.user).toBe("dave");
    s.apply({ type: "config-entry", key: `apikey.${hash}`, operation: "PUT", notJson: true }, at(4));
    expect(s.apiKeys.get(hash)).toBeUndefined();
    expect(s.configRejected).toBe(3);
  });
});

describe("GatewayState - cloneAs", () => {
  it("a clone continues exactly like the original, and changes to one never reach the other", () => {
    const msgs = history(7, 3_000);
    const half = msgs.slice(0, 1_500);
    const rest = msgs.slice(1_500);
    const original = fold(half);
    const clone = original.cloneAs("self");
    for (const s of [original, clone]) {
      for (const m of rest) {
        if ("ev" in m) s.apply(m.ev, m.meta);
        else if ("own" in m) m.own(s);
        else s.sweep(m.sweep);
      }
    }
    const now = T0 + 1_000_000;
    expect(JSON.stringify(clone.snapshot(now))).toBe(JSON.stringify(original.snapshot(now)));
    expect(JSON.stringify(clone.snapshot(now))).toBe(JSON.stringify(fold(msgs).snapshot(now)));
    clone.apply({ type: "pod", action: "remove", model: M, pod: "p0", address: "10.0.0.0:8000", ready: false, engine: "vllm", ts: T0 }, { stream: "pods", subject: "x", seq: 10_000, serverTs: T0 });
    expect(original.pods.get(M, "p0")).toBeDefined();
    expect(clone.pods.get(M, "p0")).toBeUndefined();
    expect(clone.cloneAs("other").ledger.self).toBe("other");
  });
});

describe("GatewayState - sweep clocks", () => {
  it("rate windows follow the gateway's clock, liveness the broker's: a host clock behind the broker keeps its minute's counts", () => {
    const s = new GatewayState({ self: "self" });
    const local = 60_000 * 100 + 59_000; // second 59 of minute 100 on this host
    s.ownCharge({ type: "charge", id: "1", gateway: "self", model: M, pod: "p0", ts: local, ttlMs: 600_000, promptTokens: 3, user: "u" }, local);
    // The broker is already in minute 101 (this host runs 2 s behind).
    s.sweep(local + 500, { liveNow: local + 2_500 });
    expect(s.rates.userRequests("u", local + 500)).toBe(1);
  });
});

describe("GatewayState - peers lapse by the CHARGES stream's time, not by a timer", () => {
  const beat = (gateway: string, ts: number): StateEvent => ({ type: "heartbeat", gateway, ts, intervalMs: 1_000, startedAt: T0, state: "up" });
  const at = (seq: number, serverTs: number, subject = "c"): EventMeta => ({ stream: "charges", subject, seq, serverTs });
  const peerCharge = (id: string, ts: number): ChargeEvent => ({ type: "charge", id, gateway: "b", model: M, pod: "p0", ts, ttlMs: 600_000, promptTokens: 4 });

  it("a replica whose fold lags keeps a live peer's charges whenever its sweep timer fires", () => {
    const s = new GatewayState({ self: "a", heartbeatTimeoutMs: 3_000 });
    s.apply(beat("b", T0), at(1, T0));
    s.apply(peerCharge("1", T0 + 10), at(2, T0 + 10));
    // The host is busy: the timer fires 5 s later, while b's next beats are still unread.
    s.sweep(T0 + 5_000, { routed: true, liveNow: T0 + 5_000 });
    expect(s.ledger.outstanding(M, "p0").requests).toBe(1);
    // b's beat of T0 + 900 is read at last: b was never silent for 3 s of stream time.
    s.apply(beat("b", T0 + 900), at(3, T0 + 900));
    s.apply(peerCharge("2", T0 + 950), at(4, T0 + 950));
    expect(s.ledger.outstanding(M, "p0").requests).toBe(2);
    // The stream (here our own heartbeat's echo, skipped unparsed) passes b's deadline: b lapses.
    s.skip({ stream: "charges", subject: "jr.hb.a", seq: 5, serverTs: T0 + 3_901 });
    expect(s.ledger.outstanding(M, "p0").requests).toBe(0);
    expect(s.ledger.expired).toBe(2);
  });

  it("the ledger at a cursor does not depend on when (or whether) sweeps ran between messages", () => {
    // Three peers beating every 200 ms with gaps (a starved publisher), charges and releases between.
    const rnd = lcg(11);
    const msgs: Array<{ ev: StateEvent; meta: EventMeta }> = [];
    let t = T0;
    let seq = 0;
    const last: Record<string, number> = {};
    for (let i = 0; i < 3_000; i++) {
      t += Math.floor(rnd() * 40);
      const gw = ["b", "c", "d"][Math.floor(rnd() * 3)] as string;
      const r = rnd();
      if (r < 0.3) {
        // Now and then a beat comes late: longer than the 600 ms timeout.
        if (t - (last[gw] ?? 0) > 200 && rnd() < 0.97) {
          msgs.push({ ev: beat(gw, t), meta: at(++seq, t) });
          last[gw] = t;
        }
      } else if (r < 0.7) msgs.push({ ev: { ...peerCharge(`${i}`, t), gateway: gw, pod: `p${i % 4}` }, meta: at(++seq, t) });
      else {
        const back = msgs[Math.floor(rnd() * msgs.length)]?.ev;
        if (back?.type === "charge") msgs.push({ ev: { type: "release", id: back.id, gateway: back.gateway, model: M, pod: back.pod, ts: t, outcome: "completed" }, meta: at(++seq, t) });
      }
    }
    const swept = new GatewayState({ self: "a", heartbeatTimeoutMs: 600 });
    const plain = new GatewayState({ self: "a", heartbeatTimeoutMs: 600 });
    let dropped = 0;
    for (const m of msgs) {
      swept.apply(m.ev, m.meta);
      plain.apply(m.ev, m.meta);
      // A timer at a wall time anywhere from on time to seconds late.
      if (rnd() < 0.3) swept.sweep(m.meta.serverTs + Math.floor(rnd() * 3_000), { routed: rnd() < 0.1, liveNow: m.meta.serverTs + Math.floor(rnd() * 3_000) });
      if (m.meta.seq % 16 === 0) expect(swept.ledger.dump(t)).toEqual(plain.ledger.dump(t));
      dropped = plain.ledger.expired;
    }
    // Lapses did happen (the property is not vacuous).
    expect(dropped).toBeGreaterThan(0);
  });
});

describe("GatewayState - response locations", () => {
  it("folds RESPONSES records into the bounded view, moves its own cursor, and notes a refused record", () => {
    const s = new GatewayState({ self: "self", maxResponseLocations: 2 });
    const alice = tenantDigest("alice");
    const rec = (id: string, seq: number, o: Partial<ResponseLocationEvent> = {}): [ResponseLocationEvent, EventMeta] => [
      { type: "response-location", action: "stored", id, tenant: alice, gateway: "gw-a", ts: T0, model: M, pod: "p0", expiresAt: T0 + 60_000, stored: true, ...o },
      { stream: "responses", subject: "jr.resploc.x", seq, serverTs: T0 + seq },
    ];
    expect(s.apply(...rec("resp_a", 1)).applied).toBe(true);
    expect(s.responses.get("resp_a", T0 + 2)?.pod).toBe("p0");
    const refused = s.apply(...rec("resp_a", 2, { tenant: tenantDigest("mallory"), pod: "p9" }));
    expect(refused).toMatchObject({ applied: false, ignored: "response-conflict", note: { level: "warn" } });
    s.apply(...rec("resp_b", 3));
    s.apply(...rec("resp_c", 4));
    expect(s.responses.size).toBe(2);
    expect(s.responses.evicted).toBe(1);
    expect(s.responsesCursor).toBe(4);
    // The decision records' cursors are untouched: a decision records the affinity it used.
    expect(s.cursors).toEqual({ pods: 0, load: 0, charges: 0, kv: 0, config: 0 });
    // A clone continues like the original.
    const c = s.cloneAs("other");
    expect(c.responses.get("resp_c", T0 + 5)?.pod).toBe("p0");
    s.sweep(T0 + 60_000);
    expect(s.responses.size).toBe(0);
    expect(c.responses.size).toBe(2);
  });
});
