/**
 * What `jetroute config set` checks of a virtual model (docs/semantic.md) beyond its config alone:
 * every model its decisions, default and embedding signal name is one the fleet serves (a pod of
 * it was published to PODS, a pool lists it, or it has a model config), none is itself a virtual
 * model (no chains, no cycles), and every profile an action names is defined in its target's config.
 */
import type { ModelConfig } from "../../schemas/config.js";
import { MODEL_CONFIG_KEY_PREFIX, POOL_KEY_PREFIX, readPoolConfig } from "../../schemas/config.js";
import { streamName } from "../../streams/definitions.js";
import { isStreamNotFound } from "../../streams/errors.js";
import { decodeToken } from "../../streams/tokens.js";
import { targetModels } from "../routing/mod.js";
import type { Bucket, Nats } from "./config-bucket.js";

/** The models the fleet knows, as `config set` reads them. */
export interface KnownModels {
  /** Models with pods in PODS, in a pool, or with a (non-virtual) config. */
  served: ReadonlySet<string>;
  /** Models whose config makes them virtual. */
  virtual: ReadonlySet<string>;
  /** Profiles per configured model. */
  profiles: ReadonlyMap<string, ReadonlySet<string>>;
}

/** The first target of a virtual model's config the fleet does not serve, or that is virtual, named by its path. */
export function semanticTargetsError(model: string, c: ModelConfig, known: KnownModels): string | undefined {
  if (!c.semantic) return undefined;
  for (const t of targetModels(c.semantic)) {
    if (t.model !== model && known.virtual.has(t.model)) return `${t.path}: ${JSON.stringify(t.model)} is a virtual model (a decision must name a model the fleet serves)`;
    if (!known.served.has(t.model)) return `${t.path}: unknown model ${JSON.stringify(t.model)}: no pod of it was published, no pool lists it and it has no config (--allow-unknown-models to store it anyway)`;
    if (t.profile && !known.profiles.get(t.model)?.has(t.profile)) return `${t.path.replace(/model$/, "profile")}: the model ${JSON.stringify(t.model)} has no profile ${JSON.stringify(t.profile)}`;
  }
  return undefined;
}

/** Reads the models the fleet knows: the PODS stream's subjects, the pools, the model configs (excluding `self`). */
export async function readKnownModels(nats: Nats, kv: Bucket, prefix: string, self: string): Promise<KnownModels> {
  const served = new Set<string>();
  const virtual = new Set<string>();
  const profiles = new Map<string, Set<string>>();
  for await (const k of await kv.keys(`${MODEL_CONFIG_KEY_PREFIX}>`)) {
    let m: string;
    try {
      m = decodeToken(k.slice(MODEL_CONFIG_KEY_PREFIX.length));
    } catch {
      continue;
    }
    if (m === self) continue;
    const e = await kv.get(k);
    if (e?.operation !== "PUT") continue;
    let c: ModelConfig | undefined;
    try {
      c = e.json() as ModelConfig;
    } catch {
      continue;
    }
    if (c?.semantic) virtual.add(m);
    else served.add(m);
    profiles.set(m, new Set(Object.keys(c?.profiles ?? {})));
  }
  for await (const k of await kv.keys(`${POOL_KEY_PREFIX}>`)) {
    const e = await kv.get(k);
    if (e?.operation !== "PUT") continue;
    const p = readPoolConfig(() => e.json());
    if (p.ok) for (const m of p.value.models) served.add(m);
  }
  for (const m of await readPodModels(nats, prefix)) served.add(m);
  for (const m of virtual) served.delete(m);
  return { served, virtual, profiles };
}

/** The models some pod was published for (the PODS stream's subjects). */
export async function readPodModels(nats: Nats, prefix: string): Promise<Set<string>> {
  const served = new Set<string>();
  const pods = `${prefix}.pods.`;
  const info = await nats.jsm.streams.info(streamName(prefix, "PODS"), { subjects_filter: `${pods}>` }).catch((err: unknown) => {
    if (isStreamNotFound(err)) return undefined;
    throw err;
  });
  for (const subject of Object.keys(info?.state.subjects ?? {})) {
    const token = subject.slice(pods.length).split(".")[0];
    if (!token) continue;
    try {
      served.add(decodeToken(token));
    } catch {
      // not a model token: ignored
    }
  }
  return served;
}
