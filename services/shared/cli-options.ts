/** Flag parsers shared by every sub-command: they fail with a message naming the flag. */
import { type Command, InvalidArgumentError, Option } from "commander";
import { poolConfigError } from "../../schemas/config.js";
import { type Namespace, namespaceOf, poolNameError } from "../../streams/pools.js";
import { podAddressFilter } from "./cidr.js";
import { DEAD_LETTER_DEFAULTS, setDeadLetterPolicy } from "./dead-letter.js";
import { redactNatsUrl } from "./nats.js";
import { DEFAULT_PREFIX } from "../../streams/subjects.js";

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

/** The prefix every command defaults to (declared with the subjects). */
export { DEFAULT_PREFIX };

/**
 * Adds the options of every command that talks to jetroute's streams: `--nats`, `--prefix` and,
 * when `pool` gives its help text (what a pool means to this command), `--pool`. Read them back
 * with `namespaceFlags`.
 */
export function addNamespaceOptions<C extends Command>(cmd: C, o: { pool?: string } = {}): C {
  cmd.addOption(natsOption()).option("--prefix <prefix>", "subject prefix", DEFAULT_PREFIX);
  if (o.pool !== undefined) cmd.addOption(poolOption(o.pool));
  return cmd;
}

/** What `addNamespaceOptions`' flags resolve to. */
export interface NamespaceFlags {
  /** `--nats`: server URLs. */
  nats: string[];
  /** `--prefix` as given: the base prefix (the config bucket and usage summaries stay under it). */
  prefix: string;
  /** `--pool`, when given. */
  pool?: string;
  /** Where the process reads and writes: the base namespace, or the pool's `<prefix>.pool.<name>`. */
  namespace: Namespace;
}

/** The values commander gives an action for `addNamespaceOptions`' flags. */
export interface NamespaceOptionValues {
  nats: string[];
  prefix: string;
  pool?: string;
}

/** Resolves an action's `--nats`, `--prefix` and `--pool` once. */
export function namespaceFlags(o: NamespaceOptionValues): NamespaceFlags {
  return { nats: o.nats, prefix: o.prefix, ...(o.pool !== undefined ? { pool: o.pool } : {}), namespace: namespaceOf(o.prefix, o.pool) };
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

/** `--pod-cidrs 10.0.0.0/8,fd00::/8`: pod networks allowed; checked at once, naming a bad range. */
export const podCidrsOption = (value: string): string[] => {
  const cidrs = value.split(",").map((s) => s.trim()).filter(Boolean);
  if (cidrs.length === 0) throw new InvalidArgumentError("expected at least one CIDR range");
  try {
    podAddressFilter(cidrs);
  } catch (err) {
    throw new InvalidArgumentError((err as Error).message.replace(/^--pod-cidrs: /, ""));
  }
  return cidrs;
};

/**
 * `--dlq-payloads [bytes]`, on every process that dead-letters: keep each dead letter's payload (its
 * first `bytes`, default 256 KiB) instead of its envelope only. Apply it with `applyDlqPayloads`.
 */
export function dlqPayloadsOption(): Option {
  const d = DEAD_LETTER_DEFAULTS.maxPayloadBytes;
  return new Option(
    "--dlq-payloads [bytes]",
    `dead letters keep the payload (its first <bytes>, default ${d}) for debugging; off: the envelope only (origin, reason, size, digest), since payloads may hold prompt token ids`,
  )
    .preset(String(d))
    .argParser(intOption(1, DEAD_LETTER_DEFAULTS.maxPayloadBytesLimit));
}

/** Sets this process's dead-letter policy from `--dlq-payloads` (undefined: not given). */
export function applyDlqPayloads(bytes: number | undefined): void {
  setDeadLetterPolicy({ keepPayloads: bytes !== undefined, maxPayloadBytes: bytes ?? DEAD_LETTER_DEFAULTS.maxPayloadBytes });
}
