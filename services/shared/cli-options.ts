/** Flag parsers shared by every sub-command: they fail with a message naming the flag. */
import { InvalidArgumentError, Option } from "commander";
import { poolConfigError } from "../../schemas/config.js";
import { poolNameError } from "../../streams/pools.js";
import { redactNatsUrl } from "./nats.js";

export function intOption(min: number, max = Number.MAX_SAFE_INTEGER) {
  return (value: string): number => {
    const n = Number(value);
    if (!Number.isInteger(n) || n < min || n > max) throw new InvalidArgumentError(`expected an integer in [${min}, ${max}], got ${JSON.stringify(value)}`);
    return n;
  };
}

export function floatOption(minExclusive: number) {
  return (value: string): number => {
    const n = Number(value);
    if (!Number.isFinite(n) || n <= minExclusive) throw new InvalidArgumentError(`expected a number > ${minExclusive}, got ${JSON.stringify(value)}`);
    return n;
  };
}

export const natsUrlsOption = (value: string): string[] => value.split(",").map((s) => s.trim()).filter(Boolean);

export const DEFAULT_NATS = process.env.NATS_URL ?? "nats://127.0.0.1:4222";

/** `--nats <urls>`, defaulting to `$NATS_URL`; `--help` shows the default without its credentials. */
export function natsOption(): Option {
  const urls = natsUrlsOption(DEFAULT_NATS);
  return new Option("--nats <urls>", "NATS server URL(s), comma separated").argParser(natsUrlsOption).default(urls, urls.map(redactNatsUrl).join(","));
}

/** Resolves on SIGINT/SIGTERM, after which the caller shuts down cleanly. */
export function untilSignal(): Promise<NodeJS.Signals> {
  return new Promise((resolve) => {
    process.once("SIGINT", () => resolve("SIGINT"));
    process.once("SIGTERM", () => resolve("SIGTERM"));
  });
}

/** `--pool <name>`: gateway pools (streams/pools.ts); the process works in the pool's namespace under `--prefix`. */
export function poolOption(what = "work in this gateway pool's namespace (its own streams under <prefix>.pool.<name>; the config bucket stays shared)"): Option {
  return new Option("--pool <name>", what).argParser((v: string) => {
    const err = poolNameError(v);
    if (err) throw new InvalidArgumentError(err);
    return v;
  });
}

/** `--models a,b`: a comma-separated list of model names. */
export const modelListOption = (value: string): string[] => {
  const models = value.split(",").map((s) => s.trim()).filter(Boolean);
  if (models.length === 0) throw new InvalidArgumentError("expected at least one model name");
  // The bounds of a pool entry (schemas/config.ts): at most 2,000 distinct names of 1-256 characters.
  const err = poolConfigError({ models });
  if (err) throw new InvalidArgumentError(`invalid model list: ${err}`);
  return models;
};
