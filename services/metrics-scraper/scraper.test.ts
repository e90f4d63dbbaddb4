/**
 * The scraper against real simulated engines and a real nats-server: load samples reach LOAD
 * with the engine's numbers, and a pod whose /metrics stops answering is published stale.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { LoadSample } from "../../schemas/events.js";
import { MODEL, quietLog, startTestEnv, type TestEnv, waitFor } from "../../test/harness/env.js";
import { type SimFleet, startSimFleet } from "../sim/fleet.js";
import { startScraper } from "./scraper.js";

describe("metrics-scraper - engines to LOAD", () => {
  let env: TestEnv;
  let fleet: SimFleet;
  beforeAll(async () => {
    env = await startTestEnv();
    fleet = await startSimFleet({ pods: 2, model: MODEL, engine: ["vllm", "sglang"], timeScale: 20, logger: quietLog });
    for (const p of fleet.pods) await env.publishPod({ pod: p.name, address: p.address, engine: p.engine });
  });
  afterAll(async () => {
    await fleet?.close();
    await env?.stop();
  });

  it("publishes vLLM and SGLang load with running/waiting counts, then marks a dead pod stale", async () => {
    const latest = new Map<string, LoadSample>();
    const sub = env.nats.nc.subscribe(env.subjects.all("load"), {
      callback: (_e, m) => {
        const s = m.json<LoadSample>();
        latest.set(s.pod, s);
      },
    });
    const scraper = await startScraper({ nats: env.server.url, intervalMs: 50, timeoutMs: 300, staleAfterMs: 400, log: quietLog });
    try {
      const [vllm, sglang] = fleet.pods as [SimFleet["pods"][0], SimFleet["pods"][0]];
      await waitFor(() => latest.has(vllm.name) && latest.has(sglang.name), 3_000, "first samples");
      expect(latest.get(vllm.name)?.load).toMatchObject({ running: 0, waiting: 0, kvCacheUsage: 0, blockSize: 16 });
      expect(latest.get(sglang.name)?.load).toMatchObject({ running: 0, waiting: 0 });

      // Keep the vLLM pod busy with slow streaming requests; the scraper must see them running.
      const ctl = new AbortController();
      const body = JSON.stringify({ model: MODEL, messages: [{ role: "user", content: "count slowly" }], max_tokens: 400, stream: true });
      const reqs = Array.from({ length: 3 }, () =>
        fetch(`http://${vllm.address}/v1/chat/completions`, { method: "POST", body, headers: { "content-type": "application/json" }, signal: ctl.signal })
          .then((r) => r.body?.getReader().read())
          .catch(() => undefined),
      );
      await waitFor(() => (latest.get(vllm.name)?.load?.running ?? 0) === 3, 3_000, "running=3 in a load sample");
      ctl.abort();
      await Promise.all(reqs);

      await fleet.close();
      await waitFor(() => latest.get(vllm.name)?.stale === true && latest.get(sglang.name)?.stale === true, 3_000, "stale samples");
      expect(latest.get(vllm.name)?.load).toBeNull();
      expect(latest.get(vllm.name)?.error).toBeTruthy();
      expect(scraper.stats.failures).toBeGreaterThan(0);
    } finally {
      sub.unsubscribe();
      await scraper.close();
    }
  });
});
