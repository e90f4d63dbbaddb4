/**
 * Which models' pods a pod-watcher publishes under gateway pools: the pure rule, and the config
 * bucket reader on a real nats-server (entries added, changed, made invalid, deleted; no bucket).
 */
import { Kvm } from "@nats-io/kv";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { POOL_KEY_PREFIX } from "../../schemas/config.js";
import { configBucketName } from "../../streams/definitions.js";
import { quietLog, startTestEnv, type TestEnv, waitFor } from "../../test/harness/env.js";
import { PoolMap } from "../views/pool-map.js";
import { followPools, modelFilterFor } from "./pool-models.js";

describe("modelFilterFor", () => {
  const map = new PoolMap();
  map.set("chat", ["a"]);
  map.set("code", ["b"]);
  const accepts = (f: ReturnType<typeof modelFilterFor>, m: string) => (typeof f === "function" ? f(m) : f);

  it("a pooled watcher takes its pool's models only; an unpooled one the models no pool lists", () => {
    expect(["a", "b", "free"].map((m) => accepts(modelFilterFor("chat", map), m))).toEqual([true, false, false]);
    expect(["a", "b", "free"].map((m) => accepts(modelFilterFor(undefined, map), m))).toEqual([false, false, true]);
    // A pool with no entry (deleted, or never set) takes nothing: its watcher removes its pods.
    expect(accepts(modelFilterFor("gone", map), "a")).toBe(false);
  });

  it("before the pools were ever read: a pooled watcher's models are unknown (publish and remove nothing), an unpooled one keeps every pod", () => {
    expect(modelFilterFor("chat", undefined)).toBe("unknown");
    expect(modelFilterFor(undefined, undefined)).toBeUndefined();
    // A pool whose entry exists but never validated: unknown too (a restart on a botched entry removes nothing).
    expect(modelFilterFor("bad", map, new Set(["bad"]))).toBe("unknown");
    expect(typeof modelFilterFor("chat", map, new Set(["bad"]))).toBe("function");
  });
});

describe("followPools on a real nats-server", () => {
  let env: TestEnv;
  beforeAll(async () => {
    env = await startTestEnv();
  });
  afterAll(async () => {
    await env?.stop();
  });

  it("reads every pool, follows changes, keeps a pool's models when its entry stops validating, drops a deleted pool", async () => {
    const kv = await new Kvm(env.nats.nc).open(configBucketName("jr"));
    await kv.put(`${POOL_KEY_PREFIX}chat`, JSON.stringify({ models: ["a"] }));
    await kv.put(`${POOL_KEY_PREFIX}botched`, "{not json");
    let map: PoolMap | undefined;
    let invalid: ReadonlySet<string> = new Set();
    const f = followPools({
      nc: env.nats.nc, configPrefix: "jr", log: quietLog, pollMs: 50,
      onPools: (m, bad) => {
        map = m;
        invalid = bad;
      },
    });
    try {
      expect(await f.ready).toBe(true);
      expect(map?.poolOf("a")).toBe("chat");
      expect([...invalid]).toEqual(["botched"]);
      expect(map?.modelsOf("botched")).toBeUndefined();
      await kv.put(`${POOL_KEY_PREFIX}code`, JSON.stringify({ models: ["b"] }));
      await waitFor(() => map?.poolOf("b") === "code", 5_000, "a new pool");
      // An entry that stops validating: the previous models stay (a read happened, nothing changed).
      await kv.put(`${POOL_KEY_PREFIX}chat`, JSON.stringify({ models: [] }));
      const reads = f.reads;
      await waitFor(() => f.reads >= reads + 2, 5_000, "two more reads");
      expect(map?.poolOf("a")).toBe("chat");
      await kv.delete(`${POOL_KEY_PREFIX}chat`);
      await waitFor(() => map?.poolOf("a") === undefined, 5_000, "the deleted pool gone");
      expect(map?.names()).toEqual(["code"]);
    } finally {
      f.stop();
    }
  });

  it("no config bucket at all means no pools (a confirmed absence, not a failed read)", async () => {
    let map: PoolMap | undefined;
    const f = followPools({ nc: env.nats.nc, configPrefix: "nobucket", log: quietLog, onPools: (m) => (map = m) });
    try {
      expect(await f.ready).toBe(true);
      expect(map?.names()).toEqual([]);
    } finally {
      f.stop();
    }
  });
});
