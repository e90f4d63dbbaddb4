/**
 * Flow control's settings for a model, resolved from its config (`flowControl`, schemas/config.ts)
 * with the documented defaults, and the classification of one request: its band (priority), its
 * flow (fairness key), when it expires and its EDF deadline. Pure.
 */
import type { FlowControl } from "../../../schemas/config.js";
import { urgencyOf } from "../engine-priority.js";
import { RouteError } from "../errors.js";

/** Header naming the request's objective (a name in the model's `flowControl.objectives`). */
export const OBJECTIVE_HEADER = "x-jetroute-objective";
/** Header naming the request's flow (its fairness key); default the user. */
export const FAIRNESS_HEADER = "x-jetroute-fairness-id";
/** Header with a relative deadline in ms: EDF orders by it and the request expires at it. */
export const DEADLINE_HEADER = "x-jetroute-deadline-ms";
export const MAX_FAIRNESS_ID_LENGTH = 256;
/**
 * The objective and fairness headers of the endpoint picker ecosystem (llm-d's router, and the
 * Inference Extension's older names), honoured when jetroute's own are absent. An objective named
 * this way that the model does not define is ignored (the default applies), as those pickers do.
 */
export const PICKER_OBJECTIVE_HEADERS = ["x-llm-d-inference-objective", "x-gateway-inference-objective"] as const;
export const PICKER_FAIRNESS_HEADERS = ["x-llm-d-inference-fairness-id", "x-gateway-inference-fairness-id"] as const;
/** The flow of requests with neither a fairness id nor a user. */
export const ANONYMOUS_FLOW = "\u0000anonymous";

export interface SaturationSettings {
  /** Waiting requests at which a pod is full. */
  readonly queueDepth: number;
  /** KV cache usage (0-1) at which a pod is full. */
  readonly kvCacheUsage: number;
  readonly maxInFlightPerPod?: number;
  readonly maxTokensPerPod?: number;
  /**
   * Per-band admission (issue 36), absent when off: on a pod whose engine schedules by priority,
   * a request of band b is admitted while the waiting requests are fewer than
   * `queueDepth + depth x (bands below b)`, `bands` being the bands in play (the model's
   * objectives' and 0), sorted.
   */
  /** `bands`: the bands in play, lowest first; `urgencies`: each one's engine urgency, in the same order. */
  readonly perBand?: { readonly depth: number; readonly bands: readonly number[]; readonly urgencies: readonly number[] };
}

export interface FlowSettings {
  readonly objectives: Readonly<Record<string, { readonly priority: number; readonly ttlMs?: number }>>;
  readonly defaultObjective?: string;
  readonly fairness: "round-robin" | "least-attained";
  readonly order: "fcfs" | "edf";
  readonly ttlMs: number;
  readonly waitingRoomTtlMs: number;
  readonly maxRequestsPerBand: number;
  readonly maxBytesPerBand: number;
  readonly maxRequestsPerUser: number;
  readonly maxBytesPerUser: number;
  readonly saturation: SaturationSettings;
}

/**
 * Defaults: the peers' (llm-d's flow control: 60 s TTL, 5,000 requests per band, queue depth 5, KV
 * 0.8), except the byte bounds, which count what a held request retains (held-bytes.ts) and are
 * sized to the deployed heap (docs/flow-control.md "Memory"): 256 MiB per band and 64 MiB per user
 * in a band, under the replica's total (`--flow-max-held-bytes`, 384 MiB).
 */
export const FLOW_DEFAULTS = {
  fairness: "round-robin",
  order: "fcfs",
  ttlMs: 60_000,
  waitingRoomTtlMs: 0,
  maxRequestsPerBand: 5_000,
  maxBytesPerBand: 256 * 1024 * 1024,
  maxRequestsPerUser: 1_000,
  maxBytesPerUser: 64 * 1024 * 1024,
  queueDepth: 5,
  kvCacheUsage: 0.8,
} as const;

/** The model's settings, or undefined when flow control is off for it (no `flowControl`, or `enabled: false`). */
export function flowSettingsOf(c: FlowControl | undefined): FlowSettings | undefined {
  if (!c || c.enabled === false) return undefined;
  const s = c.saturation ?? {};
  return {
    objectives: c.objectives ?? {},
    ...(c.defaultObjective !== undefined ? { defaultObjective: c.defaultObjective } : {}),
    fairness: c.fairness ?? FLOW_DEFAULTS.fairness,
    order: c.order ?? FLOW_DEFAULTS.order,
    ttlMs: c.ttlMs ?? FLOW_DEFAULTS.ttlMs,
    waitingRoomTtlMs: c.waitingRoomTtlMs ?? FLOW_DEFAULTS.waitingRoomTtlMs,
    maxRequestsPerBand: c.maxRequestsPerBand ?? FLOW_DEFAULTS.maxRequestsPerBand,
    maxBytesPerBand: c.maxBytesPerBand ?? FLOW_DEFAULTS.maxBytesPerBand,
    maxRequestsPerUser: c.maxRequestsPerUser ?? FLOW_DEFAULTS.maxRequestsPerUser,
    maxBytesPerUser: c.maxBytesPerUser ?? FLOW_DEFAULTS.maxBytesPerUser,
    saturation: {
      queueDepth: s.queueDepth ?? FLOW_DEFAULTS.queueDepth,
      kvCacheUsage: s.kvCacheUsage ?? FLOW_DEFAULTS.kvCacheUsage,
      ...(s.maxInFlightPerPod !== undefined ? { maxInFlightPerPod: s.maxInFlightPerPod } : {}),
      ...(s.maxTokensPerPod !== undefined ? { maxTokensPerPod: s.maxTokensPerPod } : {}),
      ...perBandOf(c, s.queueDepthPerBand ?? s.queueDepth ?? FLOW_DEFAULTS.queueDepth),
    },
  };
}

/**
 * Per-band admission's settings: off when the model's engine priority is "off" (the engines then
 * get no priority and run first come, first served) or the depth per band is 0.
 */
function perBandOf(c: FlowControl, depth: number): Pick<SaturationSettings, "perBand"> {
  if (c.enginePriority === "off" || !(depth > 0)) return {};
  const bands = new Set<number>([0]);
  for (const o of Object.values(c.objectives ?? {})) if (Number.isInteger(o.priority)) bands.add(o.priority);
  const sorted = [...bands].sort((a, b) => a - b);
  // A mapping may give two bands the same urgency: the engine then runs them in arrival order.
  return { perBand: { depth, bands: sorted, urgencies: sorted.map((b) => urgencyOf(b, c.enginePriority) as number) } };
}

/**
 * A request's flow: its user; with a fairness id, that id within its user (`user\0id`), so a
 * client cannot escape its user's attained service (least-attained reads the user's usage) by
 * naming flows; without either, the anonymous flow.
 */
export function flowKeyOf(user: string | undefined, fairnessId: string | undefined): string {
  if (fairnessId) return `${user ?? ""}\u0000${fairnessId}`;
  return user || ANONYMOUS_FLOW;
}

/** The user a flow key belongs to (the part before the first NUL; "" for anonymous requests, whatever fairness id they name). */
export function userOfFlow(flow: string): string {
  const i = flow.indexOf("\u0000");
  return i < 0 ? flow : flow.slice(0, i);
}

/** Where a request goes in the queues. */
export interface FlowClass {
  readonly band: number;
  readonly objective?: string;
  readonly flow: string;
  readonly enqueuedAt: number;
  /** TTL expiry (the earlier of the objective's TTL and the request's own deadline). */
  readonly expiresAt: number;
  /** EDF's order key: the request's deadline, else its TTL expiry. */
  readonly deadline: number;
}

/**
 * Classifies a request. `keyObjective` is the API key's objective, a **ceiling**: on a model that
 * defines it, the request runs under it unless it names (by header) a defined objective of a lower
 * priority; on a model that does not define it, the ceiling is the model's default objective (band
 * 0 when it has none), so a pinned key never picks freely. A named objective above the ceiling runs
 * at the ceiling (its objective and TTL), never higher. Without a key objective the header's (or
 * the default) applies. `user` is the request's user. Throws a 400 for an objective the model does
 * not define or a malformed header.
 */
export function classify(s: FlowSettings, headers: Readonly<Record<string, string>>, keyObjective: string | undefined, user: string | undefined, now: number): FlowClass {
  const picker = PICKER_OBJECTIVE_HEADERS.map((h) => headers[h]).find((v) => v !== undefined && Object.hasOwn(s.objectives, v));
  const named = headers[OBJECTIVE_HEADER] || picker || undefined;
  if (named !== undefined && !Object.hasOwn(s.objectives, named)) {
    const known = Object.keys(s.objectives).slice(0, 16).join(", ");
    throw new RouteError("invalidHeader", `objective ${JSON.stringify(named.slice(0, 64))} is not defined for this model${known ? `; defined: ${known}` : ""}`, OBJECTIVE_HEADER);
  }
  const defined = (o: string | undefined) => (o !== undefined && Object.hasOwn(s.objectives, o) ? o : undefined);
  const priorityOf = (o: string | undefined) => (o === undefined ? 0 : (s.objectives[o]?.priority ?? 0));
  let objective: string | undefined;
  if (keyObjective === undefined) {
    objective = named ?? defined(s.defaultObjective);
  } else {
    const ceiling = defined(keyObjective) ?? defined(s.defaultObjective);
    const wanted = named ?? ceiling;
    objective = priorityOf(wanted) <= priorityOf(ceiling) ? wanted : ceiling;
  }
  const o = objective !== undefined ? s.objectives[objective] : undefined;
  const priority = o?.priority ?? 0;
  const ttlMs = o?.ttlMs ?? s.ttlMs;
  const fairness = headers[FAIRNESS_HEADER] ?? PICKER_FAIRNESS_HEADERS.map((h) => headers[h]).find((v) => v !== undefined);
  if (fairness !== undefined && fairness.length > MAX_FAIRNESS_ID_LENGTH) {
    throw new RouteError("invalidHeader", `${FAIRNESS_HEADER} is longer than ${MAX_FAIRNESS_ID_LENGTH} characters`, FAIRNESS_HEADER);
  }
  const flow = flowKeyOf(user, fairness);
  let expiresAt = now + ttlMs;
  let deadline = expiresAt;
  const d = headers[DEADLINE_HEADER];
  if (d !== undefined && d !== "") {
    const ms = /^\d{1,9}$/.test(d) ? Number(d) : Number.NaN;
    if (!Number.isSafeInteger(ms)) throw new RouteError("invalidHeader", `${DEADLINE_HEADER} must be a whole number of milliseconds (0-999999999)`, DEADLINE_HEADER);
    deadline = now + ms;
    expiresAt = Math.min(expiresAt, deadline);
  }
  return { band: priority, ...(objective !== undefined ? { objective } : {}), flow, enqueuedAt: now, expiresAt, deadline };
}
