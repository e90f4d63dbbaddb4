/**
 * The InferencePool watcher's second job (k8s-inference-pool.ts): watch the pool namespace's
 * InferenceObjectives and InferenceModelRewrites, derive the pool's policy record (pool-policy.ts)
 * and keep it in the config bucket under `inferencepool.<namespace>.<name>`, where every gateway
 * reads it. Only the source's leader writes, and only what changed (plus once on taking the lead).
 * A cluster that does not serve these kinds (their CRDs not installed) is logged once and the
 * pool runs without objectives or rewrites: the endpoints must not depend on optional APIs.
 */
import { CustomObjectsApi, type KubeConfig } from "@kubernetes/client-node";
import { Kvm, type KV } from "@nats-io/kv";
import type { NatsConnection } from "@nats-io/transport-node";
import { configBucketName } from "../../streams/definitions.js";
import { namespaceOf } from "../../streams/pools.js";
import { configRecordSubject, type RecordSigner } from "../../streams/signatures.js";
import type { Logger } from "../shared/log.js";
import { type InformerSettings, type KubernetesObjectList, type Watched, watchObjects } from "./k8s-informers.js";
import { checkObjectivesApiVersion, type KubeObjectLike, poolPolicyKey, poolPolicyOf } from "./pool-policy.js";

export interface PoolPolicyWatchOptions {
  kc: KubeConfig;
  nc: NatsConnection;
  /** Base subject prefix and gateway pool (the config bucket is the namespace's). */
  prefix: string;
  gatewayPool?: string;
  namespace: string;
  pool: string;
  apiVersion?: string;
  log: Logger;
  settings: Omit<InformerSettings, "api" | "labelSelector">;
  /** Whether this watcher is its source's leader (only the leader writes). */
  isLeader: () => boolean;
  signer?: RecordSigner;
}

export interface PoolPolicyWatch {
  /** The informers to supervise (none when the cluster does not serve the kinds). */
  watched: Watched[];
  stats: { policyWrites: number; policyWriteFailures: number; policyProblems: number; objectives: number; rewriteRules: number; prioritiesClamped: number };
  /** The base models the pool's endpoints serve (recorded in the policy: its objectives and generic rules apply to them). */
  setModels(models: string[]): void;
  /** Re-derives and writes when due (called on informer changes and periodically). */
  sync(): void;
  stop(): Promise<void>;
}

async function served(objects: CustomObjectsApi, group: string, version: string, namespace: string, plural: string): Promise<boolean> {
  try {
    await objects.listNamespacedCustomObject({ group, version, namespace, plural, limit: 1 });
    return true;
  } catch (err) {
    return (err as { code?: number }).code !== 404;
  }
}

export async function startPoolPolicyWatch(o: PoolPolicyWatchOptions): Promise<PoolPolicyWatch> {
  const apiVersion = checkObjectivesApiVersion(o.apiVersion);
  const [group, version] = apiVersion.split("/") as [string, string];
  const objects = o.kc.makeApiClient(CustomObjectsApi);
  const stats = { policyWrites: 0, policyWriteFailures: 0, policyProblems: 0, objectives: 0, rewriteRules: 0, prioritiesClamped: 0 };
  const watched: Watched[] = [];
  const kinds = ["inferenceobjectives", "inferencemodelrewrites"] as const;
  const informers: Partial<Record<(typeof kinds)[number], Watched>> = {};
  for (const plural of kinds) {
    if (!(await served(objects, group, version, o.namespace, plural))) {
      o.log.warn({ resource: `${plural}.${group}/${version}` }, "the API server does not serve this kind: the pool runs without it");
      continue;
    }
    const w = watchObjects(`/apis/${group}/${version}/namespaces/${o.namespace}/${plural}`, () => objects.listNamespacedCustomObject({ group, version, namespace: o.namespace, plural }) as Promise<KubernetesObjectList>, o.settings, `${plural}/${o.namespace}`);
    informers[plural] = w;
    watched.push(w);
  }
  const key = poolPolicyKey(o.namespace, o.pool);
  const bucket = configBucketName(namespaceOf(o.prefix, o.gatewayPool).configPrefix);
  let kv: KV | undefined;
  let models: string[] = [];
  let written = "";
  let wasLeader = false;
  let writing = false;
  let stopped = false;
  let reported = "";
  const list = (w: Watched | undefined) => (w ? (w.informer.list() as unknown as KubeObjectLike[]) : []);

  const sync = () => {
    if (stopped || watched.length === 0 || !watched.every((w) => w.synced)) return;
    const p = poolPolicyOf({ namespace: o.namespace, pool: o.pool, apiVersion, models, objectives: list(informers.inferenceobjectives), rewrites: list(informers.inferencemodelrewrites) });
    stats.policyProblems = p.problems.length;
    stats.objectives = Object.keys(p.policy.objectives).length;
    stats.rewriteRules = p.policy.rewrites.length;
    stats.prioritiesClamped = p.clamped;
    const problems = JSON.stringify(p.problems);
    if (problems !== reported) {
      reported = problems;
      for (const pr of p.problems.slice(0, 20)) o.log.error({ pool: `${o.namespace}/${o.pool}`, object: pr.object.slice(0, 300), reason: pr.reason }, "skipped: invalid objective or rewrite");
    }
    const leader = o.isLeader();
    const text = JSON.stringify(p.policy);
    const due = leader && (text !== written || !wasLeader);
    wasLeader = leader;
    if (!due || writing) return;
    writing = true;
    void (async () => {
      try {
        kv ??= await new Kvm(o.nc).open(bucket);
        const body = o.signer ? o.signer.sign(configRecordSubject(bucket, key), p.policy, Date.now()) : p.policy;
        await kv.put(key, JSON.stringify(body));
        written = text;
        stats.policyWrites++;
        o.log.info({ pool: `${o.namespace}/${o.pool}`, objectives: stats.objectives, rewriteRules: stats.rewriteRules, models: models.length }, "InferencePool policy written");
      } catch (err) {
        stats.policyWriteFailures++;
        wasLeader = false; // try again at the next sync
        o.log.warn({ err: (err as Error).message, key }, "writing the InferencePool policy failed; retrying");
      } finally {
        writing = false;
      }
    })();
  };
  return {
    watched,
    stats,
    setModels(m) {
      models = m;
      sync();
    },
    sync,
    async stop() {
      stopped = true;
    },
  };
}
