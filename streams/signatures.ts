/**
 * Signed records: the records that grant power (config bucket entries — API keys, rate limits,
 * pools, model configs — and PODS events) carry an Ed25519 signature in the field `sig`, made by
 * the operator's key (`jetroute config … --signing-key`) or a pod-watcher's, and gateways started
 * with the public keys act only on records that verify. NATS permissions say who may publish on a
 * subject, but a push consumer's deliver subject is not checked against them
 * (nats-io/nats-server#8274): a process that may create a consumer on a stream it also writes
 * can copy its own message onto `$KV.<config bucket>.apikey.<hash>` or a pod subject. Such a copy
 * has no valid signature. Pure: node:crypto only.
 *
 * What is signed: the subject the record is stored under (so a signed record cannot be moved to
 * another key, pod or namespace), the signing time and the record's canonical JSON without `sig`.
 * A verifier also refuses a record stored (broker time) more than SIGNATURE_MAX_SKEW_MS from its
 * signing time, which turns away an old signed record copied back later (a revoked key's earlier,
 * active record) unless the copy lands within that window.
 */
import { createHash, createPrivateKey, createPublicKey, generateKeyPairSync, type KeyObject, sign, verify } from "node:crypto";
import { RecordSignature } from "../schemas/signature.js";
import { TypeCompiler } from "@sinclair/typebox/compiler";

/** The field a signed record carries its signature in. */
export const SIGNATURE_FIELD = "sig";
/** How far (either way) a record's signing time may be from its broker timestamp: clock skew and publish retries. */
export const SIGNATURE_MAX_SKEW_MS = 5 * 60_000;
const DOMAIN = "jetroute-record-v1";

/** Why a verifier refused a record. */
export type SignatureRefusal = "unsigned" | "malformed" | "unknown-key" | "bad-signature" | "out-of-window";
export const SIGNATURE_REFUSALS: readonly SignatureRefusal[] = ["unsigned", "malformed", "unknown-key", "bad-signature", "out-of-window"];

/** The subject a config bucket entry is stored under, which its signature covers. */
export function configRecordSubject(bucket: string, key: string): string {
  return `$KV.${bucket}.${key}`;
}

/**
 * JSON with every object's keys sorted (code unit order), no whitespace; `undefined` members left
 * out as JSON.stringify does. The parsed copy of a record canonicalises to the same string as the
 * object it was serialised from.
 */
export function canonicalJson(v: unknown): string {
  if (v === null || typeof v !== "object") return JSON.stringify(v) ?? "null";
  if (Array.isArray(v)) return `[${v.map((x) => (x === undefined ? "null" : canonicalJson(x))).join(",")}]`;
  const o = v as Record<string, unknown>;
  const keys = Object.keys(o)
    .filter((k) => o[k] !== undefined)
    .sort();
  return `{${keys.map((k) => `${JSON.stringify(k)}:${canonicalJson(o[k])}`).join(",")}}`;
}

/** The bytes a signature covers. */
export function signedBytes(subject: string, key: string, at: number, record: object): Buffer {
  return Buffer.from(`${DOMAIN}\n${subject}\n${key}\n${at}\n${canonicalJson(withoutSignature(record))}`, "utf8");
}

function withoutSignature(record: object): Record<string, unknown> {
  const { [SIGNATURE_FIELD]: _, ...rest } = record as Record<string, unknown>;
  return rest;
}

/** A key's id: the first 16 hex digits of the SHA-256 of its public key (SPKI DER). */
export function keyIdOf(key: KeyObject): string {
  const pub = key.type === "private" ? createPublicKey(key) : key;
  return createHash("sha256")
    .update(pub.export({ type: "spki", format: "der" }))
    .digest("hex")
    .slice(0, 16);
}

export class SigningKeyError extends Error {
  override name = "SigningKeyError";
}

/** A PEM key read with `create`, refused with a SigningKeyError unless it is a well-formed Ed25519 key. */
function ed25519Key(create: (pem: string) => KeyObject, pem: string, kind: "private" | "public"): KeyObject {
  let key: KeyObject;
  try {
    key = create(pem);
  } catch (err) {
    throw new SigningKeyError(`not a PEM ${kind} key (${(err as Error).message})`);
  }
  if (key.asymmetricKeyType !== "ed25519") throw new SigningKeyError(`an Ed25519 key is needed, got ${key.asymmetricKeyType ?? "an unknown type"}`);
  return key;
}

/** Signs records with one Ed25519 private key (PEM, PKCS#8). */
export class RecordSigner {
  private readonly key: KeyObject;
  readonly keyId: string;

  constructor(privateKeyPem: string) {
    this.key = ed25519Key(createPrivateKey, privateKeyPem, "private");
    this.keyId = keyIdOf(this.key);
  }

  /** The record with `sig` set (any previous one replaced), for storing under `subject`. */
  sign<T extends object>(subject: string, record: T, at: number): T & { sig: RecordSignature } {
    const rest = withoutSignature(record);
    const t = Math.max(0, Math.floor(at));
    const ed25519 = sign(null, signedBytes(subject, this.keyId, t, rest), this.key).toString("base64url");
    return { ...rest, [SIGNATURE_FIELD]: { key: this.keyId, at: t, ed25519 } } as T & { sig: RecordSignature };
  }
}

const checkSignature = TypeCompiler.Compile(RecordSignature);

/** Verifies records against a set of Ed25519 public keys (any of them may have signed). */
export class RecordVerifier {
  private readonly keys = new Map<string, KeyObject>();

  /** `publicKeysPem`: one or more PEM public keys (SPKI), concatenated. */
  constructor(publicKeysPem: string, readonly maxSkewMs = SIGNATURE_MAX_SKEW_MS) {
    const blocks = publicKeysPem.match(/-----BEGIN PUBLIC KEY-----[\s\S]*?-----END PUBLIC KEY-----/g) ?? [];
    if (blocks.length === 0) throw new SigningKeyError("no PEM public key (-----BEGIN PUBLIC KEY-----) found");
    for (const b of blocks) {
      const key = ed25519Key(createPublicKey, b, "public");
      this.keys.set(keyIdOf(key), key);
    }
  }

  get keyIds(): string[] {
    return [...this.keys.keys()];
  }

  /**
   * Why `record`, stored under `subject` at broker time `storedAt` (ms), is not to be acted on;
   * undefined when it verifies.
   */
  refusal(subject: string, record: unknown, storedAt: number): SignatureRefusal | undefined {
    if (record === null || typeof record !== "object" || Array.isArray(record)) return "unsigned";
    const sig = (record as Record<string, unknown>)[SIGNATURE_FIELD];
    if (sig === undefined) return "unsigned";
    if (!checkSignature.Check(sig)) return "malformed";
    const key = this.keys.get(sig.key);
    if (!key) return "unknown-key";
    if (Math.abs(storedAt - sig.at) > this.maxSkewMs) return "out-of-window";
    const ok = verify(null, signedBytes(subject, sig.key, sig.at, record), key, Buffer.from(sig.ed25519, "base64url"));
    return ok ? undefined : "bad-signature";
  }
}

/** A new Ed25519 key pair, PEM encoded (private: PKCS#8, public: SPKI). */
export function generateSigningKeyPair(): { privateKeyPem: string; publicKeyPem: string; keyId: string } {
  const { privateKey, publicKey } = generateKeyPairSync("ed25519");
  return {
    privateKeyPem: privateKey.export({ type: "pkcs8", format: "pem" }).toString(),
    publicKeyPem: publicKey.export({ type: "spki", format: "pem" }).toString(),
    keyId: keyIdOf(publicKey),
  };
}
