/**
 * The gateway's admin HTTP port: `/healthz`, `/readyz`, `/debug/state`, `/debug/explain` (POST)
 * and Prometheus `/metrics`. Separate from the ext_proc port so probes and scrapes never queue
 * behind Envoy's streams.
 *
 * With `authorize` (the gateway passes it under `--auth required`) every `/debug/*` path needs an
 * admin API key: the state dump lists pods, users' in-flight charges and rate waits, and explain
 * runs the router on arbitrary input. `/healthz`, `/readyz` and `/metrics` stay open: kubelet
 * probes and Prometheus carry no bearer token, and they reveal nothing a client could use.
 */
import http from "node:http";
import { openAIError, ROUTED_PATHS } from "../routing/mod.js";
import type { Logger } from "../shared/log.js";
import { type ApiKeyView, authFailureMessage } from "./auth.js";

/** What `authorize` answers for one `authorization` header value. */
export type AdminAuthorization = { ok: true } | { ok: false; status: 401 | 403; reason: string };

/** Sent with a 401, as the ext_proc port does: tells a client which scheme to use. */
const AUTHENTICATE_CHALLENGE = { "www-authenticate": 'Bearer realm="jetroute-admin"' };

/**
 * The admin check on top of the folded API keys: the key must authenticate like any client key
 * (unknown, revoked, missing and malformed all read 401, with the ext_proc port's messages) and
 * its record must carry `admin: true` (else 403). Reads the live view, so `config revoke-key`
 * and `add-key --admin` take effect on the next request.
 */
export function adminAuthorizer(keys: Pick<ApiKeyView, "authenticate" | "get">): (authorization: string | undefined) => AdminAuthorization {
  return (authorization) => {
    const r = keys.authenticate(authorization);
    if (!r.ok) return { ok: false, status: 401, reason: authFailureMessage(r.reason) };
    if (keys.get(r.hash)?.admin !== true) return { ok: false, status: 403, reason: "This API key is not an admin key: /debug/* needs a key created with `jetroute config add-key --admin`." };
    return { ok: true };
  };
}

/** Largest `/debug/explain` body read. */
const MAX_EXPLAIN_BODY = 4 * 1024 * 1024;

export interface AdminServerOptions {
  port: number;
  host: string;
  log: Logger;
  ready(): boolean;
  state(): unknown;
  metrics: { render(): Promise<string>; readonly contentType: string };
  explain(headers: Record<string, string>, body: Buffer): Promise<{ status: number; body: unknown; headers?: Readonly<Record<string, string>> }>;
  /**
   * When given, `/debug/*` requires it to accept the request's `authorization` header (see
   * adminAuthorizer). Without it the admin port is open, as under `--auth off`: keep it on
   * loopback (`--admin-host`, default 127.0.0.1) or behind a NetworkPolicy.
   */
  authorize?(authorization: string | undefined): AdminAuthorization;
}

export interface AdminServer {
  port: number;
  close(): void;
}

export async function startAdminServer(o: AdminServerOptions): Promise<AdminServer> {
  const server = http.createServer((req, res) => {
    const json = (code: number, body: unknown, headers: Readonly<Record<string, string>> = {}) => {
      res.writeHead(code, { ...headers, "content-type": "application/json" });
      res.end(JSON.stringify(body));
    };
    if (req.url === "/healthz") return json(200, { status: "ok" });
    if (req.url === "/readyz") return json(o.ready() ? 200 : 503, { ready: o.ready() });
    // Every /debug path (unknown ones and query strings included), before any body is read: an
    // unauthorized client can neither tell which debug endpoints exist nor make us buffer 4 MiB.
    if (o.authorize && (req.url ?? "").startsWith("/debug")) {
      const a = o.authorize(req.headers.authorization);
      if (!a.ok) {
        const code = a.status === 401 ? "invalid_api_key" : "admin_key_required";
        res.writeHead(a.status, { "content-type": "application/json", ...(a.status === 401 ? AUTHENTICATE_CHALLENGE : {}) });
        // The reason only: the header itself is never echoed.
        res.end(JSON.stringify(openAIError(a.status, code, a.reason)));
        // Drain an unread request body so the connection can be reused.
        req.resume();
        return;
      }
    }
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
    const [urlPath, query] = (req.url ?? "").split("?", 2);
    if (urlPath === "/debug/explain" && req.method === "POST") {
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
        // `?path=/v1/responses` (or another routed path): the body is read as that API's (default chat).
        const path = new URLSearchParams(query ?? "").get("path");
        if (path !== null) {
          if (!(ROUTED_PATHS as readonly string[]).includes(path)) return json(400, openAIError(400, "invalid_request_body", `path must be one of ${ROUTED_PATHS.join(", ")}`, "path"));
          headers[":path"] = path;
        }
        o.explain(headers, Buffer.concat(chunks)).then(
          (r) => json(r.status, r.body, r.headers),
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
