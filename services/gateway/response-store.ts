/**
 * The Responses API's response store and location records on JetStream (docs/stateful-apis.md).
 *
 * - `record` writes what a turn leaves: its items to RESPONSE_STORE (unless `store: false` or too
 *   large for one message) and its location to RESPONSES, which every gateway replica folds.
 * - `get` reads one stored response for a tenant: a direct read of the subject's last message,
 *   `<base>.respstore.<digest of (tenant, id)>`. Another tenant's key reads another subject and
 *   finds nothing; a record that does not validate is dead-lettered, counted and treated as absent.
 * - `delete` writes a tombstone over the stored response and a deletion over its location.
 *
 * Bounds live on the streams (streams/definitions.ts: 30 days and 4 GiB for the store, 512 MiB
 * for locations, the oldest dropped first); a record carries `expiresAt` and is not used past it
 * whatever the stream still holds. No client string reaches a subject: both are keyed by digests.
 */
import type { StoredMsg } from "@nats-io/jetstream";
import { checkEvent } from "../../schemas/validate.js";
import { type ResponseItem, type ResponseLocationEvent, type StoredResponse, locationDigest, storeDigest, tenantDigest } from "../../schemas/responses.js";
import { RESPONSE_RETENTION_DAYS, streamName } from "../../streams/definitions.js";
import { Subjects } from "../../streams/subjects.js";
import { DeadLetterSink } from "../shared/dead-letter.js";
import type { Logger } from "../shared/log.js";
import type { NatsHandles } from "../shared/nats.js";
import { encodeEvent } from "../shared/publish.js";
import type { ChainTurn } from "../routing/mod.js";

export const RESPONSE_RETENTION_MS = RESPONSE_RETENTION_DAYS * 86_400_000;
/** Room left in a message for headers. */
const HEADER_ROOM = 1024;

export interface ResponseStoreOptions {
  nats: NatsHandles;
  /** The base prefix (the streams are the base namespace's). */
  prefix: string;
  log: Logger;
  /** Names this process in dead letters. */
  name: string;
  retentionMs?: number;
  now?: () => number;
}

/** What a finished turn leaves behind. */
export interface RecordedTurn {
  id: string;
  /** The API key's owner (its `user`; `anonymous` without auth). */
  owner: string;
  model: string;
  pod: string;
  gateway: string;
  createdAt: number;
  /** `store` not false: keep the items. */
  store: boolean;
  previousResponseId?: string;
  instructions?: StoredResponse["instructions"];
  input: ResponseItem[];
  output: ResponseItem[];
}

export interface ResponseStoreCounters {
  stored: number;
  /** Turns whose items did not fit in one message (kept as a location only). */
  tooLarge: number;
  locations: number;
  reads: number;
  hits: number;
  /** Stored records that did not validate, or named another id or tenant than their subject. */
  malformed: number;
  deleted: number;
}

export class ResponseStore {
  readonly subjects: Subjects;
  readonly streams: { locations: string; store: string };
  readonly counters: ResponseStoreCounters = { stored: 0, tooLarge: 0, locations: 0, reads: 0, hits: 0, malformed: 0, deleted: 0 };
  private readonly dlq: DeadLetterSink;
  private readonly retentionMs: number;
  private readonly now: () => number;

  constructor(private readonly o: ResponseStoreOptions) {
    this.subjects = new Subjects(o.prefix);
    this.streams = { locations: streamName(o.prefix, "RESPONSES"), store: streamName(o.prefix, "RESPONSE_STORE") };
    this.retentionMs = o.retentionMs ?? RESPONSE_RETENTION_MS;
    this.now = o.now ?? Date.now;
    this.dlq = new DeadLetterSink(o.nats.js, this.subjects, o.name, o.log, () => this.maxPayload());
  }

  private maxPayload(): number {
    return this.o.nats.nc.info?.max_payload ?? 1024 * 1024;
  }

  /**
   * Records a finished turn: its items (with `store`), then its location. Resolves with whether
   * the items were stored; rejects when JetStream refuses a write (the caller counts and logs).
   */
  async record(t: RecordedTurn): Promise<{ stored: boolean }> {
    const tenant = tenantDigest(t.owner);
    const expiresAt = t.createdAt + this.retentionMs;
    let stored = false;
    if (t.store) {
      const rec: StoredResponse = {
        type: "stored-response", id: t.id, tenant, model: t.model, createdAt: t.createdAt, expiresAt, pod: t.pod,
        ...(t.previousResponseId !== undefined ? { previousResponseId: t.previousResponseId } : {}),
        ...(t.instructions !== undefined && t.instructions !== null ? { instructions: t.instructions } : {}),
        input: t.input, output: t.output,
      };
      const data = encodeEvent(rec);
      if (data.length > this.maxPayload() - HEADER_ROOM) this.counters.tooLarge++;
      else {
        const digest = storeDigest(tenant, t.id);
        await this.o.nats.js.publish(this.subjects.responseStored(digest), data, { msgID: `respstore.${digest}` });
        this.counters.stored++;
        stored = true;
      }
    }
    const loc: ResponseLocationEvent = { type: "response-location", action: "stored", id: t.id, tenant, gateway: t.gateway, ts: t.createdAt, model: t.model, pod: t.pod, expiresAt, stored };
    const ld = locationDigest(tenant, t.id);
    await this.o.nats.js.publish(this.subjects.responseLocation(ld), encodeEvent(loc), { msgID: `resploc.${ld}` });
    this.counters.locations++;
    return { stored };
  }

  /**
   * Records where a response lives as soon as its id is known (a stream's first event), before
   * its items can be stored: the next turn, sent the moment this one ends, then finds its pod in
   * every replica's view. The record written when the reply ends replaces it.
   */
  async recordStarted(t: Pick<RecordedTurn, "id" | "owner" | "model" | "pod" | "gateway" | "createdAt">): Promise<void> {
    const tenant = tenantDigest(t.owner);
    const loc: ResponseLocationEvent = { type: "response-location", action: "stored", id: t.id, tenant, gateway: t.gateway, ts: t.createdAt, model: t.model, pod: t.pod, expiresAt: t.createdAt + this.retentionMs, stored: false };
    const ld = locationDigest(tenant, t.id);
    await this.o.nats.js.publish(this.subjects.responseLocation(ld), encodeEvent(loc), { msgID: `resploc.${ld}.started` });
    this.counters.locations++;
  }

  /** The stored response `id` of `owner`'s tenant, undefined when absent, deleted, expired or malformed. */
  async get(owner: string, id: string): Promise<StoredResponse | undefined> {
    const tenant = tenantDigest(owner);
    const subject = this.subjects.responseStored(storeDigest(tenant, id));
    this.counters.reads++;
    const m = await this.o.nats.jsm.streams.getMessage(this.streams.store, { last_by_subj: subject });
    if (!m) return undefined;
    const rec = this.decode(m, subject);
    if (!rec) return undefined;
    if (rec.id !== id || rec.tenant !== tenant) {
      this.counters.malformed++;
      this.dlq.send({ family: "respstore", subject, stream: this.streams.store, seq: m.seq, reason: "stored response names another id or tenant than its subject", type: "stored-response", data: m.data });
      return undefined;
    }
    if (rec.deleted || rec.expiresAt <= this.now()) return undefined;
    this.counters.hits++;
    return rec;
  }

  private decode(m: StoredMsg, subject: string): StoredResponse | undefined {
    let value: unknown;
    let reason: string;
    try {
      value = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(m.data));
      const r = checkEvent("stored-response", value);
      if (r.ok) return r.event;
      reason = r.reason;
    } catch (err) {
      reason = `invalid JSON: ${(err as Error).message}`;
    }
    this.counters.malformed++;
    this.dlq.send({ family: "respstore", subject, stream: this.streams.store, seq: m.seq, reason, data: m.data });
    return undefined;
  }

  /** The lookup chain expansion walks with, for one tenant. */
  turns(owner: string): (id: string) => Promise<ChainTurn | undefined> {
    return async (id) => {
      const r = await this.get(owner, id);
      return r && { id: r.id, input: r.input, output: r.output, ...(r.previousResponseId !== undefined ? { previousResponseId: r.previousResponseId } : {}) };
    };
  }

  /**
   * Deletes `owner`'s response `id`: a tombstone over its items and a deletion over its location.
   * False when the tenant holds no such response (nothing written).
   */
  async delete(owner: string, id: string, gateway: string): Promise<boolean> {
    const rec = await this.get(owner, id);
    if (!rec) return false;
    const tenant = rec.tenant;
    const digest = storeDigest(tenant, id);
    const at = this.now();
    const tomb: StoredResponse = { type: "stored-response", id, tenant, model: rec.model, createdAt: rec.createdAt, expiresAt: rec.expiresAt, input: [], output: [], deleted: true };
    await this.o.nats.js.publish(this.subjects.responseStored(digest), encodeEvent(tomb), { msgID: `respstore.${digest}.deleted` });
    const loc: ResponseLocationEvent = { type: "response-location", action: "deleted", id, tenant, gateway, ts: at };
    const ld = locationDigest(tenant, id);
    await this.o.nats.js.publish(this.subjects.responseLocation(ld), encodeEvent(loc), { msgID: `resploc.${ld}.deleted` });
    this.counters.deleted++;
    return true;
  }
}
