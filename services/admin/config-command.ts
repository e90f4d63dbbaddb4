/**
 * `jetroute config get|set|list|delete`: per-model routing config in the config bucket;
 * `set-limits|get-limits`: per-user rate limits; `add-key|list-keys|revoke-key`: API keys for
 * `gateway --auth required` (only their SHA-256 is stored; the key is printed once, at creation);
 * `set-pool|list-pools|delete-pool`: gateway pools' models (streams/pools.ts).
 */
import { readFileSync } from "node:fs";
import { Kvm } from "@nats-io/kv";
import type { Command } from "commander";
import {
  API_KEY_KEY_PREFIX,
  type ApiKeyRecord,
  apiKeyRecordError,
  MODEL_CONFIG_KEY_PREFIX,
  POOL_KEY_PREFIX,
  type PoolConfig,
  poolConfigError,
  RATE_LIMITS_KEY,
  readPoolConfig,
  rateLimitsError,
} from "../../schemas/config.js";
import { applyStreams } from "../../streams/apply.js";
import { configBucketName, streamName } from "../../streams/definitions.js";
import { isStreamNotFound } from "../../streams/errors.js";
import { namespaceOf, poolNameError } from "../../streams/pools.js";
import { decodeToken, encodeToken } from "../../streams/tokens.js";
import { apiKeyBucketKey, generateApiKey, hashApiKey, hashOfBucketKey, resolveHashPrefix, revokeTarget, SHOWN_HASH_PREFIX } from "../gateway/auth.js";
import { validateModelConfig } from "../routing/config-check.js";
import { addNamespaceOptions, DEFAULT_PREFIX, intOption, modelListOption, type NamespaceOptionValues, namespaceFlags } from "../shared/cli-options.js";
import { connectNats } from "../shared/nats.js";

export { validateModelConfig };

type Bucket = Awaited<ReturnType<Kvm["open"]>>;

interface StoredKey {
  hash: string;
  revision: number;
  /** Undefined when the stored value does not validate. */
  record: ApiKeyRecord | undefined;
}

/** Every API key entry in the bucket (deleted ones left out), by hash order. */
async function readKeys(kv: Bucket): Promise<StoredKey[]> {
  const out: StoredKey[] = [];
  for await (const k of await kv.keys(`${API_KEY_KEY_PREFIX}>`)) {
    const hash = hashOfBucketKey(k);
    if (!hash) continue;
    const e = await kv.get(k);
    if (e?.operation !== "PUT") continue;
    let value: unknown;
    try {
      value = e.json();
    } catch {
      value = undefined;
    }
    out.push({ hash, revision: e.revision, record: value !== undefined && !apiKeyRecordError(value) ? (value as ApiKeyRecord) : undefined });
  }
  return out.sort((a, b) => (a.hash < b.hash ? -1 : a.hash > b.hash ? 1 : 0));
}

const shortHash = (h: string) => h.slice(0, SHOWN_HASH_PREFIX);
const keyStatus = (k: StoredKey) => (!k.record ? "invalid" : k.record.disabled ? "revoked" : "active");

type Nats = Awaited<ReturnType<typeof connectNats>>;

/** The config bucket, or undefined if nothing has created it yet (`streams apply`, `set-pool`). */
async function openConfigBucket({ nc, jsm }: Nats, prefix: string): Promise<Bucket | undefined> {
  const name = configBucketName(prefix);
  // Kvm.open would fail later with a bare "stream not found"; ask for the bucket's stream first.
  const exists = await jsm.streams.info(`KV_${name}`).then(
    () => true,
    (err: unknown) => {
      // Only a missing bucket reads as missing; a timeout or a refused call is reported as itself.
      if (isStreamNotFound(err)) return false;
      throw err;
    },
  );
  return exists ? new Kvm(nc).open(name) : undefined;
}

async function withBucket<T>(o: NamespaceOptionValues, fn: (kv: Bucket) => Promise<T>): Promise<T> {
  const { nats: urls, prefix } = namespaceFlags(o);
  const nats = await connectNats(urls, "jetroute-config");
  try {
    const kv = await openConfigBucket(nats, prefix);
    if (!kv) throw new Error(`the config bucket ${configBucketName(prefix)} does not exist: run \`jetroute streams apply${prefix === DEFAULT_PREFIX ? "" : ` --prefix ${prefix}`}\` first`);
    return await fn(kv);
  } finally {
    await nats.nc.close();
  }
}

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

export function registerConfigCommand(program: Command): void {
  const cfg = program.command("config").description("per-model routing config (locked strategy, profiles), live on every gateway");
  addNamespaceOptions(cfg.command("set <model>").description("validate and store a model's config (JSON from --json or --file)"))
    .option("--json <json>", "the config as JSON")
    .option("--file <path>", "a file holding the config as JSON")
    .action(async (model: string, o: NamespaceOptionValues & { json?: string; file?: string }) => {
      const text = o.json ?? (o.file ? readFileSync(o.file, "utf8") : undefined);
      if (text === undefined) throw new Error("give the config with --json or --file");
      let value: unknown;
      try {
        value = JSON.parse(text);
      } catch (e) {
        throw new Error(`config is not valid JSON: ${(e as Error).message}`);
      }
      const err = validateModelConfig(value);
      if (err) {
        console.error(`invalid config for ${model}: ${err}`);
        process.exit(2);
      }
      const rev = await withBucket(o, (kv) => kv.put(`${MODEL_CONFIG_KEY_PREFIX}${encodeToken(model)}`, JSON.stringify(value)));
      console.log(`stored config for ${model} (revision ${rev})`);
    });
  addNamespaceOptions(cfg.command("get <model>").description("print a model's config")).action(async (model: string, o: NamespaceOptionValues) => {
    const e = await withBucket(o, (kv) => kv.get(`${MODEL_CONFIG_KEY_PREFIX}${encodeToken(model)}`));
    if (e?.operation !== "PUT") {
      console.error(`no config for ${model}`);
      process.exit(1);
    }
    console.log(JSON.stringify(e.json(), null, 2));
  });
  addNamespaceOptions(cfg.command("list").description("list configured models")).action(async (o: NamespaceOptionValues) => {
    await withBucket(o, async (kv) => {
      for await (const k of await kv.keys(`${MODEL_CONFIG_KEY_PREFIX}>`)) console.log(decodeToken(k.slice(MODEL_CONFIG_KEY_PREFIX.length)));
    });
  });
  addNamespaceOptions(cfg.command("set-limits").description('validate and store per-user limits: {"users": {"default": {"rpm": 100, "tpm": 100000}, "alice": {"rpm": 10}}}'))
    .requiredOption("--json <json>", "the limits as JSON")
    .action(async (o: NamespaceOptionValues & { json: string }) => {
      let value: unknown;
      try {
        value = JSON.parse(o.json);
      } catch (e) {
        throw new Error(`limits are not valid JSON: ${(e as Error).message}`);
      }
      const err = rateLimitsError(value);
      if (err) {
        console.error(`invalid limits: ${err}`);
        process.exit(2);
      }
      const rev = await withBucket(o, (kv) => kv.put(RATE_LIMITS_KEY, JSON.stringify(value)));
      console.log(`stored limits (revision ${rev})`);
    });
  addNamespaceOptions(cfg.command("set-pool <pool>").description("assign models to a gateway pool (config key pool.<name>) and apply the pool's streams; a model belongs to one pool"))
    .requiredOption("--models <list>", "the pool's models, comma separated (LoRA adapters clients name too)", modelListOption)
    .option("--description <text>", "what the pool is for")
    .option("--replicas <n>", "replicas per stream of the pool's streams (default: as they are, 1 for new ones)", intOption(1, 5))
    .action(async (pool: string, o: NamespaceOptionValues & { models: string[]; description?: string; replicas?: number }) => {
      const nameErr = poolNameError(pool);
      const value: PoolConfig = { models: o.models, ...(o.description ? { description: o.description } : {}) };
      const err = nameErr ?? poolConfigError(value);
      if (err) {
        console.error(`invalid pool: ${err}`);
        process.exit(2);
      }
      const { nats: urls, prefix } = namespaceFlags(o);
      const nats = await connectNats(urls, "jetroute-config");
      const { nc, jsm } = nats;
      try {
        // On a fresh NATS the config bucket does not exist yet (no pool either): applyStreams below creates it.
        const existing = await openConfigBucket(nats, prefix);
        // Another pool listing one of these models would make the assignment ambiguous: refuse it here.
        const others = existing ? await existing.keys(`${POOL_KEY_PREFIX}>`) : [];
        for await (const k of others) {
          const other = k.slice(POOL_KEY_PREFIX.length);
          if (other === pool) continue;
          const models = await poolModelsAt(existing as Bucket, k);
          const taken = o.models.filter((m) => models.includes(m));
          if (taken.length > 0) {
            console.error(`${taken.map((m) => JSON.stringify(m)).join(", ")} already in pool ${JSON.stringify(other)}: remove ${taken.length > 1 ? "them" : "it"} there first (jetroute config set-pool ${other} --models ...)`);
            process.exit(2);
          }
        }
        const ns = namespaceOf(prefix, pool);
        // Re-running set-pool to change the models must not change a clustered pool's replica count.
        const replicas =
          o.replicas ??
          (await jsm.streams.info(streamName(ns.prefix, "CHARGES")).then(
            (i) => i.config.num_replicas,
            (err: unknown) => {
              // Only a pool without streams starts at 1; a failed lookup must not shrink a clustered pool.
              if (isStreamNotFound(err)) return 1;
              throw err;
            },
          ));
        for (const c of await applyStreams(nc, jsm, { prefix: ns.prefix, configPrefix: ns.configPrefix, replicas })) {
          if (c.action !== "unchanged") console.log(`${c.action.padEnd(9)} ${c.name}`);
        }
        const kv = existing ?? (await new Kvm(nc).open(configBucketName(prefix)));
        const key = `${POOL_KEY_PREFIX}${pool}`;
        const before = await kv.get(key);
        // Compare-and-set: another set-pool of this pool since we read it fails here, not silently.
        let rev: number;
        try {
          rev = before ? await kv.update(key, JSON.stringify(value), before.revision) : await kv.create(key, JSON.stringify(value));
        } catch (err) {
          console.error(`pool ${pool} was changed by someone else meanwhile (${(err as Error).message}); run set-pool again`);
          process.exit(2);
        }
        // Two set-pool runs claiming one model at once both pass the check above. Look again: the
        // pool whose name sorts after the other's (the one the gateways would not give the model)
        // takes its own change back (compare-and-set on its revision), so one claim stands.
        for await (const k of await kv.keys(`${POOL_KEY_PREFIX}>`)) {
          const other = k.slice(POOL_KEY_PREFIX.length);
          if (other === pool) continue;
          const models = await poolModelsAt(kv, k);
          const clash = o.models.filter((m) => models.includes(m));
          if (clash.length === 0) continue;
          const names = clash.map((m) => JSON.stringify(m)).join(", ");
          if (other > pool) {
            console.error(`warning: pool ${JSON.stringify(other)} also lists ${names} (written at the same time): the gateways give ${clash.length > 1 ? "them" : "it"} to pool ${pool}; remove ${clash.length > 1 ? "them" : "it"} from ${other}`);
            continue;
          }
          await (before?.operation === "PUT" ? kv.update(key, before.string(), rev) : kv.delete(key, { previousSeq: rev })).catch(() => undefined);
          console.error(`${names} claimed by pool ${JSON.stringify(other)} at the same time: pool ${pool} left as it was`);
          process.exit(2);
        }
        console.log(`stored pool ${pool}: ${o.models.length} model${o.models.length === 1 ? "" : "s"} (revision ${rev})`);
      } finally {
        await nc.close();
      }
    });
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
  addNamespaceOptions(cfg.command("get-limits").description("print the per-user limits")).action(async (o: NamespaceOptionValues) => {
    const e = await withBucket(o, (kv) => kv.get(RATE_LIMITS_KEY));
    if (e?.operation !== "PUT") {
      console.error("no limits set");
      process.exit(1);
    }
    console.log(JSON.stringify(e.json(), null, 2));
  });
  addNamespaceOptions(cfg.command("add-key").description("create an API key for a user; prints the key once (only its SHA-256 is stored)"))
    .requiredOption("--user <user>", "the user the key authenticates (rate limits and fairness count against this user)")
    .option("--name <name>", "a label, e.g. what the key is for")
    .option("--admin", "an operator key: also opens the gateways' /debug/* endpoints under --auth required")
    .option("--json", "print {key, hash, user, name, createdAt, admin} as one JSON line")
    .action(async (o: NamespaceOptionValues & { user: string; name?: string; admin?: boolean; json?: boolean }) => {
      // `admin` only when set: a plain key's record stays as it was before the field existed.
      const record: ApiKeyRecord = { user: o.user, ...(o.name !== undefined ? { name: o.name } : {}), createdAt: Date.now(), ...(o.admin ? { admin: true } : {}) };
      const err = apiKeyRecordError(record);
      if (err) {
        console.error(`invalid key record: ${err}`);
        process.exit(2);
      }
      const key = generateApiKey();
      const hash = hashApiKey(key);
      // `create` fails rather than overwrite an existing entry.
      await withBucket(o, (kv) => kv.create(apiKeyBucketKey(hash), JSON.stringify(record)));
      if (o.json) console.log(JSON.stringify({ key, hash, ...record }));
      else {
        console.log(key);
        console.error(`created ${o.admin ? "admin " : ""}key ${shortHash(hash)} for user ${o.user}${o.name ? ` (${o.name})` : ""}; this is the only time the key is shown: store it now`);
      }
    });
  addNamespaceOptions(cfg.command("list-keys").description("list API keys: hash prefix, user, name, created, admin, status (never the keys)"))
    .option("--json", "one JSON line per key")
    .action(async (o: NamespaceOptionValues & { json?: boolean }) => {
      const keys = await withBucket(o, readKeys);
      if (o.json) {
        for (const k of keys) console.log(JSON.stringify({ hash: shortHash(k.hash), status: keyStatus(k), ...k.record, ...(k.record ? { admin: k.record.admin === true } : {}) }));
        return;
      }
      const rows = [["HASH", "USER", "NAME", "CREATED", "ADMIN", "STATUS"]];
      for (const k of keys) {
        const r = k.record;
        rows.push([shortHash(k.hash), r?.user ?? "-", r?.name ?? "-", r ? new Date(r.createdAt).toISOString() : "-", r ? (r.admin ? "yes" : "no") : "-", keyStatus(k)]);
      }
      const widths = rows[0]?.map((_, i) => Math.max(...rows.map((row) => (row[i] ?? "").length))) ?? [];
      for (const row of rows) console.log(row.map((c, i) => c.padEnd(widths[i] ?? 0)).join("  ").trimEnd());
    });
  addNamespaceOptions(cfg.command("revoke-key <hash-prefix>").description("revoke an API key, named by a hash prefix from list-keys (or the key itself); every gateway refuses it at once"))
    .action(async (arg: string, o: NamespaceOptionValues) => {
      const target = revokeTarget(arg);
      if ("error" in target) {
        console.error(target.error);
        process.exit(2);
      }
      type Outcome = { kind: "unknown" | "ambiguous"; matches: StoredKey[] } | { kind: "already" | "revoked"; key: StoredKey };
      const outcome = await withBucket(o, async (kv): Promise<Outcome> => {
        const keys = await readKeys(kv);
        const found = resolveHashPrefix(keys.map((k) => k.hash), target.prefix);
        if ("error" in found) return { kind: found.error, matches: keys.filter((k) => found.matches.includes(k.hash)) };
        const k = keys.find((x) => x.hash === found.hash) as StoredKey;
        if (k.record?.disabled) return { kind: "already", key: k };
        // Gateways already refuse a key whose record does not validate; it becomes a valid revoked one.
        const revoked: ApiKeyRecord = { ...(k.record ?? { user: "(invalid record)", createdAt: 0 }), disabled: true, revokedAt: Date.now() };
        // Compare-and-set: a concurrent change to this key fails here instead of being overwritten.
        await kv.update(apiKeyBucketKey(k.hash), JSON.stringify(revoked), k.revision);
        return { kind: "revoked", key: k };
      });
      if ("matches" in outcome && outcome.kind === "unknown") {
        console.error(`no API key hash starts with ${target.prefix} (see \`jetroute config list-keys\`)`);
        return process.exit(1);
      }
      if ("matches" in outcome) {
        console.error(`${target.prefix} matches ${outcome.matches.length} keys; give more digits:`);
        for (const k of outcome.matches) console.error(`  ${shortHash(k.hash)}  ${k.record?.user ?? "-"}  ${k.record?.name ?? "-"}  ${keyStatus(k)}`);
        return process.exit(2);
      }
      const user = outcome.key.record?.user ?? "-";
      console.log(outcome.kind === "already" ? `key ${shortHash(outcome.key.hash)} (user ${user}) was already revoked` : `revoked key ${shortHash(outcome.key.hash)} (user ${user})`);
    });
  addNamespaceOptions(cfg.command("delete <model>").description("remove a model's config")).action(async (model: string, o: NamespaceOptionValues) => {
    await withBucket(o, (kv) => kv.delete(`${MODEL_CONFIG_KEY_PREFIX}${encodeToken(model)}`));
    console.log(`deleted config for ${model}`);
  });
}
