import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { quietLog, startTestEnv, type TestEnv, waitFor } from "../../test/harness/env.js";
import { kvLeaseStore } from "./kv-lease.js";
import { LeaderElector, type LeaseStore } from "./leader.js";

/** A real KV lease store whose calls can be made to hang (a half-dead API server or NATS). */
function hangable(inner: LeaseStore): LeaseStore & { hang: boolean } {
  const never = new Promise<never>(() => undefined);
  const s = {
    hang: false,
    describe: inner.describe,
    read: () => (s.hang ? never : inner.read()),
    write: (...a: Parameters<LeaseStore["write"]>) => (s.hang ? never : inner.write(...a)),
    release: (...a: Parameters<LeaseStore["release"]>) => (s.hang ? never : inner.release(...a)),
  };
  return s;
}

describe("leader election shell on a real NATS KV lease", () => {
  let env: TestEnv;
  const electors: LeaderElector[] = [];
  beforeAll(async () => {
    env = await startTestEnv();
  });
  afterAll(async () => {
    for (const e of electors) await e.stop(false).catch(() => undefined);
    await env?.stop();
  });
  const elector = (o: ConstructorParameters<typeof LeaderElector>[0]) => {
    const e = new LeaderElector(o);
    electors.push(e);
    e.start();
    return e;
  };

  it("a hung lease call is abandoned after the renewal interval: leadership lapses, and rounds resume when the store answers again", async () => {
    const store = hangable(await kvLeaseStore(env.nats, "jr", "test.hang"));
    const changes: boolean[] = [];
    const e = elector({ store, me: "hang-one", durationMs: 600, log: quietLog, onChange: (l) => changes.push(l) });
    await waitFor(() => e.isLeader(), 3_000, "leader");
    store.hang = true;
    await waitFor(() => changes.at(-1) === false, 3_000, "leadership lapsed while the store hangs");
    await waitFor(() => e.stats.timeouts > 0, 3_000, "a timed-out call");
    store.hang = false;
    // Without the bound, every later round would queue behind the call that never returns.
    await waitFor(() => e.isLeader(), 3_000, "leader again once the store answers");
    expect(e.stats.skippedTicks + e.stats.timeouts).toBeGreaterThan(0);
    await e.stop();
  });

  it("a leader that cannot publish steps down and releases the lease: the healthy standby takes over", async () => {
    const storeA = await kvLeaseStore(env.nats, "jr", "test.health");
    const storeB = await kvLeaseStore(env.nats, "jr", "test.health");
    let aHealthy = true;
    const a = elector({ store: storeA, me: "health-a", durationMs: 900, log: quietLog, onChange: () => undefined, healthy: () => aHealthy });
    await waitFor(() => a.isLeader(), 3_000, "A leads");
    const b = elector({ store: storeB, me: "health-b", durationMs: 900, log: quietLog, onChange: () => undefined });
    // B follows while A is healthy (several renewals).
    await waitFor(() => (a.stats as { acquired: number }).acquired === 1 && !b.isLeader(), 1_000, "B follows");
    aHealthy = false;
    await waitFor(() => b.isLeader(), 5_000, "B takes over");
    expect(a.isLeader()).toBe(false);
    expect(a.stats.steppedDown).toBe(1);
    expect((await storeA.read())?.holder).toBe("health-b");
    await a.stop();
    await b.stop();
  });
});
