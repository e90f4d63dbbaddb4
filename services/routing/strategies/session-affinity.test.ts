import { createHmac } from "node:crypto";
import { describe, expect, it } from "vitest";
import { parseStrategy } from "./registry.js";
import {
  configureSessionSigning,
  decodeSessionId,
  encodeSessionId,
  rendezvous,
  SESSION_ID_CACHE_ADDRESSES,
  SessionSigner,
  sessionAddressOf,
  sessionAffinityStrategy,
  sessionHintOf,
  sessionIdOf,
} from "./session-affinity.js";
import { ctxOf, pod } from "./testing.js";

const PODS = ["p1", "p2", "p3"];
const addr = (name: string) => pod(name).address;
const std = (s: string) => Buffer.from(s).toString("base64");
const none = () => [];

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
    expect(decodeSessionId(encodeSessionId("10.0.0.7:8000"), none)).toBe("10.0.0.7:8000");
    expect(decodeSessionId(encodeSessionId("[fd00::1]:8000"), none)).toBe("[fd00::1]:8000");
    expect(decodeSessionId("x".repeat(200), none)).toBeUndefined();
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


describe("session-affinity - session ids under a fleet secret", () => {
  const SECRET = "fleet-secret";
  const ADDRESSES = ["10.0.0.7:8000", "192.168.13.201:31337", "[fd00::1]:8000", "[2001:db8::abcd]:9000"];
  const candidates = (...names: string[]) => () => names.map(addr);
  // The previous signed form, computed here on its own: `<base64url address>.<HMAC-SHA256(secret, address), 96 bits>`.
  const legacyId = (address: string, secret = SECRET) =>
    `${Buffer.from(address).toString("base64url")}.${createHmac("sha256", secret).update(address).digest().subarray(0, 12).toString("base64url")}`;
  const signed = (fn: () => void) => {
    configureSessionSigning(SECRET);
    try {
      fn();
    } finally {
      configureSessionSigning(undefined);
    }
  };
  /** Every text any base64 reading of any part of `id` gives: each run of base64 characters, from each of the 4 alignments. */
  const decodings = (id: string): string[] =>
    id.split(/[^A-Za-z0-9+/_-]+/).flatMap((part) => [0, 1, 2, 3].map((from) => Buffer.from(part.slice(from), "base64").toString("latin1")));

  it("an id is short, header-safe and reveals nothing about the pod: no base64 reading of any part holds its ip or port", () => {
    signed(() => {
      for (const address of ADDRESSES) {
        const id = encodeSessionId(address);
        expect(id).toMatch(/^[A-Za-z0-9_-]{16}$/);
        const port = address.slice(address.lastIndexOf(":") + 1);
        const ip = address.slice(0, address.lastIndexOf(":")).replace(/^\[|\]$/g, "");
        for (const text of [id, ...decodings(id)]) {
          expect(text).not.toContain(ip);
          expect(text).not.toContain(port);
        }
        // The ip's bytes (IPv4) do not appear either.
        if (!ip.includes(":")) {
          const raw = Buffer.from(ip.split(".").map(Number));
          for (const text of decodings(id)) expect(Buffer.from(text, "latin1").includes(raw)).toBe(false);
        }
      }
      expect(new Set(ADDRESSES.map(encodeSessionId)).size).toBe(ADDRESSES.length);
    });
  });

  it("every replica with the secret resolves an id to the same pod, whatever the candidate order, without shared state", () => {
    let id = "";
    signed(() => {
      id = encodeSessionId(addr("p2"));
      expect(decodeSessionId(id, candidates("p1", "p2", "p3"))).toBe(addr("p2"));
    });
    // Another replica: the same secret, nothing cached, the pods in another order.
    signed(() => {
      expect(encodeSessionId(addr("p2"))).toBe(id);
      expect(decodeSessionId(id, candidates("p3", "p2", "p1"))).toBe(addr("p2"));
      const p = sessionAffinityStrategy.pick(ctxOf({ pods: ["p3", "p1", "p2"], headers: { "x-session-id": id }, inFlight: { p2: 50 } }));
      expect(p.pod.pod).toBe("p2");
      expect(p.fallback).toBeUndefined();
      expect(p.responseHeaders).toEqual({ "x-session-id": id });
    });
  });

  it("an id for a pod that left names nothing: the request is routed as without a session", () => {
    signed(() => {
      const gone = encodeSessionId(addr("p9"));
      expect(decodeSessionId(gone, candidates("p1", "p2", "p3"))).toBeUndefined();
      const p = sessionAffinityStrategy.pick(ctxOf({ pods: PODS, headers: { "x-session-id": gone }, inFlight: { p1: 2, p2: 0, p3: 1 } }));
      expect(p.pod.pod).toBe("p2");
      expect(p.fallback).toBe("least-request");
      expect(p.responseHeaders).toEqual({ "x-session-id": encodeSessionId(addr("p2")) });
    });
  });

  it("an id the fleet did not make names no pod: forged, tampered, another secret's, or a plain address", () => {
    const pods = candidates("p1", "p2", "p3");
    let otherFleet = "";
    configureSessionSigning("another-secret");
    try {
      otherFleet = encodeSessionId(addr("p1"));
    } finally {
      configureSessionSigning(undefined);
    }
    signed(() => {
      const id = encodeSessionId(addr("p1"));
      const flip = (s: string, i: number) => `${s.slice(0, i)}${s[i] === "A" ? "B" : "A"}${s.slice(i + 1)}`;
      const forged = [
        otherFleet,
        flip(id, 0),
        flip(id, 15),
        `${id}x`,
        `${id}=`,
        id.slice(0, 15),
        "AAAAAAAAAAAAAAAA",
        std(addr("p1")),
        Buffer.from(addr("p1")).toString("base64url"),
        legacyId(addr("p1"), "another-secret"),
        `${Buffer.from(addr("p1")).toString("base64url")}.${id}`,
      ];
      for (const f of forged) {
        expect(decodeSessionId(f, pods), f).toBeUndefined();
        const p = sessionAffinityStrategy.pick(ctxOf({ pods: PODS, headers: { "x-session-id": f }, inFlight: { p1: 3, p2: 1, p3: 0 } }));
        expect(p.pod.pod, f).toBe("p3");
        expect(p.fallback, f).toBe("least-request");
      }
    });
  });

  it("an id of the previous signed form is still accepted, verified, and answered with an opaque one", () => {
    signed(() => {
      const old = legacyId(addr("p1"));
      expect(decodeSessionId(old, none)).toBe(addr("p1"));
      expect(decodeSessionId(`${old}x`, none)).toBeUndefined();
      const p = sessionAffinityStrategy.pick(ctxOf({ pods: PODS, headers: { "x-session-id": old }, inFlight: { p1: 9 } }));
      expect(p.pod.pod).toBe("p1");
      expect(p.responseHeaders).toEqual({ "x-session-id": encodeSessionId(addr("p1")) });
      expect(p.responseHeaders?.["x-session-id"]).not.toContain(".");
    });
  });

  it("the id cache is bounded and starting over never changes an id; a bad secret or bound is a clear error", () => {
    const small = new SessionSigner(SECRET, 2);
    const first = ADDRESSES.map((a) => sessionIdOf(a, small));
    expect(ADDRESSES.map((a) => sessionIdOf(a, new SessionSigner(SECRET)))).toEqual(first);
    expect(ADDRESSES.map((a) => sessionAddressOf(sessionIdOf(a, small), small, () => ADDRESSES))).toEqual(ADDRESSES);
    expect(() => new SessionSigner("")).toThrow("session secret must not be empty");
    expect(() => new SessionSigner(SECRET, 0)).toThrow("session id cache size must be a positive integer, got 0");
    expect(SESSION_ID_CACHE_ADDRESSES).toBe(4096);
  });

  it("candidates are asked for only for an opaque id under a secret", () => {
    let asked = 0;
    const pods = () => {
      asked++;
      return [addr("p1")];
    };
    sessionHintOf({ "x-session-id": std(addr("p1")) }, pods);
    signed(() => {
      sessionHintOf({ "x-aibrix-session-key": "k" }, pods);
      sessionHintOf({ "x-session-id": legacyId(addr("p1")) }, pods);
      expect(asked).toBe(0);
      expect(sessionHintOf({ "x-session-id": encodeSessionId(addr("p1")) }, pods)).toEqual({ address: addr("p1") });
      expect(asked).toBe(1);
    });
  });
});
