/**
 * The config bucket as the `jetroute config` sub-commands open it: one NATS connection per
 * command, and a clear message (what to run) when nothing has created the bucket yet.
 */
import { Kvm } from "@nats-io/kv";
import type { Command } from "commander";
import { configBucketName } from "../../streams/definitions.js";
import { isStreamNotFound } from "../../streams/errors.js";
import { configRecordSubject, SIGNATURE_FIELD } from "../../streams/signatures.js";
import { DEFAULT_PREFIX, type NamespaceOptionValues, namespaceFlags } from "../shared/cli-options.js";
import { connectNats } from "../shared/nats.js";
import { readSigner, SIGNING_KEY_ENV } from "../shared/signing-keys.js";

export type Bucket = Awaited<ReturnType<Kvm["open"]>>;
export type Nats = Awaited<ReturnType<typeof connectNats>>;

/** The config bucket, or undefined if nothing has created it yet (`streams apply`, `set-pool`). */
export async function openConfigBucket({ nc, jsm }: Nats, prefix: string): Promise<Bucket | undefined> {
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

/** Runs `fn` on the config bucket of the namespace the flags name, then closes the connection. */
export async function withBucket<T>(o: NamespaceOptionValues, fn: (kv: Bucket, nats: Nats) => Promise<T>): Promise<T> {
  const { nats: urls, prefix } = namespaceFlags(o);
  const nats = await connectNats(urls, "jetroute-config");
  try {
    const kv = await openConfigBucket(nats, prefix);
    if (!kv) throw new Error(`the config bucket ${configBucketName(prefix)} does not exist: run \`jetroute streams apply${prefix === DEFAULT_PREFIX ? "" : ` --prefix ${prefix}`}\` first`);
    return await fn(kv, nats);
  } finally {
    await nats.nc.close();
  }
}

export interface SigningOptionValues {
  signingKey?: string;
}

/** `--signing-key` on a command that writes config entries (signed records, docs/security.md). */
export function addSigningOption<C extends Command>(cmd: C): C {
  return cmd.option("--signing-key <file>", `PEM Ed25519 private key to sign the entry with, for gateways started with --config-public-key (default: $${SIGNING_KEY_ENV}, a PEM or a file; neither = unsigned)`);
}

/**
 * The JSON to store for a record under `key` of the namespace's config bucket: signed when a
 * signing key is given (flag or environment), else without any `sig` (a copied one would only
 * fail to verify). Reads the key at once: a bad key file fails before anything is written.
 */
export function recordEncoder(o: NamespaceOptionValues & SigningOptionValues, clock: () => number = Date.now): (key: string, record: object) => string {
  const signer = readSigner(o.signingKey);
  const bucket = configBucketName(namespaceFlags(o).prefix);
  return (key, record) => {
    if (signer) return JSON.stringify(signer.sign(configRecordSubject(bucket, key), record, clock()));
    const { [SIGNATURE_FIELD]: _, ...rest } = record as Record<string, unknown>;
    return JSON.stringify(rest);
  };
}
