/**
 * A Kubernetes pod (as the API returns it) -> the pod state the watcher publishes. Pure.
 *
 * Labels and annotations (AIBrix's, see docs/kubernetes.md):
 *   model.aibrix.ai/name              model (required: pods without it are not inference pods)
 *   model.aibrix.ai/port              serving port (default 8000)
 *   model.aibrix.ai/engine            vllm | sglang (default vllm)
 *   model.aibrix.ai/metric-port       metrics port (default: the serving port)
 *   model.aibrix.ai/kv-events-enabled "true": KV events at tcp://<ip>:5557, replay tcp://<ip>:5558
 *   role-name, roleset-name           P/D role (prefill | decode) and roleset
 *   jetroute.io/pod-class             the pod's class for the latency model (else nvidia.com/gpu.product;
 *                                     a value that is no class name is left out, the pod is kept)
 *   jetroute.io/scheduling-policy     priority | priority-low-values-first: the engine schedules by
 *                                     request priority (docs/engine-priority.md); fcfs, absent or any
 *                                     other value: it does not (the pod is kept, gets no priority)
 *   model.aibrix.ai/sglang-bootstrap-port (annotation) SGLang prefill bootstrap port (default 8998)
 *   model.aibrix.ai/lora-adapters     (annotation) comma-separated LoRA adapters served
 *   model.aibrix.ai/config            (annotation) profiles JSON, passed on in `labels`
 * Routable = condition Ready is "True", `status.podIP` set, no `metadata.deletionTimestamp`.
 * A pod without an IP cannot be addressed and is not published at all.
 */
import type { EngineKind, PodRole, SchedulingPolicy } from "../../schemas/events.js";
import type { PodState } from "./reconcile.js";

export const LABEL_MODEL = "model.aibrix.ai/name";
export const LABEL_PORT = "model.aibrix.ai/port";
export const LABEL_ENGINE = "model.aibrix.ai/engine";
export const LABEL_METRIC_PORT = "model.aibrix.ai/metric-port";
export const LABEL_KV_EVENTS = "model.aibrix.ai/kv-events-enabled";
export const LABEL_ROLE = "role-name";
export const LABEL_ROLESET = "roleset-name";
export const LABEL_POD_CLASS = "jetroute.io/pod-class";
export const LABEL_GPU_PRODUCT = "nvidia.com/gpu.product";
export const LABEL_SCHEDULING_POLICY = "jetroute.io/scheduling-policy";
const POD_CLASS = /^[A-Za-z0-9._-]{1,63}$/;
export const ANNOTATION_BOOTSTRAP_PORT = "model.aibrix.ai/sglang-bootstrap-port";
export const ANNOTATION_ADAPTERS = "model.aibrix.ai/lora-adapters";
export const ANNOTATION_CONFIG = "model.aibrix.ai/config";
/** The drain handshake (docs/autoscaling.md): set by `jetroute autoscaler --apply` on a pod chosen to leave; epoch ms of its grace deadline. */
export const ANNOTATION_DRAIN_DEADLINE = "jetroute.io/drain-deadline";
export const KV_EVENTS_PORT = 5557;
export const KV_REPLAY_PORT = 5558;
export const SGLANG_BOOTSTRAP_PORT = 8998;
/** Profiles larger than this are not passed on (a pod annotation may hold 256 KiB). */
export const MAX_CONFIG_BYTES = 16 * 1024;
const MAX_ADAPTERS = 256;

/** The parts of a v1.Pod read here (plain JSON, as the API sends it). */
export interface KubePod {
  metadata?: {
    name?: string;
    namespace?: string;
    labels?: Record<string, string>;
    annotations?: Record<string, string>;
    deletionTimestamp?: string | Date;
  };
  status?: { podIP?: string; conditions?: Array<{ type?: string; status?: string }> };
}

export type PodMapping = { ok: true; state: PodState } | { ok: false; skip: "no-model" | "no-ip"; reason?: string } | { ok: false; skip: "invalid"; reason: string };

const NAME = /^[^\s]{1,253}$/;

function port(v: string | undefined, fallback: number, what: string): number | string {
  if (v === undefined || v === "") return fallback;
  if (!/^[0-9]{1,5}$/.test(v) || Number(v) < 1 || Number(v) > 65535) return `${what} ${JSON.stringify(v.slice(0, 40))} is not a port`;
  return Number(v);
}

/** Pod name as published: `<name>.<namespace>`, unique across namespaces. */
export const publishedPodName = (name: string, namespace: string | undefined): string => (namespace ? `${name}.${namespace}` : name);

export function routable(p: KubePod): boolean {
  return !p.metadata?.deletionTimestamp && !!p.status?.podIP && (p.status?.conditions ?? []).some((c) => c.type === "Ready" && c.status === "True");
}

/** The drain handshake's mark on a pod (the autoscaler's annotation): the deadline, none, or why it is invalid. */
export function drainingOf(annotations: Readonly<Record<string, string>>): { deadline: number } | undefined | string {
  const drain = annotations[ANNOTATION_DRAIN_DEADLINE];
  if (drain === undefined) return undefined;
  if (!/^[0-9]{1,15}$/.test(drain)) return `annotation ${ANNOTATION_DRAIN_DEADLINE} must be epoch milliseconds, got ${JSON.stringify(drain.slice(0, 40))}`;
  return { deadline: Number(drain) };
}

/** The pod's class from its labels (the first valid of jetroute.io/pod-class, nvidia.com/gpu.product), or nothing. */
function podClassOf(labels: Record<string, string>): { podClass?: string } {
  for (const k of [LABEL_POD_CLASS, LABEL_GPU_PRODUCT]) {
    const v = labels[k];
    if (v !== undefined && POD_CLASS.test(v)) return { podClass: v };
  }
  return {};
}

/** The engine's priority scheduling from its label; anything but the two priority values means none. */
function schedulingPolicyOf(labels: Record<string, string>): { schedulingPolicy?: SchedulingPolicy } {
  const v = labels[LABEL_SCHEDULING_POLICY];
  return v === "priority" || v === "priority-low-values-first" ? { schedulingPolicy: v } : {};
}

export function mapPod(p: KubePod): PodMapping {
  const labels = p.metadata?.labels ?? {};
  const annotations = p.metadata?.annotations ?? {};
  const model = labels[LABEL_MODEL];
  if (!model) return { ok: false, skip: "no-model" };
  const name = p.metadata?.name ?? "";
  const invalid = (reason: string): PodMapping => ({ ok: false, skip: "invalid", reason });
  if (!NAME.test(model)) return invalid(`label ${LABEL_MODEL} is not a valid model name`);
  const ip = p.status?.podIP;
  if (!ip) return { ok: false, skip: "no-ip" };
  const servePort = port(labels[LABEL_PORT], 8000, LABEL_PORT);
  if (typeof servePort === "string") return invalid(servePort);
  const metricPort = port(labels[LABEL_METRIC_PORT], servePort, LABEL_METRIC_PORT);
  if (typeof metricPort === "string") return invalid(metricPort);
  const engineLabel = labels[LABEL_ENGINE] ?? "vllm";
  if (engineLabel !== "vllm" && engineLabel !== "sglang") return invalid(`label ${LABEL_ENGINE} must be vllm or sglang, got ${JSON.stringify(engineLabel.slice(0, 40))}`);
  const engine: EngineKind = engineLabel;
  const roleLabel = labels[LABEL_ROLE];
  let role: PodRole = "combined";
  if (roleLabel === "prefill" || roleLabel === "decode") role = roleLabel;
  else if (roleLabel !== undefined && roleLabel !== "" && roleLabel !== "combined") return invalid(`label ${LABEL_ROLE} must be prefill or decode, got ${JSON.stringify(roleLabel.slice(0, 40))}`);
  // PODS addresses are host:port with no colon in the host: IPv6 pod IPs cannot be expressed yet.
  if (ip.includes(":")) return invalid(`pod IP ${ip.slice(0, 60)} is IPv6, which PODS addresses do not support`);
  const host = ip;
  const published = publishedPodName(name, p.metadata?.namespace);
  if (published.length > 253) return invalid(`pod name ${published.slice(0, 60)}... is longer than 253 characters with its namespace`);
  const state: PodState = {
    model,
    pod: published,
    address: `${host}:${servePort}`,
    ready: routable(p),
    engine,
    ...(role !== "combined" ? { role } : {}),
    ...(labels[LABEL_ROLESET] ? { roleset: labels[LABEL_ROLESET] } : {}),
    ...podClassOf(labels),
    ...schedulingPolicyOf(labels),
    ...(metricPort !== servePort ? { metricsAddress: `${host}:${metricPort}` } : {}),
  };
  if (engine === "sglang" && role === "prefill") {
    const bp = port(annotations[ANNOTATION_BOOTSTRAP_PORT], SGLANG_BOOTSTRAP_PORT, ANNOTATION_BOOTSTRAP_PORT);
    if (typeof bp === "string") return invalid(bp);
    state.bootstrapPort = bp;
  }
  if (labels[LABEL_KV_EVENTS] === "true") state.kvEvents = { endpoint: `tcp://${host}:${KV_EVENTS_PORT}`, replayEndpoint: `tcp://${host}:${KV_REPLAY_PORT}` };
  const adapters = (annotations[ANNOTATION_ADAPTERS] ?? "").split(",").map((a) => a.trim()).filter((a) => a.length > 0);
  if (adapters.length > MAX_ADAPTERS) return invalid(`annotation ${ANNOTATION_ADAPTERS} lists more than ${MAX_ADAPTERS} adapters`);
  if (adapters.some((a) => !NAME.test(a))) return invalid(`annotation ${ANNOTATION_ADAPTERS} holds an invalid adapter name`);
  if (adapters.length > 0) state.adapters = [...new Set(adapters)].sort();
  const drain = drainingOf(annotations);
  if (typeof drain === "string") return invalid(drain);
  if (drain) state.draining = drain;
  const config = annotations[ANNOTATION_CONFIG];
  if (config !== undefined) {
    if (Buffer.byteLength(config) > MAX_CONFIG_BYTES) return invalid(`annotation ${ANNOTATION_CONFIG} larger than ${MAX_CONFIG_BYTES} bytes`);
    state.labels = { [ANNOTATION_CONFIG]: config };
  }
  return { ok: true, state };
}
