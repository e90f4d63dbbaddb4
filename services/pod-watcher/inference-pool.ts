/**
 * An InferencePool (`inference.networking.k8s.io/v1`, the Gateway API Inference Extension's GA
 * API; docs/inference-pool.md) and the pods its selector matches -> the endpoints the watcher
 * publishes. Pure: no I/O; the models an endpoint serves come from a pod label or from what its
 * engine's `/v1/models` answered (fetched by the shell, passed in).
 *
 * - The pool: `spec.selector.matchLabels` (v1 selectors are equality only), `spec.targetPorts`
 *   (1-8 distinct port numbers), `spec.appProtocol` (`http` or `kubernetes.io/h2c`),
 *   `spec.endpointPickerRef` (read for the record; the gateway, not the watcher, calls the picker).
 * - Every `podIP:targetPort` of a matching pod is one endpoint: a pod with several ports runs
 *   several engine ranks, each published as its own pod `<pod>-rank-<i>.<namespace>` (one port:
 *   `<pod>.<namespace>`, as in `--kubernetes` mode).
 * - A pool the API server would have refused (more than 8 ports, duplicate ports, an empty
 *   selector) publishes nothing and says why; a selector whose unlabelled pods serve different
 *   base models is reported, and each endpoint still published under the model it serves.
 */
import type { EngineKind } from "../../schemas/events.js";
import { drainingOf, LABEL_ENGINE, publishedPodName, routable, type KubePod } from "./k8s-pods.js";
import { podKey, type PodState } from "./reconcile.js";

export const INFERENCE_POOL_API_VERSION = "inference.networking.k8s.io/v1";
export const MAX_TARGET_PORTS = 8;
const APP_PROTOCOLS = ["http", "kubernetes.io/h2c"] as const;

export interface InferencePoolSpec {
  selector: Readonly<Record<string, string>>;
  ports: readonly number[];
  appProtocol: (typeof APP_PROTOCOLS)[number];
  picker?: { name: string; port?: number; failureMode: "FailOpen" | "FailClose" };
}

/** Why a pool publishes nothing: the metric label (bounded) and the log line. */
export type PoolProblem = "too-many-ports" | "duplicate-ports" | "empty-selector" | "invalid";
export type ParsedPool = { ok: true; spec: InferencePoolSpec } | { ok: false; problem: PoolProblem; reason: string };

/** The parts of an InferencePool read here (plain JSON, as the API sends it). */
export interface KubeInferencePool {
  apiVersion?: string;
  metadata?: { name?: string; namespace?: string };
  spec?: {
    selector?: { matchLabels?: Record<string, unknown>; matchExpressions?: unknown };
    targetPorts?: Array<{ number?: unknown }>;
    appProtocol?: unknown;
    endpointPickerRef?: { name?: unknown; port?: { number?: unknown }; failureMode?: unknown };
  };
}

const isPort = (n: unknown): n is number => typeof n === "number" && Number.isInteger(n) && n >= 1 && n <= 65535;

/** Validates an InferencePool as the v1 CRD's schema does (and a little more: an empty selector). */
export function parseInferencePool(p: KubeInferencePool): ParsedPool {
  const bad = (problem: PoolProblem, reason: string): ParsedPool => ({ ok: false, problem, reason });
  const s = p.spec;
  if (!s || typeof s !== "object") return bad("invalid", "spec missing");
  const labels = s.selector?.matchLabels;
  if (labels !== undefined && (typeof labels !== "object" || labels === null || Object.values(labels).some((v) => typeof v !== "string"))) {
    return bad("invalid", "spec.selector.matchLabels must map label keys to strings");
  }
  if (s.selector?.matchExpressions !== undefined) return bad("invalid", "spec.selector.matchExpressions is not part of the v1 InferencePool selector (matchLabels only)");
  if (!labels || Object.keys(labels).length === 0) return bad("empty-selector", "spec.selector.matchLabels is empty: it would select every pod of the namespace");
  const ports = (s.targetPorts ?? []).map((t) => t?.number);
  if (ports.length === 0) return bad("invalid", "spec.targetPorts is empty (1 to 8 ports)");
  if (ports.length > MAX_TARGET_PORTS) return bad("too-many-ports", `spec.targetPorts has ${ports.length} ports; at most ${MAX_TARGET_PORTS}`);
  if (!ports.every(isPort)) return bad("invalid", "spec.targetPorts[].number must be a port (1-65535)");
  if (new Set(ports).size !== ports.length) return bad("duplicate-ports", `spec.targetPorts repeats a port (${ports.join(", ")})`);
  const appProtocol = s.appProtocol ?? "http";
  if (!(APP_PROTOCOLS as readonly unknown[]).includes(appProtocol)) return bad("invalid", `spec.appProtocol must be http or kubernetes.io/h2c, got ${JSON.stringify(String(appProtocol).slice(0, 40))}`);
  const spec: InferencePoolSpec = { selector: labels as Record<string, string>, ports: ports as number[], appProtocol: appProtocol as InferencePoolSpec["appProtocol"] };
  const ref = s.endpointPickerRef;
  if (ref) {
    const mode = ref.failureMode ?? "FailClose";
    if (mode !== "FailOpen" && mode !== "FailClose") return bad("invalid", `spec.endpointPickerRef.failureMode must be FailOpen or FailClose, got ${JSON.stringify(String(mode).slice(0, 40))}`);
    if (typeof ref.name !== "string" || ref.name === "") return bad("invalid", "spec.endpointPickerRef.name is required");
    spec.picker = { name: ref.name, failureMode: mode, ...(isPort(ref.port?.number) ? { port: ref.port.number } : {}) };
  }
  return { ok: true, spec };
}

/** Whether a pod's labels satisfy the pool's (equality-only) selector. */
export function selects(selector: Readonly<Record<string, string>>, labels: Readonly<Record<string, string>> | undefined): boolean {
  for (const [k, v] of Object.entries(selector)) if (labels?.[k] !== v) return false;
  return true;
}

/** What an engine's `/v1/models` said: the base model and the LoRA adapters loaded on it. */
export interface ServedModels {
  model: string;
  adapters: string[];
}

const NAME = /^\S{1,253}$/;
const MAX_ADAPTERS = 256;

/**
 * An OpenAI `/v1/models` answer -> base model and adapters. vLLM lists a loaded LoRA adapter with
 * `parent` set to its base model; the base model is the entry without a parent (the first, when
 * an engine lists several). Undefined when the answer names no usable model.
 */
export function servedModelsOf(body: unknown): ServedModels | undefined {
  const data = (body as { data?: unknown } | null)?.data;
  if (!Array.isArray(data)) return undefined;
  let model: string | undefined;
  const adapters: string[] = [];
  for (const e of data.slice(0, 1_000)) {
    const id = (e as { id?: unknown })?.id;
    if (typeof id !== "string" || !NAME.test(id)) continue;
    const parent = (e as { parent?: unknown }).parent;
    if (typeof parent === "string" && parent !== "") {
      if (adapters.length < MAX_ADAPTERS) adapters.push(id);
    } else model ??= id;
  }
  return model === undefined ? undefined : { model, adapters: [...new Set(adapters)].sort() };
}

/**
 * What an endpoint may be published as, given the operator's list of the pool's models
 * (`--inference-pool-models`): an engine names its own model in `/v1/models`, so without a list one pod could
 * claim another model's name and take its traffic. A base model not in the list refuses the
 * endpoint; adapters not in it are dropped (an adapter named like another pool's model would take
 * its traffic the same way). Labels (`--model-label`) are checked the same way when a list is given.
 * Without a list, everything stands (the caller allows that only when the engines are not asked).
 */
export function admitServed(served: ServedModels, allowed: ReadonlySet<string> | undefined): { served: ServedModels; droppedAdapters: number } | { refused: string } {
  if (!allowed) return { served, droppedAdapters: 0 };
  if (!allowed.has(served.model)) return { refused: `serves ${JSON.stringify(served.model.slice(0, 256))}, which is not one of the pool's models (--inference-pool-models)` };
  const adapters = served.adapters.filter((a) => allowed.has(a));
  return { served: adapters.length === served.adapters.length ? served : { model: served.model, adapters }, droppedAdapters: served.adapters.length - adapters.length };
}

/**
 * `--inference-pool-models` checked at start: the set of the pool's models, or undefined when the pool's
 * pods are named by `--model-label` alone. Without either, an engine would name its own model
 * (one pod could take another model's traffic): a RangeError naming both flags.
 */
export function checkPoolModels(list: readonly string[] | undefined, modelLabel: string | undefined): ReadonlySet<string> | undefined {
  const models = (list ?? []).map((m) => m.trim()).filter((m) => m !== "");
  for (const m of models) if (!/^\S{1,253}$/.test(m)) throw new RangeError(`--inference-pool-models: ${JSON.stringify(m.slice(0, 80))} is not a model name`);
  if (models.length === 0 && modelLabel === undefined) throw new RangeError("--inference-pool needs --inference-pool-models <models> (the models the pool serves: what its engines' /v1/models answers may name) or --model-label <key>");
  return models.length > 0 ? new Set(models) : undefined;
}

export interface PoolEndpointsInput {
  namespace: string;
  spec: InferencePoolSpec;
  pods: Iterable<KubePod>;
  /** The label naming an endpoint's model; absent (or absent on a pod) = ask the engine. */
  modelLabel?: string;
  /**
   * The pool's models (`--inference-pool-models`): what an endpoint's label or engine may name (admitServed).
   * Absent: engines are not asked at all, and pods without the model label are skipped.
   */
  allowedModels?: ReadonlySet<string>;
  /** What each endpoint's `/v1/models` answered, by `ip:port`. */
  discovered: ReadonlyMap<string, ServedModels>;
}

export interface PoolEndpoints {
  desired: Map<string, PodState>;
  /** Endpoints of selected pods: `ip:port` whose models are not known yet. */
  undiscovered: string[];
  /** Every endpoint whose models come from its engine (known or not): the shell asks and refreshes these. */
  asked: string[];
  /** Selected pods without an IP yet. */
  noIp: number;
  /** Selected pods skipped: `namespace/name` and why. */
  invalid: { id: string; reason: string }[];
  /** Base models served by unlabelled endpoints, when there are two or more (a selector spanning models). */
  mixedModels: string[];
  /** Adapters an engine listed that are not among the pool's models: dropped. */
  droppedAdapters: number;
  /** Pods refused because their label or engine named a model not among the pool's (also in `invalid`). */
  refusedModels: number;
}

/** The pool's endpoints: one pod state per `podIP:targetPort` of every selected pod. */
export function poolEndpoints(i: PoolEndpointsInput): PoolEndpoints {
  const out: PoolEndpoints = { desired: new Map(), undiscovered: [], asked: [], noIp: 0, invalid: [], mixedModels: [], droppedAdapters: 0, refusedModels: 0 };
  const unlabelledModels = new Set<string>();
  const multi = i.spec.ports.length > 1;
  for (const p of i.pods) {
    const labels = p.metadata?.labels ?? {};
    if (p.metadata?.namespace !== undefined && p.metadata.namespace !== i.namespace) continue;
    if (!selects(i.spec.selector, labels)) continue;
    const id = `${p.metadata?.namespace ?? i.namespace}/${p.metadata?.name ?? ""}`;
    const ip = p.status?.podIP;
    if (!ip) {
      out.noIp++;
      continue;
    }
    if (ip.includes(":")) {
      out.invalid.push({ id, reason: `pod IP ${ip.slice(0, 60)} is IPv6, which PODS addresses do not support` });
      continue;
    }
    const engineLabel = labels[LABEL_ENGINE] ?? "vllm";
    if (engineLabel !== "vllm" && engineLabel !== "sglang") {
      out.invalid.push({ id, reason: `label ${LABEL_ENGINE} must be vllm or sglang, got ${JSON.stringify(engineLabel.slice(0, 40))}` });
      continue;
    }
    const drain = drainingOf(p.metadata?.annotations ?? {});
    if (typeof drain === "string") {
      out.invalid.push({ id, reason: drain });
      continue;
    }
    const labelled = i.modelLabel !== undefined ? labels[i.modelLabel] : undefined;
    if (labelled !== undefined && !NAME.test(labelled)) {
      out.invalid.push({ id, reason: `label ${i.modelLabel} is not a valid model name` });
      continue;
    }
    // An engine names its own model: asked only when the operator listed the pool's models.
    if (labelled === undefined && !i.allowedModels) {
      out.invalid.push({ id, reason: `no ${i.modelLabel ?? "model"} label, and its engine is not asked without --inference-pool-models` });
      continue;
    }
    let refused: string | undefined;
    i.spec.ports.forEach((port, rank) => {
      const address = `${ip}:${port}`;
      if (labelled === undefined) out.asked.push(address);
      const claimed = labelled !== undefined ? { model: labelled, adapters: [] } : i.discovered.get(address);
      if (!claimed) {
        out.undiscovered.push(address);
        return;
      }
      const admitted = admitServed(claimed, i.allowedModels);
      if ("refused" in admitted) {
        refused ??= `${labelled !== undefined ? `label ${i.modelLabel}` : `engine at ${address}`} ${admitted.refused}`;
        return;
      }
      out.droppedAdapters += admitted.droppedAdapters;
      const served = admitted.served;
      if (labelled === undefined) unlabelledModels.add(served.model);
      const base = p.metadata?.name ?? "";
      const pod = publishedPodName(multi ? `${base}-rank-${rank}` : base, p.metadata?.namespace ?? i.namespace);
      const state: PodState = {
        model: served.model, pod, address, ready: routable(p), engine: engineLabel as EngineKind,
        ...(served.adapters.length > 0 ? { adapters: served.adapters } : {}),
        ...(drain ? { draining: drain } : {}),
      };
      out.desired.set(podKey(state.model, state.pod), state);
    });
    if (refused) {
      out.invalid.push({ id, reason: refused });
      out.refusedModels++;
    }
  }
  if (unlabelledModels.size > 1) out.mixedModels = [...unlabelledModels].sort().slice(0, 16);
  return out;
}
