/**
 * A simulated pod's HTTP plumbing: JSON bodies in and out, and a server that dispatches a route
 * table, answering unknown paths and methods as FastAPI does and failed handlers with vLLM's
 * error bodies.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { Logger } from "../shared/log.js";
import { ApiError, badRequest } from "./errors.js";

const MAX_BODY_BYTES = 32 * 1024 * 1024;

export type Handler = (req: IncomingMessage, res: ServerResponse) => Promise<void> | void;

/** Handlers by path, then by method. */
export type Routes = Record<string, Record<string, Handler>>;

export function sendJson(res: ServerResponse, status: number, body: unknown): void {
  res.writeHead(status, { "content-type": "application/json" }).end(JSON.stringify(body));
}

export async function readJson(req: IncomingMessage): Promise<unknown> {
  return (await readJsonText(req)).body;
}

/** The body parsed, and its text (SGLang's bootstrap_room needs digits a JSON number loses). */
export async function readJsonText(req: IncomingMessage): Promise<{ body: unknown; raw: string }> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req) {
    size += (chunk as Buffer).length;
    if (size > MAX_BODY_BYTES) throw new ApiError(413, "BadRequestError", `Request body exceeds ${MAX_BODY_BYTES} bytes`);
    chunks.push(chunk as Buffer);
  }
  const raw = Buffer.concat(chunks).toString("utf8");
  try {
    return { body: JSON.parse(raw), raw };
  } catch (err) {
    throw badRequest(`Invalid JSON body: ${(err as Error).message}`);
  }
}

function wildcardRoute(routes: Routes, path: string): Record<string, Handler> | undefined {
  for (const [key, route] of Object.entries(routes)) {
    if (key.endsWith("/*") && path.startsWith(key.slice(0, -1)) && path.length > key.length - 1) return route;
  }
  return undefined;
}

/** An HTTP server (not yet listening) that serves `routes`. */
export function routeServer(routes: Routes, log: Logger | undefined): Server {
  return createServer((req, res) => {
    const path = (req.url ?? "/").split("?")[0] ?? "/";
    // A `/prefix/*` key serves every path under the prefix (ids in the path: `/v1/responses/{id}`).
    const route = routes[path] ?? wildcardRoute(routes, path);
    // FastAPI's bodies for unknown routes and methods, which is what a vLLM client would see.
    if (!route) return sendJson(res, 404, { detail: "Not Found" });
    const handler = route[req.method ?? "GET"];
    if (!handler) return sendJson(res, 405, { detail: "Method Not Allowed" });
    Promise.resolve()
      .then(() => handler(req, res))
      .catch((err: unknown) => {
        if (res.destroyed) return;
        if (res.headersSent) {
          res.destroy();
          return;
        }
        if (err instanceof ApiError) return sendJson(res, err.status, err.body());
        log?.error({ err, path }, "simulated pod handler failed");
        sendJson(res, 500, new ApiError(500, "InternalServerError", String((err as Error)?.message ?? err)).body());
      });
  });
}

export function listen(server: Server, port: number, host: string): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(port, host, () => {
      server.off("error", reject);
      resolve();
    });
  });
}

/** Stops listening and drops open connections: clients get connection refused from then on. */
export function closeServer(server: Server): Promise<void> {
  return new Promise<void>((resolve) => {
    server.close(() => resolve());
    server.closeAllConnections();
  });
}
