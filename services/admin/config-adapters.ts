/**
 * `jetroute config set-adapter|get-adapter|list-adapters|delete-adapter`: LoRA adapters declared
 * in the config bucket (`adapter.<name>`) for fleets without Kubernetes — the same declaration as
 * a ModelAdapter's `spec` (schemas/adapters.ts), validated field by field before it is stored;
 * `jetroute adapter-controller` places it at once (docs/adapters.md).
 */
import { readFileSync } from "node:fs";
import type { Command } from "commander";
import { ADAPTER_KEY_PREFIX, adapterNameError, adapterSpecError } from "../../schemas/adapters.js";
import { decodeToken, encodeToken } from "../../streams/tokens.js";
import { addNamespaceOptions, type NamespaceOptionValues, namespaceFlags } from "../shared/cli-options.js";
import { addSigningOption, recordEncoder, type SigningOptionValues, withBucket } from "./config-bucket.js";
import { readPodModels } from "./config-semantic.js";

export const adapterKey = (name: string): string => `${ADAPTER_KEY_PREFIX}${encodeToken(name)}`;

function checkName(name: string): void {
  const err = adapterNameError(name);
  if (err) {
    console.error(err);
    process.exit(2);
  }
}

/** The spec given on the command line: a bare spec, or a whole ModelAdapter object (its `spec`). */
export function specOf(value: unknown): unknown {
  const v = value as { kind?: unknown; spec?: unknown } | null;
  return v && typeof v === "object" && v.kind === "ModelAdapter" ? v.spec : value;
}

export function registerAdapterConfigCommands(cfg: Command): void {
  addSigningOption(addNamespaceOptions(cfg.command("set-adapter <name>").description("declare a LoRA adapter (a ModelAdapter spec as JSON from --json or --file): baseModel, artifactURL, podSelector, replicas")))
    .option("--json <json>", "the adapter's spec as JSON (or a whole ModelAdapter object)")
    .option("--file <path>", "a file holding it as JSON")
    .action(async (name: string, o: NamespaceOptionValues & SigningOptionValues & { json?: string; file?: string }) => {
      checkName(name);
      const text = o.json ?? (o.file ? readFileSync(o.file, "utf8") : undefined);
      if (text === undefined) {
        console.error("give the adapter's spec with --json or --file");
        process.exit(2);
      }
      let value: unknown;
      try {
        value = specOf(JSON.parse(text));
      } catch (e) {
        console.error(`the adapter's spec is not valid JSON: ${(e as Error).message}`);
        process.exit(2);
      }
      const err = adapterSpecError(value);
      if (err) {
        console.error(`invalid adapter ${name}: ${err}`);
        process.exit(2);
      }
      // Named like a model pods serve: gateways and the controller refuse it (it would take that model's traffic).
      if ((value as { baseModel?: unknown }).baseModel === name) {
        console.error(`invalid adapter ${name}: its name is its own baseModel; an adapter may not be named like a base model`);
        process.exit(2);
      }
      const encode = recordEncoder(o);
      const rev = await withBucket(o, async (kv, nats) => {
        if ((await readPodModels(nats, namespaceFlags(o).prefix)).has(name)) return undefined;
        return kv.put(adapterKey(name), encode(adapterKey(name), value as object));
      });
      if (rev === undefined) {
        console.error(`invalid adapter ${name}: pods serve a base model of that name (PODS); an adapter named like it would take that model's traffic, so gateways and the adapter controller refuse it: choose another name`);
        process.exit(2);
      }
      console.log(`stored adapter ${name} (revision ${rev})`);
    });
  addNamespaceOptions(cfg.command("get-adapter <name>").description("print a declared LoRA adapter's spec")).action(async (name: string, o: NamespaceOptionValues) => {
    checkName(name);
    const e = await withBucket(o, (kv) => kv.get(adapterKey(name)));
    if (e?.operation !== "PUT") {
      console.error(`no adapter ${name} in the config bucket`);
      process.exit(1);
    }
    console.log(JSON.stringify(e.json(), null, 2));
  });
  addNamespaceOptions(cfg.command("list-adapters").description("list the LoRA adapters declared in the config bucket")).action(async (o: NamespaceOptionValues) => {
    await withBucket(o, async (kv) => {
      for await (const k of await kv.keys(`${ADAPTER_KEY_PREFIX}>`)) console.log(decodeToken(k.slice(ADAPTER_KEY_PREFIX.length)));
    });
  });
  addNamespaceOptions(cfg.command("delete-adapter <name>").description("delete a declared LoRA adapter (the controller unloads it everywhere)")).action(async (name: string, o: NamespaceOptionValues) => {
    checkName(name);
    await withBucket(o, (kv) => kv.delete(adapterKey(name)));
    console.log(`deleted adapter ${name}`);
  });
}
