import { describe, expect, it } from "vitest";
import { parseStrategy } from "./registry.js";
import { configureSessionSigning, decodeSessionId, encodeSessionId, rendezvous, sessionAffinityStrategy } from "./session-affinity.js";
import { ctxOf, pod } from "./testing.js";

const PODS = ["p1", "p2", "p3"];
const addr = (name: string) => pod(name).address;
const std = (s: string) => Buffer.from(s).toString("base64");

describe("session-affinity - table", () => {
  it.each<{ name: string; headers: Record<string, string>; inFlight?: Record<string, number>; want: string; fallback?: string }>([
    { name: "x-session-id sticks to its pod, however loaded", headers: { "x-session-id": encodeSessionId(addr("p2")) }, inFlight: { p2: 50 }, want: "p2" },
    { name: "standard base64 (AIBrix-issued) sticks too", headers: { "x-session-id": std(addr("p3")) }, want: "p3" },
    { name: "x-session-id wins over the session key", headers: { "x-session-id": encodeSessionId(addr("p1")), "x-aibrix-session-key": "k" }, want: "p1" },
    { name: "pod gone: least-request", headers: { "x-session-id": encodeSessionId("10.9.9.9:8000") }, inFlight: { p1: 2, p2: 0, p3: 1 }, want: "p2", fallback: "least-request" },
    { name: "not base64: least-request", headers: { "x-session-id": "%%%" }, inFlight: { p1: 0, p2: 1, p3: 1 }, want: "p1", fallback: "least-request" },
    { name: "no header: least-request", headers: {}, inFlight: { p1: 1, p2: 1, p3: 0 }, want: "p3", fallback: "least-request" },
    { name: "session key longer than 256: ignored", headers: { "x-aibrix-session-key": "k".repeat(257) }, inFlight: { p1: 1, p2: 0, p3: 1 }, want: "p2", fallback: "least-request" },
  ])("$name", ({ headers, inFlight, want, fallback }) => {
    const p = sessionAffinityStrategy.pick(ctxOf({ pods: PODS, headers, inFlight: inFlight ?? {} }));
    expect(p.pod.pod).toBe(want);
    expect(p.fallback).toBe(fallback);
    expect(p.responseHeaders).toEqual({ "x-session-id": encodeSessionId(addr(want)) });
  });

  it("the session id handed out round-trips", () => {
    expect(decodeSessionId(encodeSessionId("10.0.0.7:8000"))).toBe("10.0.0.7:8000");
    expect(decodeSessionId(encodeSessionId("[fd00::1]:8000"))).toBe("[fd00::1]:8000");
    expect(decodeSessionId("x".repeat(200))).toBeUndefined();
  });

  it("a session key maps to one pod, the same whatever the candidate order", () => {
    for (const key of ["alice", "bob", "conversation-42"]) {
      const a = sessionAffinityStrategy.pick(ctxOf({ pods: PODS, headers: { "x-aibrix-session-key": key } }));
      const b = sessionAffinityStrategy.pick(ctxOf({ pods: [...PODS].reverse(), headers: { "x-aibrix-session-key": key }, random: () => 0.99 }));
      expect(b.pod.pod).toBe(a.pod.pod);
      expect(a.fallback).toBeUndefined();
    }
  });

  it("keys spread over the pods", () => {
    const count = new Map<string, number>();
    const pods = PODS.map(pod);
    for (let k = 0; k < 3000; k++) {
      const p = pods[rendezvous(`key-${k}`, pods)]?.pod as string;
      count.set(p, (count.get(p) ?? 0) + 1);
    }
    for (const name of PODS) expect(count.get(name)).toBeGreaterThan(800);
  });

  it("adding a pod moves only ~1/n of the keys, all of them to the new pod", () => {
    const before = ["p1", "p2", "p3", "p4", "p5"].map(pod);
    const after = [...before, pod("p6")];
    let moved = 0;
    const keys = 6000;
    for (let k = 0; k < keys; k++) {
      const a = before[rendezvous(`key-${k}`, before)]?.pod;
      const b = after[rendezvous(`key-${k}`, after)]?.pod;
      if (a !== b) {
        moved++;
        expect(b).toBe("p6");
      }
    }
    expect(moved / keys).toBeGreaterThan(0.13);
    expect(moved / keys).toBeLessThan(0.2); // 1/6 ≈ 0.167
  });

  it("removing a pod moves only its keys", () => {
    const all = ["p1", "p2", "p3", "p4"].map(pod);
    const without = all.filter((p) => p.pod !== "p2");
    for (let k = 0; k < 2000; k++) {
      const a = all[rendezvous(`key-${k}`, all)]?.pod;
      const b = without[rendezvous(`key-${k}`, without)]?.pod;
      if (a !== "p2") expect(b).toBe(a);
    }
  });

  it("in a combination it still sets x-session-id, for the pod the combination chose", () => {
    const headers = { "x-session-id": encodeSessionId(addr("p1")) };
    const inFlight = { p1: 10, p2: 0 };
    const sticky = parseStrategy("session-affinity:2,least-request:1").pick(ctxOf({ pods: ["p1", "p2"], headers, inFlight }));
    expect(sticky.pod.pod).toBe("p1");
    expect(sticky.responseHeaders).toEqual({ "x-session-id": encodeSessionId(addr("p1")) });
    const loadFirst = parseStrategy("session-affinity:1,least-request:2").pick(ctxOf({ pods: ["p1", "p2"], headers, inFlight }));
    expect(loadFirst.pod.pod).toBe("p2");
    expect(loadFirst.responseHeaders).toEqual({ "x-session-id": encodeSessionId(addr("p2")) });
  });
});

describe("session-affinity - signed session ids", () => {
  it("with a shared secret, only ids this fleet signed name a pod: a forged or tampered id pins nothing", () => {
    configureSessionSigning("fleet-secret");
    try {
      const id = encodeSessionId("10.0.0.7:8000");
      expect(id).toMatch(/^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]{16}$/);
      expect(decodeSessionId(id)).toBe("10.0.0.7:8000");
      // A client's own plain base64 (AIBrix's format) or a signature for another address.
      expect(decodeSessionId(Buffer.from("10.0.0.7:8000").toString("base64"))).toBeUndefined();
      const other = encodeSessionId("10.0.0.8:8000");
      expect(decodeSessionId(`${id.split(".")[0]}.${other.split(".")[1]}`)).toBeUndefined();
      expect(decodeSessionId(`${id}x`)).toBeUndefined();
      // Another fleet's secret.
      configureSessionSigning("another-secret");
      expect(decodeSessionId(id)).toBeUndefined();
    } finally {
      configureSessionSigning(undefined);
    }
    // Unsigned again: plain ids are accepted, signed ones are not ours.
    expect(decodeSessionId(encodeSessionId("10.0.0.7:8000"))).toBe("10.0.0.7:8000");
  });
});
