/**
 * The scraper against real simulated engines and a real nats-server: load samples reach LOAD
 * with the engine's numbers, and a pod whose /metrics stops answering is published stale.
 */
import http from "node:http";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { LoadSample } from "../../schemas/events.js";
import { MODEL, quietLog, startTestEnv, type TestEnv, waitFor } from "../../test/harness/env.js";
import { type SimFleet, startSimFleet } from "../sim/fleet.js";
import { DEFAULT_METRICS_BODY_BYTES, scrapeOnce, startScraper } from "./scraper.js";

describe("metrics-scraper - engines to LOAD", () => {
  let env: TestEnv;
  let fleet: SimFleet;
  beforeAll(async () => {
    env = await startTestEnv();
    fleet = await startSimFleet({ pods: 2, model: MODEL, engine: ["vllm", "sglang"], timeScale: 2, logger: quietLog });
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
      // The engine's context length, as its /v1/models reports it, rides on the sample.
      const listed = (await (await fetch(`http://${vllm.address}/v1/models`)).json()) as { data: Array<{ max_model_len: number }> };
      expect(listed.data[0]?.max_model_len).toBeGreaterThan(0);
      expect(latest.get(vllm.name)?.maxModelLen).toBe(listed.data[0]?.max_model_len);

      // Keep the vLLM pod busy with slow streaming requests; the scraper must see them running. Each
      // decodes for about 30 s of wall time (4000 steps of 15 ms at time scale 2), so on a loaded host
      // the three overlap until the abort below, however late the last one starts.
      const ctl = new AbortController();
      const body = JSON.stringify({ model: MODEL, messages: [{ role: "user", content: "count slowly" }], max_tokens: 4000, stream: true });
      const reqs = Array.from({ length: 3 }, () =>
        fetch(`http://${vllm.address}/v1/chat/completions`, { method: "POST", body, headers: { "content-type": "application/json" }, signal: ctl.signal })
          .then((r) => r.body?.getReader().read())
          .catch(() => undefined),
      );
      await waitFor(() => (latest.get(vllm.name)?.load?.running ?? 0) === 3, 10_000, "running=3 in a load sample");
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

describe("metrics-scraper - /metrics read with a size cap", () => {
  let env: TestEnv;
  let engine: http.Server;
  let address = "";
  let sent = 0;
  let closed = 0;
  beforeAll(async () => {
    env = await startTestEnv();
    // An engine whose exposition never ends (label cardinality run away), chunked: no content-length to refuse it by.
    engine = http.createServer((_req, res) => {
      res.writeHead(200, { "content-type": "text/plain; version=0.0.4" });
      const chunk = 'vllm:num_requests_running{model_name="m",engine="0"} 0\n'.repeat(1024);
      const pump = () => {
        while (!res.destroyed && res.write(chunk)) sent += chunk.length;
        if (!res.destroyed) res.once("drain", pump);
      };
      res.on("close", () => void closed++);
      pump();
    });
    await new Promise<void>((r) => engine.listen(0, "127.0.0.1", r));
    address = `127.0.0.1:${(engine.address() as { port: number }).port}`;
    await env.publishPod({ pod: "endless", address });
  });
  afterAll(async () => {
    engine?.closeAllConnections();
    if (engine) await new Promise((r) => engine.close(r));
    await env?.stop();
  });

  it("a body past the cap (16 MiB by default) fails the scrape with a clear error, counted, and the pod is published stale", async () => {
    const latest = new Map<string, LoadSample>();
    const sub = env.nats.nc.subscribe(env.subjects.all("load"), {
      callback: (_e, m) => {
        const sample = m.json<LoadSample>();
        latest.set(sample.pod, sample);
      },
    });
    const scraper = await startScraper({ nats: env.server.url, intervalMs: 50, timeoutMs: 10_000, staleAfterMs: 100_000, staleAfterFailures: 2, log: quietLog });
    try {
      await waitFor(() => latest.get("endless")?.stale === true, 10_000, "a stale sample for the endless pod");
      expect(latest.get("endless")?.error).toBe(`/metrics body is larger than ${DEFAULT_METRICS_BODY_BYTES} bytes`);
      expect(scraper.stats.failures).toBeGreaterThanOrEqual(2);
      // Each scrape closed its connection after the cap instead of reading on (the timeout is 10 s).
      expect(closed).toBeGreaterThanOrEqual(2);
      expect(sent).toBeLessThan(closed * (DEFAULT_METRICS_BODY_BYTES + 32 * 1024 * 1024));
    } finally {
      sub.unsubscribe();
      await scraper.close();
    }
  });

  it("maxBodyBytes sets the cap", async () => {
    const latest = new Map<string, LoadSample>();
    const sub = env.nats.nc.subscribe(env.subjects.all("load"), {
      callback: (_e, m) => {
        const sample = m.json<LoadSample>();
        latest.set(sample.pod, sample);
      },
    });
    const scraper = await startScraper({ nats: env.server.url, intervalMs: 50, timeoutMs: 10_000, staleAfterFailures: 1, maxBodyBytes: 64 * 1024, log: quietLog });
    try {
      await waitFor(() => latest.get("endless")?.error === "/metrics body is larger than 65536 bytes", 5_000, "the small cap's error");
      expect(scraper.stats.published).toBeGreaterThan(0);
    } finally {
      sub.unsubscribe();
      await scraper.close();
    }
  });
});

describe("metrics-scraper - an engine that redirects", () => {
  it("a /metrics redirect fails the scrape instead of being followed to another host", async () => {
    let elsewhere = 0;
    const other = http.createServer((_req, res) => {
      elsewhere++;
      res.writeHead(200, { "content-type": "text/plain" }).end('vllm:num_requests_running{model_name="m"} 7\n');
    });
    await new Promise<void>((r) => other.listen(0, "127.0.0.1", r));
    const otherPort = (other.address() as { port: number }).port;
    const engine = http.createServer((_req, res) => res.writeHead(302, { location: `http://127.0.0.1:${otherPort}/metrics` }).end());
    await new Promise<void>((r) => engine.listen(0, "127.0.0.1", r));
    const address = `127.0.0.1:${(engine.address() as { port: number }).port}`;
    try {
      const pod = { model: "m", pod: "p", address, engine: "vllm", role: "combined", adapters: [], labels: {}, ready: true, updatedAt: 0 } as const;
      await expect(scrapeOnce({ ...pod, adapters: [], labels: {} }, 2_000, undefined, undefined, true)).rejects.toThrow();
      expect(elsewhere).toBe(0);
    } finally {
      await new Promise((r) => engine.close(r));
      await new Promise((r) => other.close(r));
    }
  });
});

describe("metrics-scraper - --pod-cidrs", () => {
  let env: TestEnv;
  let engine: http.Server;
  let hits = 0;
  let address = "";
  beforeAll(async () => {
    env = await startTestEnv();
    engine = http.createServer((_req, res) => {
      hits++;
      res.writeHead(200, { "content-type": "text/plain" }).end('vllm:num_requests_running{model_name="m"} 1\n');
    });
    await new Promise<void>((r) => engine.listen(0, "127.0.0.1", r));
    address = `127.0.0.1:${(engine.address() as { port: number }).port}`;
    await env.publishPod({ pod: "loopback", address });
  });
  afterAll(async () => {
    if (engine) await new Promise((r) => engine.close(r));
    await env?.stop();
  });

  it("a pod outside the allowed networks is never scraped; inside them it is", async () => {
    const outside = await startScraper({ nats: env.server.url, intervalMs: 20, podCidrs: ["10.0.0.0/8"], log: quietLog });
    const inside = await startScraper({ nats: env.server.url, intervalMs: 20, podCidrs: ["127.0.0.0/8"], log: quietLog });
    try {
      // The allowed scraper's scrapes show the pod is published and scrapable; the other never touched it.
      await waitFor(() => inside.stats.scrapes >= 5, 5_000, "scrapes of the allowed pod");
      expect(outside.pods.size).toBe(0);
      expect(outside.stats.scrapes).toBe(0);
    } finally {
      await outside.close();
      await inside.close();
    }
    expect(hits).toBeGreaterThanOrEqual(5);
  });
});
