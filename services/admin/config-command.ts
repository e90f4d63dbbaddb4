/**
 * `jetroute config get|set|list|delete`: per-model routing config in the config bucket;
 * `set-limits|get-limits`: per-user rate limits; `add-key|list-keys|revoke-key`: API keys for
 * `gateway --auth required` (config-keys.ts: only their SHA-256 is stored; the key is printed once,
 * at creation); `set-pool|list-pools|delete-pool`: gateway pools' models (config-pools.ts,
 * streams/pools.ts). Each sub-command is registered by its own function, in the order help lists them.
 */
import { readFileSync } from "node:fs";
import type { Command } from "commander";
import { MODEL_CONFIG_KEY_PREFIX, type ModelConfig, RATE_LIMITS_KEY, rateLimitsError } from "../../schemas/config.js";
import { decodeToken, encodeToken } from "../../streams/tokens.js";
import { validateModelConfig } from "../routing/mod.js";
import { addNamespaceOptions, type NamespaceOptionValues, namespaceFlags } from "../shared/cli-options.js";
import { registerAdapterConfigCommands } from "./config-adapters.js";
import { registerAutoscaleCommands } from "./config-autoscale.js";
import { readKnownModels, semanticTargetsError } from "./config-semantic.js";
import { addSigningOption, recordEncoder, type SigningOptionValues, withBucket } from "./config-bucket.js";
import { registerAddKeyCommand, registerListKeysCommand, registerRevokeKeyCommand } from "./config-keys.js";
import { registerDeletePoolCommand, registerListPoolsCommand, registerSetPoolCommand } from "./config-pools.js";

export { validateModelConfig };

export function registerConfigCommand(program: Command): void {
  const cfg = program.command("config").description("per-model routing config (locked strategy, profiles), live on every gateway");
  registerSetCommand(cfg);
  registerGetCommand(cfg);
  registerListCommand(cfg);
  registerSetLimitsCommand(cfg);
  registerSetPoolCommand(cfg);
  registerListPoolsCommand(cfg);
  registerDeletePoolCommand(cfg);
  registerGetLimitsCommand(cfg);
  registerAddKeyCommand(cfg);
  registerListKeysCommand(cfg);
  registerRevokeKeyCommand(cfg);
  registerAutoscaleCommands(cfg);
  registerAdapterConfigCommands(cfg);
  registerDeleteCommand(cfg);
}

const modelConfigKey = (model: string) => `${MODEL_CONFIG_KEY_PREFIX}${encodeToken(model)}`;

function registerSetCommand(cfg: Command): void {
  addSigningOption(addNamespaceOptions(cfg.command("set <model>").description("validate and store a model's config (JSON from --json or --file)")))
    .option("--json <json>", "the config as JSON")
    .option("--file <path>", "a file holding the config as JSON")
    .option("--allow-unknown-models", "a virtual model's decisions may name models the fleet does not serve yet")
    .action(async (model: string, o: NamespaceOptionValues & SigningOptionValues & { json?: string; file?: string; allowUnknownModels?: boolean }) => {
      const encode = recordEncoder(o);
      const text = o.json ?? (o.file ? readFileSync(o.file, "utf8") : undefined);
      if (text === undefined) throw new Error("give the config with --json or --file");
      let value: unknown;
      try {
        value = JSON.parse(text);
      } catch (e) {
        throw new Error(`config is not valid JSON: ${(e as Error).message}`);
      }
      const err = validateModelConfig(value, model);
      if (err) {
        console.error(`invalid config for ${model}: ${err}`);
        process.exit(2);
      }
      const rev = await withBucket(o, async (kv, nats) => {
        const c = value as ModelConfig;
        // A virtual model's targets must be models the fleet serves; a served model may not become virtual under one that targets it.
        if (c.semantic && !o.allowUnknownModels) {
          const targetErr = semanticTargetsError(model, c, await readKnownModels(nats, kv, namespaceFlags(o).prefix, model));
          if (targetErr) {
            console.error(`invalid config for ${model}: ${targetErr}`);
            process.exit(2);
          }
        }
        return kv.put(modelConfigKey(model), encode(modelConfigKey(model), value as object));
      });
      console.log(`stored config for ${model} (revision ${rev})`);
    });
}

function registerGetCommand(cfg: Command): void {
  addNamespaceOptions(cfg.command("get <model>").description("print a model's config")).action(async (model: string, o: NamespaceOptionValues) => {
    const e = await withBucket(o, (kv) => kv.get(modelConfigKey(model)));
    if (e?.operation !== "PUT") {
      console.error(`no config for ${model}`);
      process.exit(1);
    }
    console.log(JSON.stringify(e.json(), null, 2));
  });
}

function registerListCommand(cfg: Command): void {
  addNamespaceOptions(cfg.command("list").description("list configured models")).action(async (o: NamespaceOptionValues) => {
    await withBucket(o, async (kv) => {
      for await (const k of await kv.keys(`${MODEL_CONFIG_KEY_PREFIX}>`)) console.log(decodeToken(k.slice(MODEL_CONFIG_KEY_PREFIX.length)));
    });
  });
}

function registerDeleteCommand(cfg: Command): void {
  addNamespaceOptions(cfg.command("delete <model>").description("remove a model's config")).action(async (model: string, o: NamespaceOptionValues) => {
    await withBucket(o, (kv) => kv.delete(modelConfigKey(model)));
    console.log(`deleted config for ${model}`);
  });
}

function registerSetLimitsCommand(cfg: Command): void {
  addSigningOption(addNamespaceOptions(cfg.command("set-limits").description('validate and store per-user limits: {"users": {"default": {"rpm": 100, "tpm": 100000}, "alice": {"rpm": 10}}}')))
    .requiredOption("--json <json>", "the limits as JSON")
    .action(async (o: NamespaceOptionValues & SigningOptionValues & { json: string }) => {
      const encode = recordEncoder(o);
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
      const rev = await withBucket(o, (kv) => kv.put(RATE_LIMITS_KEY, encode(RATE_LIMITS_KEY, value as object)));
      console.log(`stored limits (revision ${rev})`);
    });
}

function registerGetLimitsCommand(cfg: Command): void {
  addNamespaceOptions(cfg.command("get-limits").description("print the per-user limits")).action(async (o: NamespaceOptionValues) => {
    const e = await withBucket(o, (kv) => kv.get(RATE_LIMITS_KEY));
    if (e?.operation !== "PUT") {
      console.error("no limits set");
      process.exit(1);
    }
    console.log(JSON.stringify(e.json(), null, 2));
  });
}
