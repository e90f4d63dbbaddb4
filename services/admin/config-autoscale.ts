/**
 * `jetroute config set-autoscale|get-autoscale|list-autoscale|delete-autoscale`: autoscaling
 * policies in the config bucket (`autoscale.<name>`), validated before they are stored; every
 * autoscaler picks a change up at once (docs/autoscaling.md).
 */
import { readFileSync } from "node:fs";
import type { Command } from "commander";
import { AUTOSCALE_KEY_PREFIX, autoscalePolicyError } from "../../schemas/autoscale.js";
import { decodeToken, encodeToken } from "../../streams/tokens.js";
import { addNamespaceOptions, type NamespaceOptionValues } from "../shared/cli-options.js";
import { addSigningOption, recordEncoder, type SigningOptionValues, withBucket } from "./config-bucket.js";

const POLICY_NAME = /^[A-Za-z0-9._-]{1,128}$/;
const policyKey = (name: string) => `${AUTOSCALE_KEY_PREFIX}${encodeToken(name)}`;

function checkName(name: string): void {
  if (!POLICY_NAME.test(name)) {
    console.error(`invalid policy name ${JSON.stringify(name.slice(0, 64))}: 1-128 characters of A-Z a-z 0-9 . _ -`);
    process.exit(2);
  }
}

export function registerAutoscaleCommands(cfg: Command): void {
  addSigningOption(addNamespaceOptions(cfg.command("set-autoscale <name>").description("validate and store an autoscaling policy (JSON from --json or --file)")))
    .option("--json <json>", "the policy as JSON")
    .option("--file <path>", "a file holding the policy as JSON")
    .action(async (name: string, o: NamespaceOptionValues & SigningOptionValues & { json?: string; file?: string }) => {
      checkName(name);
      const text = o.json ?? (o.file ? readFileSync(o.file, "utf8") : undefined);
      if (text === undefined) throw new Error("give the policy with --json or --file");
      let value: unknown;
      try {
        value = JSON.parse(text);
      } catch (e) {
        console.error(`policy is not valid JSON: ${(e as Error).message}`);
        process.exit(2);
      }
      const err = autoscalePolicyError(value);
      if (err) {
        console.error(`invalid autoscaling policy ${name}: ${err}`);
        process.exit(2);
      }
      const encode = recordEncoder(o);
      const rev = await withBucket(o, (kv) => kv.put(policyKey(name), encode(policyKey(name), value as object)));
      console.log(`stored autoscaling policy ${name} (revision ${rev})`);
    });
  addNamespaceOptions(cfg.command("get-autoscale <name>").description("print an autoscaling policy")).action(async (name: string, o: NamespaceOptionValues) => {
    checkName(name);
    const e = await withBucket(o, (kv) => kv.get(policyKey(name)));
    if (e?.operation !== "PUT") {
      console.error(`no autoscaling policy ${name}`);
      process.exit(1);
    }
    console.log(JSON.stringify(e.json(), null, 2));
  });
  addNamespaceOptions(cfg.command("list-autoscale").description("list autoscaling policies")).action(async (o: NamespaceOptionValues) => {
    await withBucket(o, async (kv) => {
      for await (const k of await kv.keys(`${AUTOSCALE_KEY_PREFIX}>`)) console.log(decodeToken(k.slice(AUTOSCALE_KEY_PREFIX.length)));
    });
  });
  addNamespaceOptions(cfg.command("delete-autoscale <name>").description("delete an autoscaling policy (autoscalers stop evaluating it)")).action(async (name: string, o: NamespaceOptionValues) => {
    checkName(name);
    await withBucket(o, (kv) => kv.delete(policyKey(name)));
    console.log(`deleted autoscaling policy ${name}`);
  });
}
