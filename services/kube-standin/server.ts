/**
 * A Kubernetes API stand-in for tests and benchmarks: the HTTP shell around store.ts, speaking
 * the wire protocol real clients use (checked against `kubectl` and `@kubernetes/client-node`):
 * discovery (`/api`, `/apis`, resource lists), pods (namespaced and across namespaces) with the
 * `status` subresource, `coordination.k8s.io/v1` leases, custom resources served generically
 * (resources.ts: the Inference Extension's InferencePool, InferenceObjective, InferenceModelRewrite),
 * apps/v1 Deployments with the `scale` subresource and a ReplicaSet-like loop (deployments.ts); list with `labelSelector`, `limit` and
 * `continue`; watch as a chunked stream of JSON lines (ADDED/MODIFIED/DELETED, BOOKMARK when
 * `allowWatchBookmarks=true`, an ERROR Status 410 Expired for a resourceVersion older than the
 * history), ended after `timeoutSeconds`; create/replace/patch/delete with the API server's
 * conflict rules. Terminating pods are finalized after their grace period (the kubelet's part).
 *
 * No authentication or admission: it stands in for the API a watcher reads, nothing more.
 */
import http from "node:http";
import { writeFileSync } from "node:fs";
import type { AddressInfo, Socket } from "node:net";
import { matches, type Requirement } from "./selector.js";
import { discoveryDocuments, type Route, routeIndex, routeOf } from "./resources.js";
import { DeploymentController, type PodLifecycle, scaleOf } from "./deployments.js";
import { ApiError, type KubeObject, ObjectStore, parseSelectorOr400, type StoredEvent, type StoreOptions } from "./store.js";

export interface KubeStandinOptions extends StoreOptions {
  port?: number;
  host?: string;
  /** BOOKMARK interval on watches that ask for bookmarks. */
  bookmarkIntervalMs?: number;
  /** Longest watch (a client's `timeoutSeconds` can only shorten it). */
  maxWatchMs?: number;
  /** Grace period of a pod deleted without one (0 = gone at once). */
  defaultPodGraceMs?: number;
  /** The kubelet's part for pods the Deployments' loop creates and removes (deployments.ts). */
  lifecycle?: PodLifecycle;
}

const MAX_BODY = 4 * 1024 * 1024;

export interface PodStatusUpdate {
  ready?: boolean;
  podIP?: string | null;
  phase?: string;
}

export class KubeStandin {
  readonly store: ObjectStore;
  private server: http.Server;
  private readonly discovery: Record<string, unknown>;
  private readonly routes: ReturnType<typeof routeIndex>;
  private readonly watches = new Set<http.ServerResponse>();
  private readonly sockets = new Set<Socket>();
  private readonly finalizers = new Set<NodeJS.Timeout>();
  /** Counters for tests: requests by verb, watches opened, 410s sent. */
  readonly stats = { requests: 0, lists: 0, watches: 0, expired: 0, bookmarks: 0 };
  port = 0;

  /** The Deployments' ReplicaSet-like loop (deployments.ts). */
  readonly deployments: DeploymentController;

  constructor(private readonly o: KubeStandinOptions = {}) {
    this.store = new ObjectStore(o);
    this.deployments = new DeploymentController(this.store, { ...(o.lifecycle ? { lifecycle: o.lifecycle } : {}), deletePod: (ns, name, graceMs) => this.deletePod(ns, name, graceMs) });
    this.deployments.start();
    const defs = [...this.store.defs.values()];
    this.discovery = discoveryDocuments(defs);
    this.routes = routeIndex(defs);
    this.server = http.createServer((req, res) => {
      this.handle(req, res).catch((err: unknown) => this.fail(res, err));
    });
    this.server.on("connection", (s) => {
      this.sockets.add(s);
      s.on("close", () => this.sockets.delete(s));
    });
  }

  async start(): Promise<this> {
    await new Promise<void>((resolve) => this.server.listen(this.o.port ?? 0, this.o.host ?? "127.0.0.1", resolve));
    this.port = (this.server.address() as AddressInfo).port;
    return this;
  }

  get url(): string {
    return `http://127.0.0.1:${this.port}`;
  }

  /** Writes a kubeconfig pointing kubectl or client-node at this server. */
  writeKubeconfig(file: string, namespace = "default"): string {
    writeFileSync(
      file,
      [
        "apiVersion: v1",
        "kind: Config",
        "clusters:",
        "- name: standin",
        "  cluster:",
        `    server: ${this.url}`,
        // client-node 1.x refuses a plain-http server without it (there is no TLS to skip).
        "    insecure-skip-tls-verify: true",
        "users:",
        "- name: standin",
        "  user:",
        "    token: standin",
        "contexts:",
        "- name: standin",
        "  context:",
        "    cluster: standin",
        "    user: standin",
        `    namespace: ${namespace}`,
        "current-context: standin",
        "",
      ].join("\n"),
    );
    return file;
  }

  /** Watches that went half-open (`muteWatches`): nothing more is sent on them and the server never ends them. */
  private readonly muted = new Set<http.ServerResponse>();
  /** Resources whose list/watch requests are refused with 403 (`forbid`): RBAC taken away. */
  private readonly forbidden = new Set<string>();

  /**
   * Makes every open watch half-open: the connection stays up, but no event, BOOKMARK or
   * end-of-watch ever arrives on it (a network fault that left the client's side open).
   */
  muteWatches(): number {
    for (const res of this.watches) this.muted.add(res);
    return this.muted.size;
  }

  /** While true, every new watch is cut right after its response headers (a watch that fails as soon as it connects). */
  cutWatchesOnConnect = false;

  /** Refuses list and watch of `resource` with 403 Forbidden until `forbid(resource, false)`. */
  forbid(resource: string, on = true): void {
    if (on) this.forbidden.add(resource);
    else this.forbidden.delete(resource);
  }

  /** Drops every open watch connection mid-stream (a network cut, an API server restart). */
  cutWatches(): number {
    const n = this.watches.size;
    for (const res of this.watches) res.socket?.destroy();
    this.watches.clear();
    this.muted.clear();
    return n;
  }

  /** The kubelet's side: updates a pod's Ready condition, IP and phase through the status subresource. */
  setPodStatus(ns: string, name: string, u: PodStatusUpdate): KubeObject {
    const pod = this.store.get("pods", ns, name);
    const status = { ...(pod.status ?? {}) } as Record<string, unknown>;
    if (u.phase !== undefined) status.phase = u.phase;
    if (u.podIP === null) {
      delete status.podIP;
      delete status.podIPs;
    } else if (u.podIP !== undefined) {
      status.podIP = u.podIP;
      status.podIPs = [{ ip: u.podIP }];
    }
    if (u.ready !== undefined) {
      const conditions = ((status.conditions as Array<{ type: string }> | undefined) ?? []).filter((c) => c.type !== "Ready");
      conditions.push({ type: "Ready", status: u.ready ? "True" : "False", lastTransitionTime: new Date().toISOString().replace(/\.\d{3}Z$/, "Z") } as { type: string });
      status.conditions = conditions;
      if (u.ready && status.phase === "Pending") status.phase = "Running";
    }
    return this.store.patch("pods", ns, name, "application/merge-patch+json", { status: { ...status, conditions: status.conditions ?? null } }, "status");
  }

  /** DELETE of a pod, as the API does it: terminating for `graceMs`, then finalized (gone at once with 0). */
  deletePod(ns: string, name: string, graceMs: number): KubeObject {
    const out = this.store.delete("pods", ns, name, Date.now(), graceMs);
    if (out.metadata.deletionTimestamp) this.scheduleFinalize(ns, name, graceMs);
    return out;
  }

  async stop(): Promise<void> {
    this.deployments.stop();
    for (const t of this.finalizers) clearTimeout(t);
    this.cutWatches();
    for (const s of this.sockets) s.destroy();
    await new Promise<void>((r) => this.server.close(() => r()));
  }

  private fail(res: http.ServerResponse, err: unknown): void {
    const e = err instanceof ApiError ? err : new ApiError(500, "InternalError", (err as Error)?.message ?? "internal error");
    if (res.headersSent) {
      res.destroy();
      return;
    }
    const body = JSON.stringify(e.status());
    res.writeHead(e.code, { "content-type": "application/json", "content-length": Buffer.byteLength(body) });
    res.end(body);
  }

  private json(res: http.ServerResponse, code: number, value: unknown): void {
    const body = JSON.stringify(value);
    res.writeHead(code, { "content-type": "application/json", "content-length": Buffer.byteLength(body) });
    res.end(body);
  }

  private async body(req: http.IncomingMessage): Promise<unknown> {
    const chunks: Buffer[] = [];
    let size = 0;
    for await (const c of req) {
      size += (c as Buffer).length;
      if (size > MAX_BODY) throw new ApiError(413, "RequestEntityTooLarge", `request body larger than ${MAX_BODY} bytes`);
      chunks.push(c as Buffer);
    }
    const text = Buffer.concat(chunks).toString("utf8");
    if (text.trim() === "") return undefined;
    try {
      return JSON.parse(text);
    } catch {
      // kubectl sends JSON; YAML bodies are not part of the protocol the clients use.
      throw new ApiError(400, "BadRequest", "the request body is not JSON");
    }
  }

  private async handle(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    this.stats.requests++;
    const url = new URL(req.url ?? "/", "http://standin");
    const pathname = url.pathname.replace(/\/+$/, "") || "/";
    const method = req.method ?? "GET";
    if (method === "GET" && this.discovery[pathname]) return this.json(res, 200, this.discovery[pathname]);
    const r = routeOf(this.routes, pathname);
    if (!r) throw new ApiError(404, "NotFound", `the server could not find the requested resource (${pathname.slice(0, 200)})`);
    const q = url.searchParams;
    const now = Date.now();
    if (r.name === undefined) {
      if (method === "GET" && this.forbidden.has(r.resource)) throw new ApiError(403, "Forbidden", `${r.resource} is forbidden: User "standin" cannot list resource "${r.resource}"`);
      if (method === "GET") {
        const watch = q.get("watch");
        if (watch === "true" || watch === "1") return this.watch(req, res, r, q);
        return this.list(res, r, q);
      }
      if (method === "POST") {
        if (r.namespace === undefined) throw new ApiError(405, "MethodNotAllowed", "create needs a namespace");
        return this.json(res, 201, this.store.create(r.resource, r.namespace, await this.body(req), now));
      }
      throw new ApiError(405, "MethodNotAllowed", `${method} is not supported on a collection`);
    }
    if (r.namespace === undefined) throw new ApiError(404, "NotFound", "namespaced resource needs a namespace");
    if (r.subresource === "scale") return this.json(res, 200, await this.scale(req, method, r.resource, r.namespace, r.name));
    const sub = r.subresource;
    switch (method) {
      case "GET":
        return this.json(res, 200, this.store.get(r.resource, r.namespace, r.name));
      case "PUT":
        return this.json(res, 200, this.store.replace(r.resource, r.namespace, r.name, await this.body(req), sub));
      case "PATCH":
        return this.json(res, 200, this.store.patch(r.resource, r.namespace, r.name, req.headers["content-type"] ?? "", await this.body(req), sub));
      case "DELETE": {
        const opts = ((await this.body(req)) ?? {}) as { gracePeriodSeconds?: number };
        const q2 = q.get("gracePeriodSeconds");
        const graceS = q2 !== null ? Number(q2) : opts.gracePeriodSeconds;
        const graceMs = graceS !== undefined && Number.isFinite(graceS) ? Math.max(0, graceS) * 1_000 : (this.o.defaultPodGraceMs ?? 0);
        const out = this.store.delete(r.resource, r.namespace, r.name, now, graceMs);
        if (out.metadata.deletionTimestamp && r.resource === "pods") this.scheduleFinalize(r.namespace, r.name, graceMs);
        return this.json(res, 200, out);
      }
      default:
        throw new ApiError(405, "MethodNotAllowed", `${method} is not supported`);
    }
  }

  /**
   * `<deployment>/scale`: an autoscaling/v1 Scale view of `spec.replicas` (GET), and writes to it
   * (PUT with an optional resourceVersion precondition; merge or strategic-merge PATCH, as `kubectl
   * scale` sends) that change only the replica count.
   */
  private async scale(req: http.IncomingMessage, method: string, resource: string, ns: string, name: string): Promise<unknown> {
    const current = this.store.get(resource, ns, name);
    if (method === "GET") return scaleOf(current);
    if (method !== "PUT" && method !== "PATCH") throw new ApiError(405, "MethodNotAllowed", `${method} is not supported on scale`);
    const body = await this.body(req);
    let want: unknown;
    if (method === "PUT") {
      const b = body as { metadata?: { resourceVersion?: string }; spec?: { replicas?: unknown } } | undefined;
      const rv = b?.metadata?.resourceVersion;
      if (rv !== undefined && rv !== "" && rv !== current.metadata.resourceVersion) {
        throw new ApiError(409, "Conflict", `Operation cannot be fulfilled on deployments.apps "${name}": the object has been modified; please apply your changes to the latest version and try again`);
      }
      want = b?.spec?.replicas;
    } else {
      const ct = req.headers["content-type"] ?? "";
      if (!ct.startsWith("application/merge-patch+json") && !ct.startsWith("application/strategic-merge-patch+json")) {
        throw new ApiError(415, "UnsupportedMediaType", "scale accepts application/merge-patch+json and application/strategic-merge-patch+json");
      }
      want = (body as { spec?: { replicas?: unknown } } | undefined)?.spec?.replicas;
    }
    if (typeof want !== "number" || !Number.isInteger(want) || want < 0 || want > 100_000) {
      throw new ApiError(422, "Invalid", `Scale.autoscaling "${name}" is invalid: spec.replicas: Invalid value: ${JSON.stringify(want)}: must be a non-negative integer`);
    }
    return scaleOf(this.store.patch(resource, ns, name, "application/merge-patch+json", { spec: { replicas: want } }));
  }

  private scheduleFinalize(ns: string, name: string, graceMs: number): void {
    const t = setTimeout(() => {
      this.finalizers.delete(t);
      this.store.finalize(ns, name);
    }, graceMs);
    this.finalizers.add(t);
  }

  private list(res: http.ServerResponse, r: Route, q: URLSearchParams): void {
    this.stats.lists++;
    const all = this.store.list(r.resource, r.namespace, q.get("labelSelector") ?? undefined);
    const limit = Number(q.get("limit") ?? 0);
    let start = 0;
    let rv = all.resourceVersion;
    const token = q.get("continue");
    if (token) {
      let parsed: { rv?: string; start?: number };
      try {
        parsed = JSON.parse(Buffer.from(token, "base64url").toString("utf8"));
      } catch {
        throw new ApiError(400, "BadRequest", "invalid continue token");
      }
      if (this.store.eventsSince(Number(parsed.rv)) === "expired") throw new ApiError(410, "Expired", "The provided continue parameter is too old to display a consistent list result.");
      start = Number(parsed.start) || 0;
      rv = String(parsed.rv);
    }
    const items = limit > 0 ? all.items.slice(start, start + limit) : all.items.slice(start);
    const next = limit > 0 && start + limit < all.items.length ? Buffer.from(JSON.stringify({ rv, start: start + limit })).toString("base64url") : undefined;
    this.json(res, 200, { kind: this.store.def(r.resource).listKind, apiVersion: this.store.typeOf(r.resource).apiVersion, metadata: { resourceVersion: rv, ...(next ? { continue: next, remainingItemCount: all.items.length - start - limit } : {}) }, items });
  }

  private watch(req: http.IncomingMessage, res: http.ServerResponse, r: Route, q: URLSearchParams): void {
    this.stats.watches++;
    const selector: Requirement[] = parseSelectorOr400(q.get("labelSelector") ?? undefined);
    const rvParam = q.get("resourceVersion") ?? "";
    const bookmarks = q.get("allowWatchBookmarks") === "true";
    const timeoutS = Number(q.get("timeoutSeconds") ?? 0);
    const maxMs = this.o.maxWatchMs ?? 600_000;
    const durationMs = timeoutS > 0 ? Math.min(timeoutS * 1_000, maxMs) : maxMs;

    res.writeHead(200, { "content-type": "application/json", "transfer-encoding": "chunked", "cache-control": "no-cache" });
    res.flushHeaders();
    if (this.cutWatchesOnConnect) {
      res.socket?.destroy();
      return;
    }
    const send = (type: string, object: unknown) => {
      if (!this.muted.has(res)) res.write(`${JSON.stringify({ type, object })}\n`);
    };
    const inScope = (o: KubeObject) => r.namespace === undefined || o.metadata.namespace === r.namespace;
    const emit = (ev: StoredEvent) => {
      if (ev.resource !== r.resource || !inScope(ev.object)) return;
      const now = matches(selector, ev.object.metadata.labels);
      if (ev.type === "MODIFIED") {
        const before = ev.previous ? matches(selector, ev.previous.metadata.labels) : now;
        if (before && now) send("MODIFIED", ev.object);
        else if (!before && now) send("ADDED", ev.object);
        else if (before && !now) send("DELETED", ev.object);
      } else if (now) send(ev.type, ev.object);
    };

    if (rvParam === "" || rvParam === "0") {
      // "Any" resourceVersion: the current state as ADDED events, then changes.
      for (const o of this.store.list(r.resource, r.namespace, q.get("labelSelector") ?? undefined).items) send("ADDED", o);
    } else {
      const rv = Number(rvParam);
      const past = Number.isFinite(rv) ? this.store.eventsSince(rv) : "expired";
      if (past === "expired") {
        this.stats.expired++;
        send("ERROR", { kind: "Status", apiVersion: "v1", metadata: {}, status: "Failure", message: `too old resource version: ${rvParam.slice(0, 20)} (${this.store.resourceVersion})`, reason: "Expired", code: 410 });
        res.end();
        return;
      }
      for (const ev of past) emit(ev);
    }
    const off = this.store.onEvent(emit);
    this.watches.add(res);
    const bookmarkTimer = bookmarks
      ? setInterval(() => {
          this.stats.bookmarks++;
          send("BOOKMARK", { ...this.store.typeOf(r.resource), metadata: { resourceVersion: this.store.resourceVersion } });
        }, this.o.bookmarkIntervalMs ?? 5_000)
      : undefined;
    const end = setTimeout(() => {
      if (!this.muted.has(res)) res.end();
    }, durationMs);
    const cleanup = () => {
      this.muted.delete(res);
      off();
      clearTimeout(end);
      if (bookmarkTimer) clearInterval(bookmarkTimer);
      this.watches.delete(res);
    };
    res.on("close", cleanup);
    req.on("close", cleanup);
  }
}
