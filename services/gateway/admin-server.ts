/**
 * The gateway's admin HTTP port: `/healthz`, `/readyz`, `/debug/state`, `/debug/explain` (POST)
 * and Prometheus `/metrics`. Separate from the ext_proc port so probes and scrapes never queue
 * behind Envoy's streams.
 */
import http from "node:http";
import { openAIError } from "./errors.js";
import type { Logger } from "../shared/log.js";

/** Largest `/debug/explain` body read. */
const MAX_EXPLAIN_BODY = 4 * 1024 * 1024;

export interface AdminServerOptions {
  port: number;
  host: string;
  log: Logger;
  ready(): boolean;
  state(): unknown;
  metrics: { render(): Promise<string>; readonly contentType: string };
  explain(headers: Record<string, string>, body: Buffer): Promise<{ status: number; body: unknown }>;
}

export interface AdminServer {
  port: number;
  close(): void;
}

export async function startAdminServer(o: AdminServerOptions): Promise<AdminServer> {
  const server = http.createServer((req, res) => {
    const json = (code: number, body: unknown) => {
      res.writeHead(code, { "content-type": "application/json" });
      res.end(JSON.stringify(body));
    };
    if (req.url === "/healthz") return json(200, { status: "ok" });
    if (req.url === "/readyz") return json(o.ready() ? 200 : 503, { ready: o.ready() });
    if (req.url === "/debug/state") return json(200, o.state());
    if (req.url === "/metrics") {
      o.metrics.render().then(
        (text) => {
          res.writeHead(200, { "content-type": o.metrics.contentType });
          res.end(text);
        },
        (err: unknown) => {
          o.log.error({ err }, "metrics rendering failed");
          json(500, openAIError(500, "internal_error", "metrics failed"));
        },
      );
      return;
    }
    if (req.url === "/debug/explain" && req.method === "POST") {
      const chunks: Buffer[] = [];
      let size = 0;
      req.on("data", (c: Buffer) => {
        size += c.length;
        if (size <= MAX_EXPLAIN_BODY) chunks.push(c);
      });
      req.on("end", () => {
        if (size > MAX_EXPLAIN_BODY) return json(413, openAIError(413, "request_too_large", "request body exceeds 4 MiB"));
        const headers: Record<string, string> = {};
        for (const [k, v] of Object.entries(req.headers)) if (typeof v === "string") headers[k] = v;
        o.explain(headers, Buffer.concat(chunks)).then(
          (r) => json(r.status, r.body),
          (err: unknown) => {
            o.log.error({ err }, "explain failed");
            json(500, openAIError(500, "internal_error", "explain failed"));
          },
        );
      });
      return;
    }
    json(404, { error: { message: "not found", type: "invalid_request_error", code: 404, param: null } });
  });
  const port = await new Promise<number>((resolve, reject) => {
    server.once("error", reject);
    server.listen(o.port, o.host, () => {
      const a = server.address();
      resolve(typeof a === "object" && a ? a.port : 0);
    });
  });
  return { port, close: () => server.close() };
}
