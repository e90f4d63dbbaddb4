/**
 * Recent request outcomes per model (from DECISIONS records): TTFT, TPOT, prompt and output
 * tokens, for latency percentiles and the pd planner's demand. Pure.
 *
 * Bounded: a ring of `perModel` outcomes per model (5 float64 columns: 40 bytes per outcome, 655 KB
 * per model at the default 16,384) and at most `maxModels` models (the least recently fed is
 * dropped). A window longer than the ring holds reads what the ring holds.
 */

export interface Outcome {
  ts: number;
  ttftMs?: number;
  tpotMs?: number;
  promptTokens?: number;
  completionTokens?: number;
}

export const OUTCOME_BYTES = 5 * 8;
export const DEFAULT_OUTCOMES_PER_MODEL = 16_384;
export const DEFAULT_OUTCOME_MODELS = 256;

class Ring {
  readonly ts: Float64Array;
  readonly ttft: Float64Array;
  readonly tpot: Float64Array;
  readonly prompt: Float64Array;
  readonly output: Float64Array;
  next = 0;
  size = 0;

  constructor(readonly cap: number) {
    this.ts = new Float64Array(cap);
    this.ttft = new Float64Array(cap);
    this.tpot = new Float64Array(cap);
    this.prompt = new Float64Array(cap);
    this.output = new Float64Array(cap);
  }

  push(o: Outcome): void {
    const i = this.next;
    this.ts[i] = o.ts;
    this.ttft[i] = o.ttftMs ?? Number.NaN;
    this.tpot[i] = o.tpotMs ?? Number.NaN;
    this.prompt[i] = o.promptTokens ?? Number.NaN;
    this.output[i] = o.completionTokens ?? Number.NaN;
    this.next = (i + 1) % this.cap;
    if (this.size < this.cap) this.size++;
  }

  /** Indexes of outcomes with `ts` in (from, to]. */
  *within(from: number, to: number): Generator<number> {
    for (let k = 0; k < this.size; k++) {
      const i = (this.next - 1 - k + this.cap) % this.cap;
      const t = this.ts[i] as number;
      if (t > from && t <= to) yield i;
    }
  }
}

export interface Demand {
  requests: number;
  requestsPerS: number;
  meanPromptTokens: number;
  meanOutputTokens: number;
}

export class OutcomeWindow {
  private readonly rings = new Map<string, Ring>();

  constructor(
    readonly perModel = DEFAULT_OUTCOMES_PER_MODEL,
    readonly maxModels = DEFAULT_OUTCOME_MODELS,
  ) {}

  add(model: string, o: Outcome): void {
    if (!Number.isFinite(o.ts)) return;
    let r = this.rings.get(model);
    if (r) this.rings.delete(model);
    else {
      if (this.rings.size >= this.maxModels) this.rings.delete(this.rings.keys().next().value as string);
      r = new Ring(this.perModel);
    }
    this.rings.set(model, r);
    r.push(o);
  }

  /** The q-quantile (nearest rank) of TTFT or TPOT over (now - windowMs, now]; undefined when none. */
  percentile(model: string, kind: "ttft" | "tpot", q: number, now: number, windowMs: number): number | undefined {
    const r = this.rings.get(model);
    if (!r) return undefined;
    const col = kind === "ttft" ? r.ttft : r.tpot;
    const vals: number[] = [];
    for (const i of r.within(now - windowMs, now)) {
      const v = col[i] as number;
      if (!Number.isNaN(v)) vals.push(v);
    }
    if (vals.length === 0) return undefined;
    vals.sort((a, b) => a - b);
    return vals[Math.min(vals.length - 1, Math.max(0, Math.ceil(q * vals.length) - 1))];
  }

  demand(model: string, now: number, windowMs: number): Demand {
    const r = this.rings.get(model);
    let n = 0;
    let prompt = 0;
    let promptN = 0;
    let output = 0;
    let outputN = 0;
    if (r) {
      for (const i of r.within(now - windowMs, now)) {
        n++;
        const p = r.prompt[i] as number;
        const o = r.output[i] as number;
        if (!Number.isNaN(p)) {
          prompt += p;
          promptN++;
        }
        if (!Number.isNaN(o)) {
          output += o;
          outputN++;
        }
      }
    }
    return { requests: n, requestsPerS: n / (windowMs / 1000), meanPromptTokens: promptN ? prompt / promptN : 0, meanOutputTokens: outputN ? output / outputN : 0 };
  }

  get models(): number {
    return this.rings.size;
  }
}
