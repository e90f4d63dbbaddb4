/**
 * Subject builders and parsers. Every subject jetroute publishes or consumes is built here.
 *
 *   <prefix>.pods.<model>.<pod>        PODS       pod readiness (pod-watcher)
 *   <prefix>.podsrc.<source>           PODS       pod-watcher source heartbeats (own family, so
 *                                                 followers filtering `pods.>` never see them)
 *   <prefix>.load.<model>.<pod>        LOAD       engine load samples (metrics-scraper)
 *   <prefix>.kv.<model>.<pod>          KV         KV block events (kv-bridge; reserved)
 *   <prefix>.charges.<model>.<pod>     CHARGES    provisional charges (gateways)
 *   <prefix>.releases.<model>.<pod>    CHARGES    their releases (own subject: strict mode's
 *                                                 compare-and-set guards charges only)
 *   <prefix>.hb.<gateway>              CHARGES    gateway heartbeats (same stream: one ordered fold)
 *   <prefix>.decisions.<model>         DECISIONS  decision records (gateways)
 *   <prefix>.dlq.<family>              DLQ        dead letters, by the family they were read from
 *   <prefix>.autoscale.<policy>        AUTOSCALE  autoscaling recommendations: inputs, arithmetic, result
 *   <prefix>.adapters.<adapter>        ADAPTERS   LoRA adapter placement decisions (adapter-controller)
 *   <prefix>.flow.<gateway>            (none)     flow-control summaries of held requests (gateways;
 *                                                 core NATS: only the latest matters, nothing is kept)
 *   <prefix>.batch.file.<file id>      BATCH      Batch API file records (batch-api)
 *   <prefix>.batch.job.<batch hex>     BATCH      a batch's job events (batch-api; one subject per batch)
 *   <prefix>.batchwork.<batch hex>     BATCH_WORK a batch's items, a work queue (batch-api -> batch-worker)
 *   <prefix>.batchres.<batch hex>      BATCH_RESULTS one result per executed item (batch-worker)
 *   <base>.resploc.<digest>             RESPONSES  where each Responses API response lives (gateways;
 *                                                 base prefix only; a digest, never the client's id)
 *   <base>.respstore.<digest>           RESPONSE_STORE a stored response's items, by tenant and id (gateways)
 *   <base>.usage.<pool>.<gateway>.<startedAt>  USAGE      per-user rate-limit usage summaries (gateways; base
 *                                                 prefix only, `_` for the unpooled namespace)
 */
import { decodeToken, encodeToken } from "./tokens.js";

export const DEFAULT_PREFIX = "jr";

/** A response subject's token: a 32-hex digest, never a client string. */
function checkDigest(d: string): string {
  if (!/^[0-9a-f]{32}$/.test(d)) throw new Error(`not a response digest: ${JSON.stringify(d.slice(0, 80))}`);
  return d;
}

export const Family = {
  pods: "pods",
  podsrc: "podsrc",
  load: "load",
  kv: "kv",
  charges: "charges",
  releases: "releases",
  hb: "hb",
  decisions: "decisions",
  dlq: "dlq",
  usage: "usage",
  flow: "flow",
  autoscale: "autoscale",
  adapters: "adapters",
  batch: "batch",
  batchwork: "batchwork",
  batchres: "batchres",
  resploc: "resploc",
  respstore: "respstore",
} as const;

/** The pool token of the unpooled namespace in a usage subject (pool names never hold `_`). */
export const UNPOOLED_TOKEN = "_";
export type Family = (typeof Family)[keyof typeof Family];

export class Subjects {
  constructor(readonly prefix: string = DEFAULT_PREFIX) {
    if (!/^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$/.test(prefix)) throw new Error(`invalid subject prefix ${JSON.stringify(prefix)}`);
  }

  pod(model: string, pod: string): string {
    return `${this.prefix}.pods.${encodeToken(model)}.${encodeToken(pod)}`;
  }
  podSource(source: string): string {
    return `${this.prefix}.podsrc.${encodeToken(source)}`;
  }
  load(model: string, pod: string): string {
    return `${this.prefix}.load.${encodeToken(model)}.${encodeToken(pod)}`;
  }
  kv(model: string, pod: string): string {
    return `${this.prefix}.kv.${encodeToken(model)}.${encodeToken(pod)}`;
  }
  charges(model: string, pod: string): string {
    return `${this.prefix}.charges.${encodeToken(model)}.${encodeToken(pod)}`;
  }
  releases(model: string, pod: string): string {
    return `${this.prefix}.releases.${encodeToken(model)}.${encodeToken(pod)}`;
  }
  heartbeat(gateway: string): string {
    return `${this.prefix}.hb.${encodeToken(gateway)}`;
  }
  decisions(model: string): string {
    return `${this.prefix}.decisions.${encodeToken(model)}`;
  }
  /** Flow control: a gateway's summary of the requests it holds (core NATS, not a stream). */
  flow(gateway: string): string {
    return `${this.prefix}.flow.${encodeToken(gateway)}`;
  }
  /** An autoscaling policy's evaluations (services/autoscaler/). */
  autoscale(policy: string): string {
    return `${this.prefix}.autoscale.${encodeToken(policy)}`;
  }
  /** A LoRA adapter's placement decisions (services/adapters/). */
  adapter(name: string): string {
    return `${this.prefix}.adapters.${encodeToken(name)}`;
  }
  /** Built on the base prefix's `Subjects` (the USAGE stream is shared by every pool). */
  /** One subject per gateway process (`startedAt`): a restarted gateway's previous summary stays readable by whoever boots. */
  usage(pool: string | undefined, gateway: string, startedAt: number): string {
    return `${this.usageOf(pool)}${encodeToken(gateway)}.${startedAt}`;
  }
  /** The prefix of a namespace's usage subjects, e.g. `jr.usage.chat.`. */
  usageOf(pool: string | undefined): string {
    return `${this.prefix}.usage.${pool === undefined ? UNPOOLED_TOKEN : encodeToken(pool)}.`;
  }
  /** Batch API: a file's records. Ids are server-made (`file-<hex>`), never client strings. */
  batchFile(fileId: string): string {
    return `${this.prefix}.batch.file.${encodeToken(fileId)}`;
  }
  /** Batch API: a batch's job events (`batchHex` is the id's hex part). */
  batchJob(batchHex: string): string {
    return `${this.prefix}.batch.job.${encodeToken(batchHex)}`;
  }
  batchWork(batchHex: string): string {
    return `${this.prefix}.batchwork.${encodeToken(batchHex)}`;
  }
  batchResult(batchHex: string): string {
    return `${this.prefix}.batchres.${encodeToken(batchHex)}`;
  }
  /** Responses API: a response's location record; `digest` is `locationDigest(tenant, id)` (schemas/responses.ts). */
  responseLocation(digest: string): string {
    return `${this.prefix}.resploc.${checkDigest(digest)}`;
  }
  /** Responses API: a stored response; `digest` is `storeDigest(tenant, id)`. */
  responseStored(digest: string): string {
    return `${this.prefix}.respstore.${checkDigest(digest)}`;
  }
  deadLetter(family: Family): string {
    return `${this.prefix}.dlq.${family}`;
  }
  /** Wildcard over one family, e.g. `jr.charges.>`. */
  all(family: Family): string {
    return `${this.prefix}.${family}.>`;
  }

  /** Splits a subject into its family and decoded name tokens; undefined if it is not ours. */
  parse(subject: string): { family: Family; names: string[] } | undefined {
    if (!subject.startsWith(`${this.prefix}.`)) return undefined;
    const rest = subject.slice(this.prefix.length + 1).split(".");
    const family = rest[0] as Family;
    if (!Object.values(Family).includes(family)) return undefined;
    try {
      return { family, names: rest.slice(1).map(decodeToken) };
    } catch {
      return undefined;
    }
  }
}
