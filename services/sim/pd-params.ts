/**
 * The prefill/decode fields of a generation request body, read and checked without I/O:
 * vLLM's `kv_transfer_params` (NixlConnector) and SGLang's `bootstrap_host/port/room`.
 */
import { badRequest } from "./errors.js";

/** What a vLLM request's `kv_transfer_params` asks of the engine. */
export type KvTransferIntent =
  | { kind: "none" }
  /** Prefill leg: compute, hold the blocks for a remote decode. */
  | { kind: "prefill" }
  /** Decode leg with everything needed to read the prompt's KV. */
  | { kind: "decode"; engineId: string; requestId: string; host: string; port: number; blockIds: number[] }
  /** Params present but missing one of the four fields vLLM needs: it computes the prefill itself. */
  | { kind: "incomplete"; missing: string[] };

const REMOTE_FIELDS = ["remote_engine_id", "remote_request_id", "remote_host", "remote_port"] as const;

export function parseKvTransferParams(value: unknown): KvTransferIntent {
  if (value === undefined || value === null) return { kind: "none" };
  if (typeof value !== "object" || Array.isArray(value)) throw badRequest("kv_transfer_params: Input should be a valid dictionary", "kv_transfer_params");
  const p = value as Record<string, unknown>;
  if (p.do_remote_decode === true) return { kind: "prefill" };
  const missing = REMOTE_FIELDS.filter((k) => p[k] === undefined || p[k] === null);
  if (missing.length > 0) return { kind: "incomplete", missing };
  const { remote_engine_id: engineId, remote_request_id: requestId, remote_host: host, remote_port: port } = p;
  if (typeof engineId !== "string" || typeof requestId !== "string" || typeof host !== "string") {
    throw badRequest("kv_transfer_params: remote_engine_id, remote_request_id and remote_host must be strings", "kv_transfer_params");
  }
  if (typeof port !== "number" || !Number.isInteger(port) || port < 1 || port > 65535) {
    throw badRequest("kv_transfer_params: remote_port must be an integer in [1, 65535]", "kv_transfer_params");
  }
  const ids = p.remote_block_ids;
  const blockIds = Array.isArray(ids) && ids.every((x) => Number.isInteger(x)) ? (ids as number[]) : [];
  return { kind: "decode", engineId, requestId, host, port, blockIds };
}

/** SGLang's disaggregation fields; `room` is the decimal text of an integer in [0, 2^63-1]. */
export interface BootstrapInfo {
  host: string;
  port: number;
  room: string;
}

const MAX_ROOM = (1n << 63n) - 1n;

/**
 * The bootstrap fields of an SGLang request, or undefined when it has none. `raw` is the body's
 * JSON text: `bootstrap_room` goes up to 2^63-1, beyond what a JSON number survives parsing as,
 * so its digits are taken from the text itself.
 */
export function parseBootstrap(body: Record<string, unknown>, raw: string): BootstrapInfo | undefined {
  const { bootstrap_host: host, bootstrap_port: port, bootstrap_room: room } = body;
  if ((host ?? null) === null && (port ?? null) === null && (room ?? null) === null) return undefined;
  if (typeof host !== "string" || host === "") throw badRequest("bootstrap_host must be a non-empty string", "bootstrap_host");
  if (typeof port !== "number" || !Number.isInteger(port) || port < 1 || port > 65535) {
    throw badRequest("bootstrap_port must be an integer in [1, 65535]", "bootstrap_port");
  }
  let digits: string | undefined;
  if (typeof room === "string") digits = room;
  else if (typeof room === "number") digits = topLevelRawValue(raw, "bootstrap_room");
  if (digits === undefined || !/^\d{1,19}$/.test(digits) || BigInt(digits) > MAX_ROOM) {
    throw badRequest("bootstrap_room must be an integer in [0, 2^63-1] (a JSON number or a decimal string)", "bootstrap_room");
  }
  return { host, port, room: BigInt(digits).toString() };
}

/**
 * The raw text of the value of `key` in the top-level object of the JSON document `text`, or
 * undefined. A small scanner (strings, nesting) rather than a regex, so the same key inside a
 * nested object or a message string cannot be mistaken for it. Assumes `text` is valid JSON.
 */
export function topLevelRawValue(text: string, key: string): string | undefined {
  let depth = 0;
  let i = 0;
  let expectKey = false;
  const readString = (): string => {
    const start = i;
    i++;
    while (i < text.length && text[i] !== '"') i += text[i] === "\\" ? 2 : 1;
    i++;
    return text.slice(start, i);
  };
  while (i < text.length) {
    const c = text[i] as string;
    if (c === '"') {
      const s = readString();
      if (depth === 1 && expectKey) {
        expectKey = false;
        let name: string;
        try {
          name = JSON.parse(s) as string;
        } catch {
          return undefined;
        }
        if (name !== key) continue;
        while (i < text.length && /[\s:]/.test(text[i] as string)) i++;
        const start = i;
        if (text[i] === '"') {
          readString();
          return text.slice(start, i);
        }
        while (i < text.length && !/[\s,}\]]/.test(text[i] as string)) i++;
        return text.slice(start, i);
      }
      continue;
    }
    if (c === "{" || c === "[") {
      depth++;
      if (c === "{" && depth === 1) expectKey = true;
    } else if (c === "}" || c === "]") depth--;
    else if (c === "," && depth === 1) expectKey = true;
    i++;
  }
  return undefined;
}
