/** `jetroute config get|set|list|delete`: per-model routing config in the config bucket. */
import { readFileSync } from "node:fs";
import { Kvm } from "@nats-io/kv";
import type { Command } from "commander";
import { MODEL_CONFIG_KEY_PREFIX, modelConfigError, RATE_LIMITS_KEY, rateLimitsError } from "../../schemas/config.js";
import { configBucketName } from "../../streams/definitions.js";
import { decodeToken, encodeToken } from "../../streams/tokens.js";
import { parseStrategy } from "../gateway/strategies/registry.js";
import { DEFAULT_NATS, natsUrlsOption } from "../shared/cli-options.js";
import { connectNats } from "../shared/nats.js";

/** Checks a config beyond its schema: every strategy it names must parse. */
export function validateModelConfig(value: unknown): string | undefined {
  const err = modelConfigError(value);
  if (err) return err;
  const c = value as { lockedRoutingStrategy?: string; profiles?: Record<string, { routingStrategy?: string }> };
  const specs: Array<[string, string | undefined]> = [["/lockedRoutingStrategy", c.lockedRoutingStrategy], ...Object.entries(c.profiles ?? {}).map(([n, p]) => [`/profiles/${n}/routingStrategy`, p.routingStrategy] as [string, string | undefined])];
  for (const [where, spec] of specs) {
    if (!spec) continue;
    try {
      parseStrategy(spec);
    } catch (e) {
      return `${where}: ${(e as Error).message}`;
    }
  }
  return undefined;
}

async function withBucket<T>(o: { nats: string[]; prefix: string }, fn: (kv: Awaited<ReturnType<Kvm["open"]>>) => Promise<T>): Promise<T> {
  const { nc } = await connectNats(o.nats, "jetroute-config");
  try {
    return await fn(await new Kvm(nc).open(configBucketName(o.prefix)));
  } finally {
    await nc.close();
  }
}

export function registerConfigCommand(program: Command): void {
  const cfg = program.command("config").description("per-model routing config (locked strategy, profiles), live on every gateway");
  const common = (c: Command) =>
    c.option("--nats <urls>", "NATS server URL(s), comma separated", natsUrlsOption, [DEFAULT_NATS]).option("--prefix <prefix>", "subject prefix", "jr");
  common(cfg.command("set <model>").description("validate and store a model's config (JSON from --json or --file)"))
    .option("--json <json>", "the config as JSON")
    .option("--file <path>", "a file holding the config as JSON")
    .action(async (model: string, o: { nats: string[]; prefix: string; json?: string; file?: string }) => {
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
  common(cfg.command("get <model>").description("print a model's config")).action(async (model: string, o: { nats: string[]; prefix: string }) => {
    const e = await withBucket(o, (kv) => kv.get(`${MODEL_CONFIG_KEY_PREFIX}${encodeToken(model)}`));
    if (e?.operation !== "PUT") {
      console.error(`no config for ${model}`);
      process.exit(1);
    }
    console.log(JSON.stringify(e.json(), null, 2));
  });
  common(cfg.command("list").description("list configured models")).action(async (o: { nats: string[]; prefix: string }) => {
    await withBucket(o, async (kv) => {
      for await (const k of await kv.keys(`${MODEL_CONFIG_KEY_PREFIX}>`)) console.log(decodeToken(k.slice(MODEL_CONFIG_KEY_PREFIX.length)));
    });
  });
  common(cfg.command("set-limits").description('validate and store per-user limits: {"users": {"default": {"rpm": 100, "tpm": 100000}, "alice": {"rpm": 10}}}'))
    .requiredOption("--json <json>", "the limits as JSON")
    .action(async (o: { nats: string[]; prefix: string; json: string }) => {
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
  common(cfg.command("get-limits").description("print the per-user limits")).action(async (o: { nats: string[]; prefix: string }) => {
    const e = await withBucket(o, (kv) => kv.get(RATE_LIMITS_KEY));
    if (e?.operation !== "PUT") {
      console.error("no limits set");
      process.exit(1);
    }
    console.log(JSON.stringify(e.json(), null, 2));
  });
  common(cfg.command("delete <model>").description("remove a model's config")).action(async (model: string, o: { nats: string[]; prefix: string }) => {
    await withBucket(o, (kv) => kv.delete(`${MODEL_CONFIG_KEY_PREFIX}${encodeToken(model)}`));
    console.log(`deleted config for ${model}`);
  });
}
