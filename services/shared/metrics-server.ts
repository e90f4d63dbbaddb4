/**
 * Prometheus `/metrics` (and `/healthz`) for the publisher processes: their counters, read at
 * scrape time from the stats object each service already keeps, plus process metrics.
 */
import http from "node:http";
import client from "prom-client";
import type { Logger } from "./log.js";

function flatten(prefix: string, value: unknown, out: Array<[string, number]>): void {
  if (typeof value === "number" && Number.isFinite(value)) out.push([prefix, value]);
  else if (value && typeof value === "object" && !Array.isArray(value)) {
    for (const [k, v] of Object.entries(value)) flatten(prefix ? `${prefix}.${k}` : k, v, out);
  }
}

/** A registry exposing every numeric field of `stats()` as `jetroute_<service>_stat{name="..."}`. */
export function statsRegistry(service: string, stats: () => unknown): client.Registry {
  const r = new client.Registry();
  const name = service.replace(/[^a-zA-Z0-9_]/g, "_");
  client.collectDefaultMetrics({ register: r, prefix: `jetroute_${name}_` });
  new client.Gauge({
    name: `jetroute_${name}_stat`,
    help: `${service} counters and gauges, by name`,
    labelNames: ["name"],
    registers: [r],
    collect() {
      const rows: Array<[string, number]> = [];
      flatten("", stats(), rows);
      for (const [k, v] of rows) this.set({ name: k }, v);
    },
  });
  return r;
}

export async function startMetricsServer(port: number, host: string, registry: client.Registry, log: Logger): Promise<{ port: number; close(): void }> {
  const server = http.createServer((req, res) => {
    if (req.url === "/healthz") {
      res.writeHead(200, { "content-type": "application/json" });
      return res.end('{"status":"ok"}');
    }
    if (req.url !== "/metrics") {
      res.writeHead(404, { "content-type": "application/json" });
      return res.end('{"error":{"message":"not found","type":"invalid_request_error","code":404,"param":null}}');
    }
    registry.metrics().then(
      (text) => {
        res.writeHead(200, { "content-type": registry.contentType });
        res.end(text);
      },
      (err: unknown) => {
        log.error({ err }, "metrics rendering failed");
        res.writeHead(500);
        res.end();
      },
    );
  });
  const bound = await new Promise<number>((resolve, reject) => {
    server.once("error", reject);
    server.listen(port, host, () => {
      const a = server.address();
      resolve(typeof a === "object" && a ? a.port : 0);
    });
  });
  log.info({ port: bound }, "metrics listening");
  return { port: bound, close: () => server.close() };
}
