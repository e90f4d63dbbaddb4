/**
 * The static pod list (YAML or JSON) used where there is no Kubernetes API: the local demo,
 * tests, bare-metal fleets. Validated once with a message naming the bad entry.
 */
import { readFileSync } from "node:fs";
import { type Static, Type } from "@sinclair/typebox";
import { TypeCompiler } from "@sinclair/typebox/compiler";
import { parse as parseYaml } from "yaml";
import { KvEventsEndpoint, EngineKind, PodClass, PodRole, SchedulingPolicy } from "../../schemas/events.js";

export const StaticPod = Type.Object(
  {
    name: Type.String({ minLength: 1 }),
    model: Type.String({ minLength: 1 }),
    address: Type.String({ pattern: "^[^\\s:]+:[0-9]{1,5}$" }),
    engine: Type.Optional(EngineKind),
    role: Type.Optional(PodRole),
    roleset: Type.Optional(Type.String({ minLength: 1 })),
    podClass: Type.Optional(PodClass),
    /** `priority` / `priority-low-values-first` when the engine schedules by request priority (docs/engine-priority.md); `fcfs` = absent. */
    schedulingPolicy: Type.Optional(Type.Union([Type.Literal("fcfs"), SchedulingPolicy])),
    bootstrapPort: Type.Optional(Type.Integer({ minimum: 1, maximum: 65535 })),
    metricsAddress: Type.Optional(Type.String({ pattern: "^[^\\s:]+:[0-9]{1,5}$" })),
    kvEvents: Type.Optional(KvEventsEndpoint),
    adapters: Type.Optional(Type.Array(Type.String({ minLength: 1 }))),
    labels: Type.Optional(Type.Record(Type.String(), Type.String())),
  },
  { additionalProperties: false },
);
export type StaticPod = Static<typeof StaticPod>;

const check = TypeCompiler.Compile(StaticPod);

export class PodListError extends Error {
  override name = "PodListError";
}

/** Parses a pod list: `{pods: [...]}` or a bare array, YAML or JSON (JSON is YAML). */
export function parsePodList(text: string, source = "pod list"): StaticPod[] {
  let doc: unknown;
  try {
    doc = parseYaml(text);
  } catch (err) {
    throw new PodListError(`${source}: not valid YAML/JSON: ${(err as Error).message}`);
  }
  const list = Array.isArray(doc) ? doc : (doc as { pods?: unknown } | null)?.pods;
  if (!Array.isArray(list)) throw new PodListError(`${source}: expected a list of pods or {pods: [...]}`);
  const seen = new Set<string>();
  return list.map((entry, i) => {
    if (!check.Check(entry)) {
      const e = check.Errors(entry).First();
      throw new PodListError(`${source}: pods[${i}]${e?.path ?? ""}: ${e?.message ?? "invalid"}`);
    }
    const key = `${entry.model}\u0000${entry.name}`;
    if (seen.has(key)) throw new PodListError(`${source}: pods[${i}]: duplicate pod ${JSON.stringify(entry.name)} for model ${JSON.stringify(entry.model)}`);
    seen.add(key);
    return entry;
  });
}

export function readPodList(path: string): StaticPod[] {
  let text: string;
  try {
    text = readFileSync(path, "utf8");
  } catch (err) {
    throw new PodListError(`cannot read pod list ${path}: ${(err as Error).message}`);
  }
  return parsePodList(text, path);
}
