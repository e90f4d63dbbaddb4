/**
 * The Responses API's state on the streams (docs/stateful-apis.md).
 *
 * - `response-location` (RESPONSES stream, `<base>.resploc.<tenant+id digest>`): which pod produced a
 *   response, for which model and tenant, until when. Written by the gateway that routed the
 *   request; every gateway replica folds the stream into a bounded view
 *   (services/views/response-locations.ts). A `deleted` record (DELETE /v1/responses/{id})
 *   replaces it (one message per subject).
 * - `stored-response` (RESPONSE_STORE stream, `<base>.respstore.<tenant+id digest>`): what a
 *   continuation needs when the owning pod cannot serve it: the turn's input items, instructions,
 *   output items, model and `previous_response_id` link. Read by id (a direct get of the subject's
 *   last message), never folded. A `deleted: true` record replaces it.
 *
 * Tenants never travel in clear: `tenant` is `tenantDigest(owner)`, and the store's subject is
 * keyed by a digest of (tenant, id), so a key of another tenant asking for the same id reads
 * another, empty subject.
 */
import { createHash } from "node:crypto";
import { type Static, Type } from "@sinclair/typebox";

/**
 * A response id as jetroute records it: vLLM's `resp_<uuid hex>`, SGLang's, OpenAI's
 * (`resp_` + hex). Ids outside this shape are not recorded (the gateway counts them).
 */
export const RESPONSE_ID = /^[A-Za-z0-9_-]{1,128}$/;
export const isResponseId = (s: unknown): s is string => typeof s === "string" && RESPONSE_ID.test(s);

/** Hex digits of every digest in a response subject or record (128 bits). */
export const DIGEST_HEX = 32;
const Digest = Type.String({ pattern: `^[0-9a-f]{${DIGEST_HEX}}$` });
const ResponseId = Type.String({ pattern: RESPONSE_ID.source });
const Name = Type.String({ minLength: 1, maxLength: 253 });
const Millis = Type.Number({ minimum: 0, description: "epoch milliseconds" });

const sha = (s: string) => createHash("sha256").update(s, "utf8").digest("hex").slice(0, DIGEST_HEX);

/** The tenant as records carry it: a digest of the API key's owner (its `user`; `anonymous` without auth). */
export const tenantDigest = (owner: string): string => sha(`tenant\u0000${owner}`);
/**
 * The subject token of a response's location record: the tenant's digest and the id, so that a
 * record another tenant writes for the same id (an engine that lets clients pick ids) lands on
 * another subject and never replaces the owner's as the last of its subject.
 */
export const locationDigest = (tenant: string, id: string): string => sha(`resploc\u0000${tenant}\u0000${id}`);
/** The subject token of a stored response: the tenant's digest and the id together. */
export const storeDigest = (tenant: string, id: string): string => sha(`respstore\u0000${tenant}\u0000${id}`);

/**
 * One object with the deletion's fields optional (one JSON Schema a `nats` user can read): a
 * `stored` record without `model`, `pod`, `expiresAt` or `stored` is refused by the fold.
 */
export const ResponseLocation = Type.Object(
  {
    type: Type.Literal("response-location"),
    /** `stored`: the response exists; `deleted`: DELETE /v1/responses/{id} removed it. */
    action: Type.Union([Type.Literal("stored"), Type.Literal("deleted")]),
    id: ResponseId,
    tenant: Digest,
    /** The gateway that wrote the record. */
    gateway: Name,
    /** When the response was created, or deleted (the writing gateway's clock). */
    ts: Millis,
    /** The model the response was produced by (unescaped). */
    model: Type.Optional(Name),
    /** The pod that produced it (and holds it, if its engine stores responses). */
    pod: Type.Optional(Name),
    /** When every replica forgets it. */
    expiresAt: Type.Optional(Millis),
    /** Whether the response store holds its items (false: `store: false`, or too large to keep). */
    stored: Type.Optional(Type.Boolean()),
  },
  { $id: "response-location", additionalProperties: false },
);
export type ResponseLocationEvent = Static<typeof ResponseLocation>;

/** Most items one stored turn keeps (input or output). */
export const MAX_STORED_ITEMS = 4096;
/** One Responses API item (a message, a function call, a reasoning item, ...): kept as the API gave it. */
const Item = Type.Record(Type.String(), Type.Unknown());

export const StoredResponse = Type.Object(
  {
    type: Type.Literal("stored-response"),
    id: ResponseId,
    tenant: Digest,
    model: Name,
    createdAt: Millis,
    expiresAt: Millis,
    /** The turn's link to the one before it (`previous_response_id` of its request). */
    previousResponseId: Type.Optional(ResponseId),
    /** The request's `instructions` (a string, or a list of items), not carried into later turns. */
    instructions: Type.Optional(Type.Union([Type.String(), Type.Array(Item, { maxItems: MAX_STORED_ITEMS })])),
    /** The turn's own input items (`input` as a list; a string input as one user message). */
    input: Type.Array(Item, { maxItems: MAX_STORED_ITEMS }),
    /** The response's output items. */
    output: Type.Array(Item, { maxItems: MAX_STORED_ITEMS }),
    /** The pod that produced it. */
    pod: Type.Optional(Name),
    /** A tombstone: DELETE /v1/responses/{id} wrote it over the response. */
    deleted: Type.Optional(Type.Boolean()),
  },
  { $id: "stored-response", additionalProperties: false },
);
export type StoredResponse = Static<typeof StoredResponse>;
export type ResponseItem = Record<string, unknown>;
