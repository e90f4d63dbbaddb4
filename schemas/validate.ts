/**
 * Compiled validators (TypeBox's compiler: generated code, no per-message schema walking).
 * A consumer decodes bytes with `decodeEvent`, which never throws: it returns either the typed
 * event or a reason fit for a log line and a dead-letter header.
 */
import { TypeCompiler, type TypeCheck } from "@sinclair/typebox/compiler";
import { EVENT_SCHEMAS, type EventOf, type EventType } from "./events.js";

const checks = Object.fromEntries(
  Object.entries(EVENT_SCHEMAS).map(([k, s]) => [k, TypeCompiler.Compile(s)]),
) as { [K in EventType]: TypeCheck<(typeof EVENT_SCHEMAS)[K]> };

/** A refusal names the event type the payload claims when it is one of ours (`type`). */
export type Decoded<T> = { ok: true; event: T } | { ok: false; reason: string; type?: EventType };

const textDecoder = new TextDecoder("utf-8", { fatal: true });

/** Validates an already-parsed value as event type `T`. */
export function checkEvent<T extends EventType>(type: T, value: unknown): Decoded<EventOf<T>> {
  const check = checks[type];
  if (check.Check(value)) return { ok: true, event: value as EventOf<T> };
  const first = check.Errors(value).First();
  return { ok: false, reason: first ? `${first.path || "/"}: ${first.message}` : "schema mismatch" };
}

/**
 * Parses and validates a message payload as one of `allowed` event types, chosen by its `type` field.
 */
export function decodeEvent<T extends EventType>(data: Uint8Array, allowed: readonly T[]): Decoded<EventOf<T>> {
  let value: unknown;
  try {
    value = JSON.parse(textDecoder.decode(data));
  } catch (err) {
    return { ok: false, reason: `invalid JSON: ${(err as Error).message}` };
  }
  const type = (value as { type?: unknown } | null)?.type;
  const known = typeof type === "string" && Object.hasOwn(checks, type) ? (type as EventType) : undefined;
  if (typeof type !== "string" || !(allowed as readonly string[]).includes(type)) {
    return { ok: false, reason: `unexpected event type ${JSON.stringify(type)} (expected ${allowed.join("|")})`, ...(known ? { type: known } : {}) };
  }
  const r = checkEvent(type as T, value);
  return r.ok ? r : { ...r, type: type as T };
}
