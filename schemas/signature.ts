/**
 * The signature a record that grants power carries (config bucket entries: API keys, limits,
 * pools, model configs; PODS events), as the optional field `sig`. What it covers and how it is
 * checked: streams/signatures.ts and docs/security.md ("Signed records").
 */
import { type Static, Type } from "@sinclair/typebox";

export const RecordSignature = Type.Object(
  {
    /** The signing key's id: the first 16 hex digits of the SHA-256 of its public key (SPKI DER). */
    key: Type.String({ pattern: "^[0-9a-f]{16}$" }),
    /** When it was signed (epoch ms): a verifier refuses a record stored far from that time (a replayed copy). */
    at: Type.Integer({ minimum: 0 }),
    /** The Ed25519 signature, base64url without padding. */
    ed25519: Type.String({ pattern: "^[A-Za-z0-9_-]{86}$" }),
  },
  { additionalProperties: false, description: "Ed25519 signature over the record's subject and canonical JSON (docs/security.md)" },
);
export type RecordSignature = Static<typeof RecordSignature>;
