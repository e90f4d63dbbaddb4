import { setFlagsFromString } from "node:v8";
import { runInNewContext } from "node:vm";
import { describe, expect, it } from "vitest";
import { tenantDigest, type ResponseLocationEvent } from "../../schemas/responses.js";
import { ResponseLocations } from "./response-locations.js";

const T0 = 1_750_000_000_000;
const DAY = 86_400_000;
const ALICE = tenantDigest("alice");
const BOB = tenantDigest("bob");

const stored = (id: string, o: Partial<ResponseLocationEvent> = {}): ResponseLocationEvent => ({
  type: "response-location", action: "stored", id, tenant: ALICE, gateway: "gw-a", ts: T0, model: "m/llama", pod: "pod-0", expiresAt: T0 + DAY, stored: true, ...o,
});

describe("response locations", () => {
  it("records where a response lives and forgets it at its expiry", () => {
    const v = new ResponseLocations();
    expect(v.apply(stored("resp_1"), T0)).toBe("applied");
    expect(v.get("resp_1", T0 + 1)).toMatchObject({ pod: "pod-0", model: "m/llama", tenant: ALICE, createdAt: T0, expiresAt: T0 + DAY, stored: true });
    expect(v.get("resp_1", T0 + DAY)).toBeUndefined();
    expect(v.get("resp_2", T0)).toBeUndefined();
    expect(v.sweep(T0 + DAY)).toBe(1);
    expect(v.size).toBe(0);
    expect(v.expired).toBe(1);
  });

  it("a record already past its expiry on the broker's clock is not held", () => {
    const v = new ResponseLocations();
    expect(v.apply(stored("resp_1", { expiresAt: T0 + 10 }), T0 + 10)).toBe("expired");
    expect(v.size).toBe(0);
  });

  it("stays within its bound, evicting the oldest and counting them", () => {
    const v = new ResponseLocations(3);
    for (let i = 0; i < 5; i++) v.apply(stored(`resp_${i}`, { ts: T0 + i }), T0 + i);
    expect(v.size).toBe(3);
    expect(v.evicted).toBe(2);
    expect(v.get("resp_0", T0)).toBeUndefined();
    expect(v.get("resp_4", T0)?.pod).toBe("pod-0");
  });

  it("sweeps from the oldest end only what has expired", () => {
    const v = new ResponseLocations();
    for (let i = 0; i < 4; i++) v.apply(stored(`resp_${i}`, { ts: T0 + i, expiresAt: T0 + 100 + i }), T0 + i);
    expect(v.sweep(T0 + 102)).toBe(3);
    expect(v.dump().map(([id]) => id)).toEqual(["resp_3"]);
  });

  it("another tenant can neither take over nor delete a response's entry", () => {
    const v = new ResponseLocations();
    v.apply(stored("resp_1"), T0);
    expect(v.apply(stored("resp_1", { tenant: BOB, pod: "pod-9" }), T0 + 1)).toBe("conflict");
    expect(v.apply({ type: "response-location", action: "deleted", id: "resp_1", tenant: BOB, gateway: "g", ts: T0 + 2 }, T0 + 2)).toBe("conflict");
    expect(v.get("resp_1", T0 + 3)?.pod).toBe("pod-0");
    expect(v.conflicts).toBe(2);
    // The owner deletes it.
    expect(v.apply({ type: "response-location", action: "deleted", id: "resp_1", tenant: ALICE, gateway: "g", ts: T0 + 4 }, T0 + 4)).toBe("applied");
    expect(v.get("resp_1", T0 + 5)).toBeUndefined();
  });

  it("a stored record missing its pod, model or expiry is refused and counted", () => {
    const v = new ResponseLocations();
    const { pod: _p, ...noPod } = stored("resp_1");
    expect(v.apply(noPod as ResponseLocationEvent, T0)).toBe("invalid");
    expect(v.invalid).toBe(1);
    expect(v.size).toBe(0);
  });

  it("two folds of the same records hold the same entries in the same order", () => {
    const recs = Array.from({ length: 200 }, (_, i) => stored(`resp_${i % 150}`, { ts: T0 + i, pod: `pod-${i % 7}`, tenant: i % 2 ? ALICE : BOB }));
    const fold = () => {
      const v = new ResponseLocations(100);
      for (const [i, r] of recs.entries()) v.apply(r, T0 + i);
      return JSON.stringify(v.dump());
    };
    expect(fold()).toBe(fold());
  });

  it("costs under 260 bytes of heap per entry (measured: ids of 37 characters, 16 pods, 50 tenants)", () => {
    setFlagsFromString("--expose-gc");
    const gc = runInNewContext("gc") as () => void;
    const N = 100_000;
    const tenants = Array.from({ length: 50 }, (_, i) => tenantDigest(`t${i}`));
    gc();
    gc();
    const before = process.memoryUsage().heapUsed;
    const v = new ResponseLocations(N);
    // Each record as a follower hands it over: fresh strings from JSON.parse (garbage once folded).
    for (let i = 0; i < N; i++) {
      const r = JSON.stringify(stored(`resp_${i.toString(16).padStart(32, "0")}`, { pod: `vllm-${i % 16}.default`, tenant: tenants[i % 50] as string }));
      v.apply(JSON.parse(r) as ResponseLocationEvent, T0);
    }
    gc();
    gc();
    const perEntry = (process.memoryUsage().heapUsed - before) / N;
    expect(v.size).toBe(N);
    console.log(`response locations: ${perEntry.toFixed(0)} bytes per entry`);
    expect(perEntry).toBeLessThan(260);
    expect(perEntry).toBeGreaterThan(40);
  });
});
