/**
 * Where declared adapters come from: the config bucket (`adapter.<name>`, `jetroute config
 * set-adapter`), watched live, and, with `--kubernetes`, the ModelAdapters of the API server
 * (`model.aibrix.ai/v1alpha1`), listed every `pollMs` across namespaces (or in the given ones).
 * A ModelAdapter's name is the adapter's name (what clients send as `model`), as in AIBrix.
 * Invalid declarations are kept with their error: the controller reports them (log, record,
 * a Failed status on the ModelAdapter) and places nothing for them.
 */
import { CustomObjectsApi, type KubeConfig, PatchStrategy, setHeaderOptions } from "@kubernetes/client-node";
import { type KV, type KvEntry, Kvm } from "@nats-io/kv";
import { ADAPTER_KEY_PREFIX, type AdapterSpec, adapterNameError, adapterSpecError, MAX_ADAPTERS, MODEL_ADAPTER_GROUP, MODEL_ADAPTER_VERSION } from "../../schemas/adapters.js";
import { configBucketName } from "../../streams/definitions.js";
import type { RecordKeySets } from "../../streams/record-keys.js";
import { SIGNATURE_FIELD } from "../../streams/signatures.js";
import { decodeToken } from "../../streams/tokens.js";
import { configEntryJudge } from "../shared/config-judge.js";
import type { Logger } from "../shared/log.js";
import type { NatsHandles } from "../shared/nats.js";

export interface Declaration {
  readonly name: string;
  readonly source: "config" | "kubernetes";
  /** The ModelAdapter it came from. */
  readonly ref?: { readonly namespace: string; readonly name: string };
  /** Valid: the spec. Invalid: undefined, and `error` says why. */
  readonly spec?: AdapterSpec;
  readonly error?: string;
}

export interface DeclarationSource {
  /** Current declarations by adapter name. */
  current(): ReadonlyMap<string, Declaration>;
  /** False until the first full read (nothing is unloaded as "deleted" before it). */
  readonly synced: boolean;
  stop(): void;
}

export function declarationOf(name: string, source: Declaration["source"], spec: unknown, ref?: Declaration["ref"]): Declaration {
  const err = adapterNameError(name) ?? adapterSpecError(spec);
  return { name, source, ...(ref ? { ref } : {}), ...(err ? { error: err } : { spec: spec as AdapterSpec }) };
}

/**
 * The config bucket's `adapter.*` declarations, live. With the operator's keys
 * (`--config-public-key`, streams/record-keys.ts), a declaration whose signature does not verify
 * is counted (`stats.refusedSignature`), logged and ignored: the previous value, if any, stays.
 */
export async function watchConfigDeclarations(nats: NatsHandles, prefix: string, log: Logger, signatures: RecordKeySets = {}, stats: { refusedSignature: number } = { refusedSignature: 0 }): Promise<DeclarationSource> {
  const bucket = configBucketName(prefix);
  const kv: KV = await new Kvm(nats.js).open(bucket);
  const decls = new Map<string, Declaration>();
  const refusal = configEntryJudge(bucket, signatures, stats, log, "adapter declaration refused: its signature does not verify under the operator's keys (--config-public-key); ignored (the previous value, if any, stays)");
  const apply = (e: KvEntry) => {
    let name: string;
    try {
      name = decodeToken(e.key.slice(ADAPTER_KEY_PREFIX.length));
    } catch {
      return;
    }
    if (e.operation !== "PUT") {
      refusal.forget(e.key);
      decls.delete(name);
      return;
    }
    let value: unknown;
    try {
      value = e.json();
    } catch {
      value = undefined;
    }
    if (refusal(e, value)) return;
    if (!decls.has(name) && decls.size >= MAX_ADAPTERS) {
      log.warn({ adapter: name.slice(0, 128) }, `more than ${MAX_ADAPTERS} adapters declared: ignored`);
      return;
    }
    // A signed declaration carries its signature beside the spec's fields: not part of the spec.
    if (value !== null && typeof value === "object" && !Array.isArray(value) && SIGNATURE_FIELD in value) {
      const { [SIGNATURE_FIELD]: _, ...spec } = value as Record<string, unknown>;
      value = spec;
    }
    const d = declarationOf(name, "config", value);
    if (d.error) log.error({ adapter: name.slice(0, 128), err: d.error }, "invalid adapter in the config bucket: nothing placed for it");
    decls.set(name, d);
  };
  const w = await kv.watch({ key: `${ADAPTER_KEY_PREFIX}>` });
  void (async () => {
    for await (const e of w) apply(e);
  })().catch((err: unknown) => log.warn({ err }, "adapter config watch ended"));
  for await (const k of await kv.keys(`${ADAPTER_KEY_PREFIX}>`)) {
    const e = await kv.get(k);
    if (e) apply(e);
  }
  return { current: () => decls, synced: true, stop: () => w.stop() };
}

interface KubeModelAdapter {
  metadata?: { name?: string; namespace?: string; uid?: string };
  spec?: unknown;
  status?: Record<string, unknown>;
}

export interface KubeDeclarationSource extends DeclarationSource {
  /** Writes a ModelAdapter's status subresource (merge patch). */
  writeStatus(ref: { namespace: string; name: string }, status: Record<string, unknown>): Promise<void>;
}

/** ModelAdapters listed every `pollMs`; the same name in two namespaces: the first (by namespace) wins, the other is invalid. */
export function pollKubeDeclarations(kc: KubeConfig, o: { namespaces?: readonly string[]; pollMs: number; log: Logger }): KubeDeclarationSource {
  const api = kc.makeApiClient(CustomObjectsApi);
  const group = MODEL_ADAPTER_GROUP;
  const version = MODEL_ADAPTER_VERSION;
  const plural = "modeladapters";
  let decls = new Map<string, Declaration>();
  let synced = false;
  let stopped = false;
  let failing = false;
  const read = async () => {
    const items: KubeModelAdapter[] = [];
    if (o.namespaces && o.namespaces.length > 0) {
      for (const namespace of o.namespaces) items.push(...(((await api.listNamespacedCustomObject({ group, version, namespace, plural })) as { items?: KubeModelAdapter[] }).items ?? []));
    } else items.push(...(((await api.listClusterCustomObject({ group, version, plural })) as { items?: KubeModelAdapter[] }).items ?? []));
    items.sort((a, b) => `${a.metadata?.namespace}/${a.metadata?.name}`.localeCompare(`${b.metadata?.namespace}/${b.metadata?.name}`));
    const next = new Map<string, Declaration>();
    for (const it of items.slice(0, MAX_ADAPTERS)) {
      const name = it.metadata?.name ?? "";
      const ref = { namespace: it.metadata?.namespace ?? "default", name };
      const taken = next.get(name);
      if (taken) {
        next.set(`${ref.namespace}/${name}`, { name, source: "kubernetes", ref, error: `adapter name ${name} is taken by ModelAdapter ${taken.ref?.namespace}/${name}` });
        continue;
      }
      next.set(name, declarationOf(name, "kubernetes", it.spec, ref));
    }
    decls = next;
    synced = true;
  };
  const loop = async () => {
    while (!stopped) {
      try {
        await read();
        if (failing) o.log.info("ModelAdapters listed again");
        failing = false;
      } catch (err) {
        if (!failing) o.log.error({ err: (err as Error).message }, "cannot list ModelAdapters (is the CRD installed, RBAC given?): keeping the last list");
        failing = true;
      }
      await new Promise((r) => setTimeout(r, o.pollMs).unref?.());
    }
  };
  void loop();
  return {
    current: () => decls,
    get synced() {
      return synced;
    },
    stop: () => {
      stopped = true;
    },
    async writeStatus(ref, status) {
      await api.patchNamespacedCustomObjectStatus({ group, version, plural, namespace: ref.namespace, name: ref.name, body: { status } }, setHeaderOptions("Content-Type", PatchStrategy.MergePatch));
    },
  };
}
