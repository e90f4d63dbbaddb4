/**
 * Per-pod fault injection for tests (`POST /debug/faults`, `fleet.setFaults`): error statuses and
 * hangs on completion requests, and misbehaving P/D side channels. Validation is pure; the gate
 * holds hung requests until the fault is cleared or their client leaves.
 */
import { badRequest } from "./errors.js";

export const SIDE_CHANNEL_FAULTS = ["ok", "refuse", "delay", "drop"] as const;
export const BOOTSTRAP_FAULTS = ["ok", "refuse", "drop"] as const;

export interface PodFaults {
  /** Answer the next `count` completion requests with this HTTP status (vLLM error body). */
  status?: number;
  /** Default: every request until cleared. */
  count?: number;
  /** Accept completion requests and never answer, until cleared or the client leaves. */
  hang?: boolean;
  /** vLLM prefill's KV side channel: refuse connections, answer late, or never answer. */
  sideChannel?: (typeof SIDE_CHANNEL_FAULTS)[number];
  /** How late a "delay" side channel answers (wall ms; default 5000, beyond the read timeout). */
  sideChannelDelayMs?: number;
  /** SGLang prefill's bootstrap server: refuse connections or never answer. */
  bootstrap?: (typeof BOOTSTRAP_FAULTS)[number];
}

export const DEFAULT_SIDE_CHANNEL_DELAY_MS = 5_000;

export function parseFaults(value: unknown): PodFaults {
  if (typeof value !== "object" || value === null || Array.isArray(value)) throw badRequest("faults must be a JSON object");
  const f = value as Record<string, unknown>;
  const known = new Set(["status", "count", "hang", "sideChannel", "sideChannelDelayMs", "bootstrap"]);
  const unknown = Object.keys(f).filter((k) => !known.has(k));
  if (unknown.length > 0) throw badRequest(`unknown fault field(s): ${unknown.slice(0, 5).join(", ")}`);
  const out: PodFaults = {};
  const int = (k: string, min: number, max: number): number | undefined => {
    const v = f[k];
    if (v === undefined || v === null) return undefined;
    if (typeof v !== "number" || !Number.isInteger(v) || v < min || v > max) throw badRequest(`${k} must be an integer in [${min}, ${max}]`, k);
    return v;
  };
  const oneOf = <T extends string>(k: string, allowed: readonly T[]): T | undefined => {
    const v = f[k];
    if (v === undefined || v === null) return undefined;
    if (typeof v !== "string" || !(allowed as readonly string[]).includes(v)) throw badRequest(`${k} must be one of ${allowed.join(", ")}`, k);
    return v as T;
  };
  const status = int("status", 400, 599);
  const count = int("count", 1, 1_000_000_000);
  const delay = int("sideChannelDelayMs", 0, 600_000);
  if (status !== undefined) out.status = status;
  if (count !== undefined) out.count = count;
  if (count !== undefined && status === undefined) throw badRequest("count needs status", "count");
  if (f.hang !== undefined && f.hang !== null) {
    if (typeof f.hang !== "boolean") throw badRequest("hang must be a boolean", "hang");
    out.hang = f.hang;
  }
  const side = oneOf("sideChannel", SIDE_CHANNEL_FAULTS);
  if (side !== undefined) out.sideChannel = side;
  if (delay !== undefined) out.sideChannelDelayMs = delay;
  const bootstrap = oneOf("bootstrap", BOOTSTRAP_FAULTS);
  if (bootstrap !== undefined) out.bootstrap = bootstrap;
  return out;
}

/** What the pod should do with the next completion request. */
export type FaultAction = { kind: "serve" } | { kind: "status"; status: number } | { kind: "hang" };

export class FaultState {
  private faults: PodFaults = {};
  private remaining: number | undefined;
  private readonly hung = new Set<() => void>();

  get current(): PodFaults {
    return { ...this.faults, ...(this.remaining !== undefined && this.faults.status !== undefined ? { count: this.remaining } : {}) };
  }

  /** Replaces every fault; `{}` clears them and lets hung requests go on. */
  set(f: PodFaults): void {
    this.faults = { ...f };
    this.remaining = f.count;
    if (!f.hang) {
      for (const release of [...this.hung]) release();
    }
  }

  /** Decides the next completion request's fate, using up one of `count`. */
  next(): FaultAction {
    if (this.faults.status !== undefined) {
      const status = this.faults.status;
      if (this.remaining !== undefined) {
        this.remaining--;
        if (this.remaining <= 0) {
          delete this.faults.status;
          this.remaining = undefined;
        }
      }
      return { kind: "status", status };
    }
    return this.faults.hang ? { kind: "hang" } : { kind: "serve" };
  }

  /** Resolves when the hang is cleared; `signal` (the client leaving) drops the waiter. */
  waitUnhung(signal: AbortSignal): Promise<void> {
    return new Promise((resolve, reject) => {
      const release = (): void => {
        this.hung.delete(release);
        signal.removeEventListener("abort", onAbort);
        resolve();
      };
      const onAbort = (): void => {
        this.hung.delete(release);
        reject(new Error("client left a hung request"));
      };
      if (signal.aborted) return onAbort();
      this.hung.add(release);
      signal.addEventListener("abort", onAbort, { once: true });
    });
  }

  get hungRequests(): number {
    return this.hung.size;
  }
}
