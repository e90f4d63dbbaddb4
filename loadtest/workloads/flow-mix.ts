/**
 * A seeded mixed-priority workload for the flow-control bench: short interactive chats (objective
 * `interactive`, many users) among long batch requests (objective `batch`) from a few tenants whose
 * demand differs by their weights. Pure: the same options always give the same schedule.
 *
 * Arrivals are open-loop: request times are a Poisson process of `rate` per second, fixed up front,
 * whatever the system under test does. What the i-th arrival is (its class, user, prompt and
 * max_tokens) is drawn from streams of its own, in arrival order, so changing the rate or the
 * duration changes when requests come and how many, never what the i-th request is.
 *
 * Every prompt opens with its own request number: no two requests share a first KV block, so the
 * engines' prefix caches never shorten a prefill and the timing model's capacity holds.
 */
import { mulberry32 } from "../../services/shared/seeded-random.js";
import { prose, vocabulary } from "./shared-prefix.js";

export type FlowObjective = "interactive" | "batch";

export interface FlowClassOptions {
  /** Prompt words, uniform in [min, max] (about one token each with the simulator's tokenizer). */
  promptWords: readonly [number, number];
  /** `max_tokens`, uniform in [min, max] (the simulator generates exactly that many). */
  maxTokens: readonly [number, number];
}

export interface FlowMixOptions {
  seed: number;
  /** Request arrivals per second (Poisson), all classes together. */
  rate: number;
  /** Arrivals are generated in [0, durationMs). */
  durationMs: number;
  /** Fraction of arrivals that are interactive. */
  interactiveShare: number;
  /** Distinct users the interactive requests come from (`chat-<i>`, uniform). */
  interactiveUsers: number;
  /** Batch tenants (`user` header) and their relative demand. */
  tenants: ReadonlyArray<{ user: string; weight: number }>;
  interactive: FlowClassOptions;
  batch: FlowClassOptions;
}

export const FLOW_MIX_DEFAULTS: Omit<FlowMixOptions, "rate" | "durationMs"> = {
  seed: 19,
  interactiveShare: 0.2,
  interactiveUsers: 20,
  tenants: [
    { user: "tenant-big", weight: 10 },
    { user: "tenant-small", weight: 1 },
  ],
  interactive: { promptWords: [20, 60], maxTokens: [8, 16] },
  batch: { promptWords: [400, 800], maxTokens: [48, 96] },
};

export interface FlowRequest {
  /** 0-based arrival index. */
  index: number;
  /** Send time, ms from the start of the run. */
  atMs: number;
  objective: FlowObjective;
  user: string;
  prompt: string;
  maxTokens: number;
}

const uniformInt = (rand: () => number, [lo, hi]: readonly [number, number]): number => lo + Math.floor(rand() * (hi - lo + 1));

/** Exponential with the given mean; 1 - u keeps the log argument in (0, 1]. */
const exponential = (rand: () => number, mean: number): number => -Math.log(1 - rand()) * mean;

function check(ok: boolean, what: string): void {
  if (!ok) throw new RangeError(`flow-mix workload: ${what}`);
}

const validRange = ([lo, hi]: readonly [number, number]) => Number.isInteger(lo) && Number.isInteger(hi) && lo >= 1 && hi >= lo;

export function buildFlowMix(o: FlowMixOptions): FlowRequest[] {
  check(o.rate > 0 && Number.isFinite(o.rate), `rate must be > 0, got ${o.rate}`);
  check(o.durationMs > 0 && Number.isFinite(o.durationMs), `durationMs must be > 0, got ${o.durationMs}`);
  check(o.interactiveShare >= 0 && o.interactiveShare <= 1, `interactiveShare must be in [0, 1], got ${o.interactiveShare}`);
  check(Number.isInteger(o.interactiveUsers) && o.interactiveUsers >= 1, "interactiveUsers must be an integer >= 1");
  check(o.tenants.length >= 1 && o.tenants.every((t) => t.user.length > 0 && t.weight > 0), "tenants need a user and a weight > 0 each");
  for (const [name, c] of [["interactive", o.interactive], ["batch", o.batch]] as const) {
    check(validRange(c.promptWords), `${name}.promptWords must be an integer range [min, max], min >= 1`);
    check(validRange(c.maxTokens), `${name}.maxTokens must be an integer range [min, max], min >= 1`);
  }

  const arrivalRand = mulberry32(o.seed ^ 0x9e3779b9);
  const kindRand = mulberry32(o.seed ^ 0x85ebca6b);
  const textRand = mulberry32(o.seed);
  const vocab = vocabulary(textRand, 4_096);
  const totalWeight = o.tenants.reduce((a, t) => a + t.weight, 0);
  const pickTenant = (): string => {
    let x = kindRand() * totalWeight;
    for (const t of o.tenants) {
      x -= t.weight;
      if (x < 0) return t.user;
    }
    return (o.tenants.at(-1) as FlowMixOptions["tenants"][number]).user;
  };

  const out: FlowRequest[] = [];
  for (let t = exponential(arrivalRand, 1_000 / o.rate); t < o.durationMs; t += exponential(arrivalRand, 1_000 / o.rate)) {
    const interactive = kindRand() < o.interactiveShare;
    const c = interactive ? o.interactive : o.batch;
    const user = interactive ? `chat-${Math.floor(kindRand() * o.interactiveUsers)}` : pickTenant();
    const words = uniformInt(kindRand, c.promptWords);
    const maxTokens = uniformInt(kindRand, c.maxTokens);
    const index = out.length;
    out.push({ index, atMs: t, objective: interactive ? "interactive" : "batch", user, prompt: `Request ${index}. ${prose(textRand, vocab, words)}`, maxTokens });
  }
  return out;
}
