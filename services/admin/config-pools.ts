/**
 * `jetroute config set-pool|list-pools|delete-pool`: gateway pools' models (config key
 * `pool.<name>`, streams/pools.ts). A model belongs to one pool: set-pool refuses a model another
 * pool lists, and when two set-pool runs claim one model at the same time one of them backs out.
 */
import type { JetStreamManager } from "@nats-io/jetstream";
import { Kvm } from "@nats-io/kv";
import type { Command } from "commander";
import { POOL_KEY_PREFIX, type PoolConfig, poolConfigError, readPoolConfig } from "../../schemas/config.js";
import { applyStreams } from "../../streams/apply.js";
import { configBucketName, streamName } from "../../streams/definitions.js";
import { isStreamNotFound } from "../../streams/errors.js";
import { namespaceOf, poolNameError } from "../../streams/pools.js";
import { addNamespaceOptions, intOption, modelListOption, type NamespaceOptionValues, namespaceFlags } from "../shared/cli-options.js";
import { connectNats } from "../shared/nats.js";
import { addSigningOption, type Bucket, openConfigBucket, recordEncoder, type SigningOptionValues, withBucket } from "./config-bucket.js";

/** Exits 2 with a message when `pool` is not a valid pool name. */
function checkPoolName(pool: string): void {
  const err = poolNameError(pool);
  if (err) {
    console.error(`invalid pool: ${err}`);
    process.exit(2);
  }
}

/** The models a stored pool entry lists (none if it is deleted or not a pool config). */
async function poolModelsAt(kv: Bucket, key: string): Promise<string[]> {
  const e = await kv.get(key);
  if (e?.operation !== "PUT") return [];
  const r = readPoolConfig(() => e.json());
  return r.ok ? r.value.models : [];
}

/**
 * When two pools list one model, the gateways give it to the pool whose name sorts first: `pool`
 * keeps a model `other` also claims only if `pool` sorts before it.
 */
const keepsSharedModel = (pool: string, other: string): boolean => other > pool;

const quotedList = (models: string[]) => models.map((m) => JSON.stringify(m)).join(", ");
const themOrIt = (models: string[]) => (models.length > 1 ? "them" : "it");

type SetPoolOptions = NamespaceOptionValues & SigningOptionValues & { models: string[]; description?: string; replicas?: number };

export function registerSetPoolCommand(cfg: Command): void {
  addSigningOption(addNamespaceOptions(cfg.command("set-pool <pool>").description("assign models to a gateway pool (config key pool.<name>) and apply the pool's streams; a model belongs to one pool")))
    .requiredOption("--models <list>", "the pool's models, comma separated (LoRA adapters clients name too)", modelListOption)
    .option("--description <text>", "what the pool is for")
    .option("--replicas <n>", "replicas per stream of the pool's streams (default: as they are, 1 for new ones)", intOption(1, 5))
    .action(setPool);
}

async function setPool(pool: string, o: SetPoolOptions): Promise<void> {
  const nameErr = poolNameError(pool);
  const value: PoolConfig = { models: o.models, ...(o.description ? { description: o.description } : {}) };
  const err = nameErr ?? poolConfigError(value);
  if (err) {
    console.error(`invalid pool: ${err}`);
    process.exit(2);
  }
  const encode = recordEncoder(o);
  const { nats: urls, prefix } = namespaceFlags(o);
  const nats = await connectNats(urls, "jetroute-config");
  const { nc, jsm } = nats;
  try {
    // On a fresh NATS the config bucket does not exist yet (no pool either): applyStreams below creates it.
    const existing = await openConfigBucket(nats, prefix);
    await refuseModelsOfOtherPools(existing, pool, o.models);
    const ns = namespaceOf(prefix, pool);
    const replicas = o.replicas ?? (await currentReplicas(jsm, ns.prefix));
    for (const c of await applyStreams(nc, jsm, { prefix: ns.prefix, configPrefix: ns.configPrefix, replicas })) {
      if (c.action !== "unchanged") console.log(`${c.action.padEnd(9)} ${c.name}`);
    }
    const kv = existing ?? (await new Kvm(nc).open(configBucketName(prefix)));
    const key = `${POOL_KEY_PREFIX}${pool}`;
    const before = await kv.get(key);
    const rev = await writePoolEntry(kv, pool, key, encode(key, value), before?.revision);
    await backOutOfConcurrentClaim(kv, pool, o.models, key, before, rev, encode);
    console.log(`stored pool ${pool}: ${o.models.length} model${o.models.length === 1 ? "" : "s"} (revision ${rev})`);
  } finally {
    await nc.close();
  }
}

/** Another pool listing one of these models would make the assignment ambiguous: exits 2 if one does. */
async function refuseModelsOfOtherPools(existing: Bucket | undefined, pool: string, models: string[]): Promise<void> {
  const others = existing ? await existing.keys(`${POOL_KEY_PREFIX}>`) : [];
  for await (const k of others) {
    const other = k.slice(POOL_KEY_PREFIX.length);
    if (other === pool) continue;
    const listed = await poolModelsAt(existing as Bucket, k);
    const taken = models.filter((m) => listed.includes(m));
    if (taken.length > 0) {
      console.error(`${quotedList(taken)} already in pool ${JSON.stringify(other)}: remove ${themOrIt(taken)} there first (jetroute config set-pool ${other} --models ...)`);
      process.exit(2);
    }
  }
}

/**
 * The replica count of a pool's streams as they are: re-running set-pool to change the models must
 * not change a clustered pool's replica count.
 */
async function currentReplicas(jsm: JetStreamManager, poolPrefix: string): Promise<number> {
  return jsm.streams.info(streamName(poolPrefix, "CHARGES")).then(
    (i) => i.config.num_replicas,
    (err: unknown) => {
      // Only a pool without streams starts at 1; a failed lookup must not shrink a clustered pool.
      if (isStreamNotFound(err)) return 1;
      throw err;
    },
  );
}

/**
 * Writes the pool's entry, compare-and-set on the revision read before (`create` when there was
 * none): another set-pool of this pool since then fails here (exit 2), not silently.
 */
async function writePoolEntry(kv: Bucket, pool: string, key: string, json: string, beforeRevision: number | undefined): Promise<number> {
  try {
    return beforeRevision !== undefined ? await kv.update(key, json, beforeRevision) : await kv.create(key, json);
  } catch (err) {
    console.error(`pool ${pool} was changed by someone else meanwhile (${(err as Error).message}); run set-pool again`);
    process.exit(2);
  }
}

type PoolEntry = Awaited<ReturnType<Bucket["get"]>>;

/**
 * Two set-pool runs claiming one model at once both pass refuseModelsOfOtherPools. Look again: the
 * pool the gateways would not give the model to takes its own change back (compare-and-set on its
 * revision, `rev`) and exits 2, so one claim stands; the other only warns.
 */
async function backOutOfConcurrentClaim(kv: Bucket, pool: string, models: string[], key: string, before: PoolEntry, rev: number, encode: ReturnType<typeof recordEncoder>): Promise<void> {
  for await (const k of await kv.keys(`${POOL_KEY_PREFIX}>`)) {
    const other = k.slice(POOL_KEY_PREFIX.length);
    if (other === pool) continue;
    const listed = await poolModelsAt(kv, k);
    const clash = models.filter((m) => listed.includes(m));
    if (clash.length === 0) continue;
    const names = quotedList(clash);
    if (keepsSharedModel(pool, other)) {
      console.error(`warning: pool ${JSON.stringify(other)} also lists ${names} (written at the same time): the gateways give ${themOrIt(clash)} to pool ${pool}; remove ${themOrIt(clash)} from ${other}`);
      continue;
    }
    // The entry as it was, signed afresh: its old signature's time is too far from now to verify.
    const restored = before?.operation === "PUT" ? readPoolConfig(() => before.json()) : undefined;
    const back = restored === undefined ? undefined : restored.ok ? encode(key, restored.value) : before?.string();
    await (back !== undefined ? kv.update(key, back, rev) : kv.delete(key, { previousSeq: rev })).catch(() => undefined);
    console.error(`${names} claimed by pool ${JSON.stringify(other)} at the same time: pool ${pool} left as it was`);
    process.exit(2);
  }
}

export function registerListPoolsCommand(cfg: Command): void {
  addNamespaceOptions(cfg.command("list-pools").description("list gateway pools and their models, one JSON line each, by name")).action(async (o: NamespaceOptionValues) => {
    await withBucket(o, async (kv) => {
      const keys: string[] = [];
      for await (const k of await kv.keys(`${POOL_KEY_PREFIX}>`)) keys.push(k);
      for (const k of keys.sort()) {
        const e = await kv.get(k);
        if (e?.operation !== "PUT") continue;
        const pool = k.slice(POOL_KEY_PREFIX.length);
        // An entry written by hand may not validate: shown as such (gateways keep the previous one), not a crash.
        const r = readPoolConfig(() => e.json());
        console.log(JSON.stringify(r.ok ? { pool, ...r.value } : { pool, invalid: r.error }));
      }
    });
  });
}

export function registerDeletePoolCommand(cfg: Command): void {
  addNamespaceOptions(cfg.command("delete-pool <pool>").description("remove a pool's model assignment (its streams stay; delete them with the nats CLI once no process uses them)")).action(async (pool: string, o: NamespaceOptionValues) => {
    checkPoolName(pool);
    const key = `${POOL_KEY_PREFIX}${pool}`;
    const found = await withBucket(o, async (kv) => {
      if ((await kv.get(key))?.operation !== "PUT") return false;
      await kv.delete(key);
      return true;
    });
    if (!found) {
      console.error(`no pool ${pool} (see \`jetroute config list-pools\`)`);
      process.exit(1);
    }
    console.log(`deleted pool ${pool}`);
    console.error(`pool ${pool}'s pod-watchers stop publishing its pods within a few seconds (removing them), and its gateways then answer 404; unpooled pod-watchers pick its models up`);
  });
}
