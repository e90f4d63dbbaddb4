/**
 * The signature check of config-bucket entries for a process that watches the bucket (the
 * autoscaler's policies, the adapter controller's declarations): each entry revision is judged once
 * (the start-up read and the watch deliver the same entries), a refusal is counted and logged at a
 * bounded rate, and the caller keeps the previous value. The rule itself is streams/record-keys.ts.
 */
import type { KvEntry } from "@nats-io/kv";
import { configRecordRefusal, type RecordKeySets } from "../../streams/record-keys.js";
import { configRecordSubject } from "../../streams/signatures.js";
import { LogRate } from "./log-rate.js";
import type { Logger } from "./log.js";

/** Why an entry's value is not to be acted on for its signature; undefined when it may be. `forget`: the key was deleted. */
export interface EntryJudge {
  (e: KvEntry, value: unknown): string | undefined;
  forget(key: string): void;
}

export function configEntryJudge(bucket: string, signatures: RecordKeySets, stats: { refusedSignature: number }, log: Logger, refusedMessage: string): EntryJudge {
  const refusedLog = new LogRate(10, 60_000);
  const judged = new Map<string, { revision: number; why: string | undefined }>();
  const judge = (e: KvEntry, value: unknown): string | undefined => {
    const seen = judged.get(e.key);
    if (seen && seen.revision === e.revision) return seen.why;
    const why = configRecordRefusal(e.key, configRecordSubject(bucket, e.key), value, e.created.getTime(), signatures);
    judged.set(e.key, { revision: e.revision, why });
    if (!why) return undefined;
    stats.refusedSignature++;
    if (refusedLog.admit(Date.now()).log) log.warn({ key: e.key.slice(0, 300), reason: why }, refusedMessage);
    return why;
  };
  return Object.assign(judge, { forget: (key: string) => void judged.delete(key) });
}
