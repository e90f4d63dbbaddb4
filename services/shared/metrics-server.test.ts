import { describe, expect, it } from "vitest";
import { quietLog } from "../../test/harness/env.js";
import { startMetricsServer, statsRegistry } from "./metrics-server.js";

describe("publisher metrics - stats as Prometheus gauges", () => {
  it("exposes every numeric stat, nested names dotted, read at scrape time", async () => {
    const stats = { scrapes: 3, cleared: { "engine-restart": 1 }, label: "ignored" };
    const srv = await startMetricsServer(0, "127.0.0.1", statsRegistry("kv-bridge", () => stats), quietLog);
    try {
      stats.scrapes = 7;
      const text = await (await fetch(`http://127.0.0.1:${srv.port}/metrics`)).text();
      expect(text).toMatch(/jetroute_kv_bridge_stat\{name="scrapes"\} 7/);
      expect(text).toMatch(/jetroute_kv_bridge_stat\{name="cleared.engine-restart"\} 1/);
      expect(text).not.toMatch(/label/);
      expect(text).toMatch(/jetroute_kv_bridge_process_cpu_seconds_total/);
      expect((await fetch(`http://127.0.0.1:${srv.port}/healthz`)).status).toBe(200);
      expect((await fetch(`http://127.0.0.1:${srv.port}/nope`)).status).toBe(404);
    } finally {
      srv.close();
    }
  });
});
