/**
 * The stand-in's object store: what etcd plus the API server's registry do for pods, leases and
 * custom resources (resources.ts). Pure (no I/O, no timers; time from the caller).
 *
 * - One resourceVersion counter for everything, as etcd's revision; every write bumps it and
 *   stamps the object.
 * - A bounded event history (`historySize`): a watch from a resourceVersion older than the
 *   history is refused with 410 Gone, as the API server's watch cache does; `compact()` drops the
 *   history on purpose.
 * - Optimistic concurrency: an update whose `metadata.resourceVersion` is not the stored one is a
 *   409 Conflict; a create of an existing name is a 409 AlreadyExists.
 * - Pods follow the registry's rules a watcher depends on: status is reset on create and changes
 *   only through the `status` subresource; a delete with a grace period sets
 *   `deletionTimestamp` (terminating) and the pod disappears when `finalize` is called.
 * - Custom resources with a status subresource follow the CRD rules: `status` is dropped on
 *   create and left alone by writes to the object, and `metadata.generation` counts spec changes.
 */
import { jsonPatch, mergePatch, PatchError, stripDirectives } from "./patch.js";
import { apiVersionOf, DEFAULT_RESOURCES, type ResourceDef } from "./resources.js";
import { matches, parseSelector, type Requirement } from "./selector.js";

/** A resource's id (resources.ts): `pods`, `leases`, or `<plural>.<group>` for a custom resource. */
export type Resource = string;

export interface ObjectMeta {
  name: string;
  namespace?: string;
  uid?: string;
  resourceVersion?: string;
  creationTimestamp?: string;
  deletionTimestamp?: string;
  deletionGracePeriodSeconds?: number;
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
  generation?: number;
  [k: string]: unknown;
}

export interface KubeObject {
  apiVersion?: string;
  kind?: string;
  metadata: ObjectMeta;
  spec?: Record<string, unknown>;
  status?: Record<string, unknown>;
  [k: string]: unknown;
}

export type EventType = "ADDED" | "MODIFIED" | "DELETED";

export interface StoredEvent {
  rv: number;
  type: EventType;
  resource: Resource;
  object: KubeObject;
  /** The object before a MODIFIED (selector transitions turn into ADDED/DELETED for a watcher). */
  previous?: KubeObject;
}

export class ApiError extends Error {
  override name = "ApiError";
  constructor(
    readonly code: number,
    readonly reason: string,
    message: string,
    readonly details?: { name?: string; kind?: string },
  ) {
    super(message);
  }
  status(): Record<string, unknown> {
    return { kind: "Status", apiVersion: "v1", metadata: {}, status: "Failure", message: this.message, reason: this.reason, ...(this.details ? { details: this.details } : {}), code: this.code };
  }
}

export interface StoreOptions {
  /** The resources served (default resources.ts DEFAULT_RESOURCES: pods, leases, the Inference Extension's kinds). */
  resources?: readonly ResourceDef[];
  historySize?: number;
  /** Bound on stored objects per resource. */
  maxObjects?: number;
}

const NAME = /^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$/;

export class ObjectStore {
  private rv = 0;
  private readonly objects = new Map<Resource, Map<string, KubeObject>>();
  readonly defs: ReadonlyMap<Resource, ResourceDef>;
  private history: StoredEvent[] = [];
  /** Events with rv > this are all in `history`. */
  private compactedRv = 0;
  private readonly listeners = new Set<(ev: StoredEvent) => void>();
  private uidSeq = 0;
  private readonly historySize: number;
  private readonly maxObjects: number;

  constructor(o: StoreOptions = {}) {
    this.historySize = o.historySize ?? 10_000;
    this.maxObjects = o.maxObjects ?? 100_000;
    this.defs = new Map((o.resources ?? DEFAULT_RESOURCES).map((d) => [d.id, d]));
    for (const id of this.defs.keys()) this.objects.set(id, new Map());
  }

  /** The resource's definition (404 for one the store does not serve). */
  def(resource: Resource): ResourceDef {
    const d = this.defs.get(resource);
    if (!d) throw new ApiError(404, "NotFound", `the server could not find the requested resource (${resource.slice(0, 100)})`);
    return d;
  }

  /** `kind` and `apiVersion` of the resource's objects. */
  typeOf(resource: Resource): { kind: string; apiVersion: string } {
    const d = this.def(resource);
    return { kind: d.kind, apiVersion: apiVersionOf(d) };
  }

  private map(resource: Resource): Map<string, KubeObject> {
    this.def(resource);
    return this.objects.get(resource) as Map<string, KubeObject>;
  }

  get resourceVersion(): string {
    return String(this.rv);
  }

  onEvent(fn: (ev: StoredEvent) => void): () => void {
    this.listeners.add(fn);
    return () => this.listeners.delete(fn);
  }

  private record(type: EventType, resource: Resource, object: KubeObject, previous?: KubeObject): void {
    const ev: StoredEvent = { rv: this.rv, type, resource, object, ...(previous ? { previous } : {}) };
    this.history.push(ev);
    if (this.history.length > this.historySize) {
      const dropped = this.history.splice(0, this.history.length - this.historySize);
      this.compactedRv = (dropped[dropped.length - 1] as StoredEvent).rv;
    }
    for (const l of this.listeners) l(ev);
  }

  /** Forgets the event history: every watch from an older resourceVersion gets 410 Gone. */
  compact(): void {
    this.history = [];
    this.compactedRv = this.rv;
  }

  /** Events after `rv`, or "expired" when the history no longer reaches back that far. */
  eventsSince(rv: number): StoredEvent[] | "expired" {
    if (rv < this.compactedRv) return "expired";
    let lo = 0;
    let hi = this.history.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if ((this.history[mid] as StoredEvent).rv <= rv) lo = mid + 1;
      else hi = mid;
    }
    return this.history.slice(lo);
  }

  private key(ns: string, name: string): string {
    return `${ns}/${name}`;
  }

  get(resource: Resource, ns: string, name: string): KubeObject {
    const o = this.map(resource).get(this.key(ns, name));
    if (!o) throw new ApiError(404, "NotFound", `${resource} "${name}" not found`, { name, kind: resource });
    return structuredClone(o);
  }

  list(resource: Resource, ns: string | undefined, selector?: string): { items: KubeObject[]; resourceVersion: string } {
    const req = parseSelectorOr400(selector);
    const items: KubeObject[] = [];
    for (const o of this.map(resource).values()) {
      if (ns !== undefined && o.metadata.namespace !== ns) continue;
      if (!matches(req, o.metadata.labels)) continue;
      items.push(structuredClone(o));
    }
    items.sort((a, b) => (this.key(a.metadata.namespace ?? "", a.metadata.name) < this.key(b.metadata.namespace ?? "", b.metadata.name) ? -1 : 1));
    return { items, resourceVersion: this.resourceVersion };
  }

  create(resource: Resource, ns: string, body: unknown, now: number): KubeObject {
    const obj = this.validate(resource, body);
    const name = obj.metadata.name;
    if (obj.metadata.namespace !== undefined && obj.metadata.namespace !== ns) {
      throw new ApiError(400, "BadRequest", `the namespace of the object (${obj.metadata.namespace}) does not match the namespace on the request (${ns})`);
    }
    const map = this.map(resource);
    if (map.has(this.key(ns, name))) throw new ApiError(409, "AlreadyExists", `${resource} "${name}" already exists`, { name, kind: resource });
    if (map.size >= this.maxObjects) throw new ApiError(429, "TooManyRequests", `the stand-in holds at most ${this.maxObjects} ${resource}`);
    this.rv++;
    const def = this.def(resource);
    const stored: KubeObject = {
      ...obj,
      ...this.typeOf(resource),
      metadata: {
        ...obj.metadata,
        namespace: ns,
        uid: `00000000-0000-4000-8000-${(++this.uidSeq).toString(16).padStart(12, "0")}`,
        resourceVersion: String(this.rv),
        creationTimestamp: new Date(now).toISOString().replace(/\.\d{3}Z$/, "Z"),
        generation: 1,
      },
    };
    delete stored.metadata.deletionTimestamp;
    // The registry resets a new pod's status: the kubelet reports it later through pods/status.
    if (resource === "pods") stored.status = { phase: "Pending" };
    // A custom resource with a status subresource: status is written only through it.
    else if (def.statusSubresource) delete stored.status;
    map.set(this.key(ns, name), stored);
    this.record("ADDED", resource, structuredClone(stored));
    return structuredClone(stored);
  }

  /** PUT: the whole object; `metadata.resourceVersion`, when set, must match (409 Conflict). */
  replace(resource: Resource, ns: string, name: string, body: unknown, subresource?: "status"): KubeObject {
    const obj = this.validate(resource, body);
    if (obj.metadata.name !== name) throw new ApiError(400, "BadRequest", `the name of the object (${obj.metadata.name}) does not match the name on the URL (${name})`);
    const current = this.map(resource).get(this.key(ns, name));
    if (!current) throw new ApiError(404, "NotFound", `${resource} "${name}" not found`, { name, kind: resource });
    const want = obj.metadata.resourceVersion;
    if (want !== undefined && want !== "" && want !== current.metadata.resourceVersion) {
      throw new ApiError(409, "Conflict", `Operation cannot be fulfilled on ${resource} "${name}": the object has been modified; please apply your changes to the latest version and try again`, { name, kind: resource });
    }
    return this.commit(resource, current, obj, subresource);
  }

  patch(resource: Resource, ns: string, name: string, contentType: string, patch: unknown, subresource?: "status"): KubeObject {
    const current = this.map(resource).get(this.key(ns, name));
    if (!current) throw new ApiError(404, "NotFound", `${resource} "${name}" not found`, { name, kind: resource });
    let next: unknown;
    try {
      if (contentType.startsWith("application/json-patch+json")) next = jsonPatch(current, patch);
      else if (contentType.startsWith("application/merge-patch+json")) next = mergePatch(current, patch);
      else if (contentType.startsWith("application/strategic-merge-patch+json")) next = mergePatch(current, stripDirectives(patch));
      else throw new ApiError(415, "UnsupportedMediaType", `the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json`);
    } catch (err) {
      if (err instanceof PatchError) throw new ApiError(422, "Invalid", err.message);
      throw err;
    }
    const obj = this.validate(resource, next);
    const want = obj.metadata.resourceVersion;
    if (want !== undefined && want !== current.metadata.resourceVersion) {
      throw new ApiError(409, "Conflict", `Operation cannot be fulfilled on ${resource} "${name}": the object has been modified; please apply your changes to the latest version and try again`, { name, kind: resource });
    }
    return this.commit(resource, current, obj, subresource);
  }

  private commit(resource: Resource, current: KubeObject, obj: KubeObject, subresource?: "status"): KubeObject {
    let next: KubeObject;
    const def = this.def(resource);
    if (def.statusSubresource && subresource === "status") next = { ...structuredClone(current), status: structuredClone(obj.status ?? {}) };
    else if (def.statusSubresource) {
      next = { ...structuredClone(obj), ...this.typeOf(resource) };
      if (current.status !== undefined) next.status = structuredClone(current.status);
      else delete next.status;
    } else next = { ...structuredClone(obj), ...this.typeOf(resource) };
    // A custom resource's generation counts changes of everything but metadata and status.
    const specChanged = resource !== "pods" && def.group !== "coordination.k8s.io" && canonical({ ...next, metadata: 0, status: 0 }) !== canonical({ ...current, metadata: 0, status: 0 });
    // Fields only the server sets.
    next.metadata = {
      ...next.metadata,
      namespace: current.metadata.namespace,
      uid: current.metadata.uid,
      creationTimestamp: current.metadata.creationTimestamp,
      generation: (current.metadata.generation ?? 1) + (specChanged ? 1 : 0),
    };
    if (current.metadata.deletionTimestamp) {
      next.metadata.deletionTimestamp = current.metadata.deletionTimestamp;
      next.metadata.deletionGracePeriodSeconds = current.metadata.deletionGracePeriodSeconds;
    } else {
      delete next.metadata.deletionTimestamp;
      delete next.metadata.deletionGracePeriodSeconds;
    }
    next.metadata.resourceVersion = current.metadata.resourceVersion;
    // A write that changes nothing is not an event (and keeps its resourceVersion), as in the API server.
    if (JSON.stringify(next) === JSON.stringify(current)) return structuredClone(current);
    this.rv++;
    next.metadata.resourceVersion = String(this.rv);
    this.map(resource).set(this.key(current.metadata.namespace ?? "", current.metadata.name), next);
    this.record("MODIFIED", resource, structuredClone(next), structuredClone(current));
    return structuredClone(next);
  }

  /**
   * DELETE. Pods with `graceMs > 0` turn terminating (`deletionTimestamp`), to disappear on
   * `finalize`; everything else is gone at once.
   */
  delete(resource: Resource, ns: string, name: string, now: number, graceMs = 0): KubeObject {
    const current = this.map(resource).get(this.key(ns, name));
    if (!current) throw new ApiError(404, "NotFound", `${resource} "${name}" not found`, { name, kind: resource });
    if (resource === "pods" && graceMs > 0) {
      if (current.metadata.deletionTimestamp) return structuredClone(current);
      this.rv++;
      const next = structuredClone(current);
      next.metadata.deletionTimestamp = new Date(now + graceMs).toISOString().replace(/\.\d{3}Z$/, "Z");
      next.metadata.deletionGracePeriodSeconds = Math.ceil(graceMs / 1_000);
      next.metadata.resourceVersion = String(this.rv);
      this.map("pods").set(this.key(ns, name), next);
      this.record("MODIFIED", resource, structuredClone(next), structuredClone(current));
      return structuredClone(next);
    }
    return this.remove(resource, ns, name);
  }

  /** The kubelet finished a terminating pod: it is removed. */
  finalize(ns: string, name: string): void {
    if (this.map("pods").has(this.key(ns, name))) this.remove("pods", ns, name);
  }

  private remove(resource: Resource, ns: string, name: string): KubeObject {
    const current = this.map(resource).get(this.key(ns, name)) as KubeObject;
    this.map(resource).delete(this.key(ns, name));
    this.rv++;
    const gone = structuredClone(current);
    gone.metadata.resourceVersion = String(this.rv);
    this.record("DELETED", resource, structuredClone(gone));
    return gone;
  }

  private validate(resource: Resource, body: unknown): KubeObject {
    const o = body as KubeObject | null;
    if (typeof o !== "object" || o === null || Array.isArray(o)) throw new ApiError(400, "BadRequest", "the request body is not an object");
    if (typeof o.metadata?.name !== "string" || !NAME.test(o.metadata.name) || o.metadata.name.length > 253) {
      throw new ApiError(422, "Invalid", `${this.typeOf(resource).kind} "${String(o.metadata?.name ?? "")}" is invalid: metadata.name: Invalid value: a lowercase RFC 1123 subdomain is required`);
    }
    if (o.kind !== undefined && o.kind !== this.typeOf(resource).kind) throw new ApiError(400, "BadRequest", `kind ${JSON.stringify(o.kind)} posted to ${resource}`);
    for (const field of ["labels", "annotations"] as const) {
      const m = o.metadata[field];
      if (m === undefined) continue;
      if (typeof m !== "object" || m === null || Object.values(m).some((v) => typeof v !== "string")) {
        throw new ApiError(422, "Invalid", `metadata.${field}: values must be strings`);
      }
    }
    return o;
  }
}

/** JSON with object keys sorted: equal values, equal strings, whatever order the keys came in. */
function canonical(v: unknown): string {
  return JSON.stringify(v, (_k, x: unknown) => (x && typeof x === "object" && !Array.isArray(x) ? Object.fromEntries(Object.entries(x).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))) : x));
}

export function parseSelectorOr400(selector: string | undefined): Requirement[] {
  try {
    return parseSelector(selector);
  } catch (err) {
    throw new ApiError(400, "BadRequest", `unable to parse requirement: ${(err as Error).message}`);
  }
}
