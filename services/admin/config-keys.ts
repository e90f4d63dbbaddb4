/**
 * `jetroute config add-key|list-keys|revoke-key`: API keys for `gateway --auth required`. Only a
 * key's SHA-256 is stored (config key `apikey.<hash>`); the key itself is printed once, at creation.
 */
import type { Command } from "commander";
import { API_KEY_KEY_PREFIX, type ApiKeyRecord, apiKeyRecordError } from "../../schemas/config.js";
import { apiKeyBucketKey, generateApiKey, hashApiKey, hashOfBucketKey, resolveHashPrefix, revokeTarget, SHOWN_HASH_PREFIX } from "../gateway/auth.js";
import { addNamespaceOptions, type NamespaceOptionValues } from "../shared/cli-options.js";
import { addSigningOption, type Bucket, recordEncoder, type SigningOptionValues, withBucket } from "./config-bucket.js";

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

type AddKeyOptions = NamespaceOptionValues & SigningOptionValues & { user: string; name?: string; admin?: boolean; objective?: string; cacheSalt?: string; class?: string; models?: string; delegate?: boolean; json?: boolean };

export function registerAddKeyCommand(cfg: Command): void {
  addSigningOption(addNamespaceOptions(cfg.command("add-key").description("create an API key for a user; prints the key once (only its SHA-256 is stored)")))
    .requiredOption("--user <user>", "the user the key authenticates (rate limits and fairness count against this user)")
    .option("--name <name>", "a label, e.g. what the key is for")
    .option("--admin", "an operator key: also opens the gateways' /debug/* endpoints under --auth required")
    .option("--objective <name>", "flow control: the highest objective (priority class) this key's requests may run under, and their default; a header naming a higher one runs at this one, and on a model without it the model's default objective is the cap (docs/flow-control.md)")
    .option("--cache-salt <salt>", "the tenant's cache salt: its requests share cached prompt blocks only with keys of the same salt (16-128 of A-Z a-z 0-9 _ -, random, e.g. $(openssl rand -hex 16))")
    .option("--class <name>", "the key's class: virtual models' `user` signals may test it (docs/semantic.md)")
    .option("--models <list>", "comma-separated models the key may use, also when a virtual model chose them (default: every model)")
    .option("--delegate", "a service key (the batch-worker's) that may send x-jetroute-on-behalf-of: <sha256 of another key>, so its requests run under that key's user, models, objective, cache salt and class (docs/batch.md, Tenancy)")
    .option("--json", "print {key, hash, user, name, createdAt, admin, cacheSalt} as one JSON line")
    .action(addKey);
}

async function addKey(o: AddKeyOptions): Promise<void> {
  // `admin` only when set: a plain key's record stays as it was before the field existed.
  const record: ApiKeyRecord = {
    user: o.user,
    ...(o.name !== undefined ? { name: o.name } : {}),
    createdAt: Date.now(),
    ...(o.admin ? { admin: true } : {}),
    ...(o.delegate ? { delegate: true } : {}),
    ...(o.objective !== undefined ? { objective: o.objective } : {}),
    ...(o.cacheSalt !== undefined ? { cacheSalt: o.cacheSalt } : {}),
    ...(o.class !== undefined ? { class: o.class } : {}),
    ...(o.models !== undefined ? { models: o.models.split(",").map((m) => m.trim()).filter(Boolean) } : {}),
  };
  const err = apiKeyRecordError(record);
  if (err) {
    console.error(`invalid key record: ${err}`);
    process.exit(2);
  }
  const encode = recordEncoder(o);
  const key = generateApiKey();
  const hash = hashApiKey(key);
  // `create` fails rather than overwrite an existing entry.
  await withBucket(o, (kv) => kv.create(apiKeyBucketKey(hash), encode(apiKeyBucketKey(hash), record)));
  if (o.json) console.log(JSON.stringify({ key, hash, ...record }));
  else {
    console.log(key);
    console.error(`created ${o.admin ? "admin " : ""}${o.delegate ? "delegate " : ""}key ${shortHash(hash)} for user ${o.user}${o.name ? ` (${o.name})` : ""}${o.cacheSalt ? " with a cache salt" : ""}; this is the only time the key is shown: store it now`);
  }
}

export function registerListKeysCommand(cfg: Command): void {
  addNamespaceOptions(cfg.command("list-keys").description("list API keys: hash prefix, user, name, created, admin, cache salt, status (never the keys)"))
    .option("--json", "one JSON line per key")
    .action(async (o: NamespaceOptionValues & { json?: boolean }) => {
      const keys = await withBucket(o, readKeys);
      for (const line of o.json ? keys.map(keyJsonLine) : keyTable(keys)) console.log(line);
    });
}

/** One key as list-keys --json prints it. */
function keyJsonLine(k: StoredKey): string {
  return JSON.stringify({ hash: shortHash(k.hash), status: keyStatus(k), ...k.record, ...(k.record ? { admin: k.record.admin === true } : {}) });
}

/** The keys as list-keys prints them: a header and one row per key, in aligned columns. */
function keyTable(keys: StoredKey[]): string[] {
  const rows = [["HASH", "USER", "NAME", "CREATED", "ADMIN", "CACHE SALT", "STATUS"]];
  for (const k of keys) {
    const r = k.record;
    // Enough of the salt to tell which keys share one.
    const salt = r?.cacheSalt ? `${r.cacheSalt.slice(0, 8)}…` : "-";
    rows.push([shortHash(k.hash), r?.user ?? "-", r?.name ?? "-", r ? new Date(r.createdAt).toISOString() : "-", r ? (r.admin ? "yes" : "no") : "-", salt, keyStatus(k)]);
  }
  const widths = rows[0]?.map((_, i) => Math.max(...rows.map((row) => (row[i] ?? "").length))) ?? [];
  return rows.map((row) => row.map((c, i) => c.padEnd(widths[i] ?? 0)).join("  ").trimEnd());
}

export function registerRevokeKeyCommand(cfg: Command): void {
  addSigningOption(addNamespaceOptions(cfg.command("revoke-key <hash-prefix>").description("revoke an API key, named by a hash prefix from list-keys (or the key itself); every gateway refuses it at once")))
    .action(revokeKey);
}

type RevokeOutcome = { kind: "unknown" | "ambiguous"; matches: StoredKey[] } | { kind: "already" | "revoked"; key: StoredKey };

async function revokeKey(arg: string, o: NamespaceOptionValues & SigningOptionValues): Promise<void> {
  const target = revokeTarget(arg);
  if ("error" in target) {
    console.error(target.error);
    process.exit(2);
  }
  const encode = recordEncoder(o);
  const outcome = await withBucket(o, (kv) => revokeByPrefix(kv, target.prefix, encode));
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
}

/** Revokes the one key whose hash starts with `prefix`, unless none or several do, or it already is. */
async function revokeByPrefix(kv: Bucket, prefix: string, encode: ReturnType<typeof recordEncoder>): Promise<RevokeOutcome> {
  const keys = await readKeys(kv);
  const found = resolveHashPrefix(keys.map((k) => k.hash), prefix);
  if ("error" in found) return { kind: found.error, matches: keys.filter((k) => found.matches.includes(k.hash)) };
  const k = keys.find((x) => x.hash === found.hash) as StoredKey;
  if (k.record?.disabled) return { kind: "already", key: k };
  // Gateways already refuse a key whose record does not validate; it becomes a valid revoked one.
  const revoked: ApiKeyRecord = { ...(k.record ?? { user: "(invalid record)", createdAt: 0 }), disabled: true, revokedAt: Date.now() };
  // Compare-and-set: a concurrent change to this key fails here instead of being overwritten.
  await kv.update(apiKeyBucketKey(k.hash), encode(apiKeyBucketKey(k.hash), revoked), k.revision);
  return { kind: "revoked", key: k };
}
