/** Test helpers for the request-path stages: a fake clock with timers, pods, a fold to route from. */
import type { ChargeEvent, DecisionRecord, PodEvent, ReleaseEvent } from "../../../schemas/events.js";
import { GatewayState } from "../../views/gateway-state.js";
import type { AdmissionClock } from "./admission.js";

/** A clock that moves only when told to, firing due timers in time order. */
export class FakeClock implements AdmissionClock {
  private timers: Array<{ at: number; fn: () => void }> = [];
  constructor(public t: number) {}
  readonly now = (): number => this.t;
  setTimeout(fn: () => void, ms: number): void {
    this.timers.push({ at: this.t + ms, fn });
  }
  /** Advances to `now + ms`, running due timers (and timers they set) in order. */
  advance(ms: number): void {
    const end = this.t + ms;
    for (;;) {
      this.timers.sort((a, b) => a.at - b.at);
      const next = this.timers[0];
      if (!next || next.at > end) break;
      this.timers.shift();
      this.t = Math.max(this.t, next.at);
      next.fn();
    }
    this.t = end;
  }
  get pending(): number {
    return this.timers.length;
  }
}

export const MODEL = "org/model";

/** A fold with `n` ready pods of MODEL (p0..), as a gateway named `self` would hold it. */
export function stateWithPods(n: number, self = "self"): GatewayState {
  const s = new GatewayState({ self });
  for (let i = 0; i < n; i++) {
    const ev: PodEvent = { type: "pod", action: "upsert", model: MODEL, pod: `p${i}`, address: `10.0.0.${i}:8000`, ready: true, engine: "vllm", ts: 0 };
    s.apply(ev, { stream: "pods", subject: `pods.${i}`, seq: i + 1, serverTs: 0 });
  }
  return s;
}

export const chatBody = (model = MODEL, extra: Record<string, unknown> = {}): Buffer =>
  Buffer.from(JSON.stringify({ model, messages: [{ role: "user", content: "hello there" }], ...extra }));

/** The director's events, kept in memory instead of going to JetStream. */
export class MemorySink {
  charges: ChargeEvent[] = [];
  releases: ReleaseEvent[] = [];
  decisions: DecisionRecord[] = [];
  charge(ev: ChargeEvent) {
    this.charges.push(ev);
  }
  release(ev: ReleaseEvent) {
    this.releases.push(ev);
  }
  decision(rec: DecisionRecord) {
    this.decisions.push(rec);
  }
}
