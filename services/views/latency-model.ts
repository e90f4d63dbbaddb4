/**
 * The latency model: per (model, pod class) ridge regressions of TTFT and TPOT on a few physical
 * features, folded from the releases on the CHARGES stream. Pure: no I/O, no clock of its own.
 *
 * A release that carries `latency` (schemas/events.ts) is one training sample: the features of its
 * pod when the request was routed (the routing gateway kept them by charge id) and the outcome it
 * saw (TTFT, TPOT). The sample lands in a 10 s bucket of its class by the release's own `ts`; a
 * prediction at time `now` sums the last `WINDOW_BUCKETS` buckets and solves the ridge system.
 *
 * The state is a function of the SET of samples learned, whatever the order they were folded in:
 * - each sample adds integers (features in 16-token blocks and request counts, outcomes in ms or
 *   0.1 ms, all clamped) to float64 sums that stay below 2^53, so the sums are exact and addition
 *   commutes;
 * - the window's horizon is the newest bucket learned over the whole model (not per entry, not
 *   arrival order): a bucket at or before `newest - WINDOW_BUCKETS` is evicted everywhere and a
 *   sample there is late, so a sample is kept iff it is within the window of the newest one;
 * - a fit is cached per entry version, which every sample and every eviction bumps.
 * That is what lets a gateway apply its own releases at once and the others' from the stream, and
 * `jetroute replay` rebuild the model a decision saw exactly from the same set (its gateway's own
 * releases made before its charge, by `afterCharge`; the others' up to its CHARGES cursor). Only
 * the bounds (a full bucket, the entry caps) depend on arrival order, and only when hit.
 *
 * Cold start: the regression is pulled towards a prior (ridge with a non-zero mean): a class's
 * own fit is pulled towards the model's pooled fit over all its classes, which is pulled towards
 * `DEFAULT_PRIOR`. With no sample the prediction is the prior's, and says so (`source`).
 */
import type { LatencySample } from "../../schemas/events.js";

/** Features of one candidate pod for one request, at decision time (what a release's `latency.x` carries). */
export interface LatencyFeatures {
  /** The request's prompt tokens. */
  readonly promptTokens: number;
  /** Of those, tokens the pod holds in its prefix cache (index match x block size; 0 when unknown). */
  readonly cachedTokens: number;
  /** Prompt tokens of the pod's other requests still in prefill (shared ledger). */
  readonly prefillTokens: number;
  /** The pod's other requests past their first token (shared ledger). */
  readonly decoding: number;
  /** Engine queue (LOAD `waiting`; 0 without a fresh sample). */
  readonly waiting: number;
  /** KV cache usage in permille (LOAD; 0 without a fresh sample). */
  readonly kvPermille: number;
}

export interface LatencyPrediction {
  readonly ttftMs: number;
  readonly tpotMs: number;
  /** What the prediction came from: the class's own samples, the model's pooled ones, or the prior alone. */
  readonly source: "class" | "pooled" | "prior";
  /** Samples in the window behind the class's fit (0 = none seen). */
  readonly samples: number;
}

export interface LatencyReader {
  predict(model: string, podClass: string | undefined, f: LatencyFeatures, now: number): LatencyPrediction;
}

/** Bucket length and how many make the window (2 minutes: old enough to be stable, young enough to follow drift). */
export const BUCKET_MS = 10_000;
export const WINDOW_BUCKETS = 12;
/** Samples one bucket of one class may take (the sums stay exact below it); beyond, counted and dropped. */
export const MAX_BUCKET_SAMPLES = 65_536;
/* Exactness: TTFT weight <= 2^12, regressors <= 2^12, so w·x·x <= 2^36 and w·x·y <= 2^30 per
   sample; TPOT (0.1 ms, <= 10^5) x·y <= 2^29: under 2^16 samples every bucket sum stays below 2^53. */
/** (model, class) entries kept; classes of one model. */
export const MAX_ENTRIES = 1_024;
export const MAX_CLASSES_PER_MODEL = 64;
/** Beyond these an outcome is absurd (a hung stream, a clock jump) and not learned. */
export const MAX_TTFT_MS = 60_000;
export const MAX_TPOT_MS = 10_000;
/** The class of pods without one. */
export const UNCLASSED = "_";
const POOLED = "*";

/** Regressors: TTFT on [1, uncached blocks, prefill blocks queued, decoding, waiting]; TPOT on [1, decoding, prefill blocks queued]. */
const DT = 5;
const DP = 3;
const BLOCK = 16;
/** Feature bounds: 64k tokens uncached or queued (in blocks), 1,023 requests. They keep every bucket's sums exact. */
const MAX_BLOCKS = 4_095;
const MAX_REQUESTS = 1_023;
const clampInt = (v: number, max: number) => (Number.isFinite(v) && v > 0 ? Math.min(max, Math.round(v)) : 0);

export function ttftRegressors(f: LatencyFeatures): number[] {
  const uncached = Math.max(0, f.promptTokens - f.cachedTokens);
  return [1, clampInt(uncached / BLOCK, MAX_BLOCKS), clampInt(f.prefillTokens / BLOCK, MAX_BLOCKS), clampInt(f.decoding, MAX_REQUESTS), clampInt(f.waiting, MAX_REQUESTS)];
}
export function tpotRegressors(f: LatencyFeatures): number[] {
  return [1, clampInt(f.decoding, MAX_REQUESTS), clampInt(f.prefillTokens / BLOCK, MAX_BLOCKS)];
}

/**
 * TTFT samples are weighted by 1/TTFT² (quantised: 2^18 / max(TTFT, 8 ms)², at least 1), so the
 * fit minimises relative rather than absolute error: a cached prompt's 10 ms matters as much as a
 * cold one's 150 ms (unweighted, the large ones set the intercept and every small one is
 * overestimated). Integer weights keep the sums exact; from 512 ms up every sample weighs 1.
 */
const TTFT_WEIGHT = 2 ** 18;
export const ttftWeight = (ttftMs: number): number => Math.max(1, Math.round(TTFT_WEIGHT / Math.max(8, ttftMs) ** 2));
/** The weight of a 100 ms TTFT: the prior's pseudo-samples weigh as much. */
const PRIOR_SAMPLE_WEIGHT = ttftWeight(100);

/**
 * The prior: roughly an 8B model on one modern GPU (the simulator's defaults): ~20 ms fixed,
 * 4 ms per uncached 16-token block, 4 ms per queued block, 1 ms per decoding request, 20 ms per
 * queued request; TPOT 15 ms + 0.75 ms per decoding request + 0.06 ms per queued block.
 */
export const DEFAULT_PRIOR = { ttft: [20, 4, 4, 1, 20], tpot: [15, 0.75, 0.06] } as const;
/** Prior strength: pseudo-samples at each regressor's typical scale. */
const PRIOR_WEIGHT = 2;
const SCALE_T = [1, 64, 128, 8, 4];
const SCALE_P = [1, 8, 128];

/**
 * One bucket's sufficient statistics, in one array: TTFT [n, XᵀWX (upper triangle), XᵀWy], then
 * TPOT [n, XᵀX, Xᵀy]. Bounded inputs keep every sum an exact integer below 2^53.
 */
const tri = (d: number) => (d * (d + 1)) / 2;
const T_OFF = 0;
const P_OFF = 1 + tri(DT) + DT;
const BUCKET_LEN = P_OFF + 1 + tri(DP) + DP;

function addSample(a: Float64Array, off: number, x: readonly number[], y: number, w: number): void {
  const d = x.length;
  a[off] = (a[off] as number) + 1;
  let k = off + 1;
  const xy = off + 1 + tri(d);
  for (let i = 0; i < d; i++) {
    const wxi = w * (x[i] as number);
    a[xy + i] = (a[xy + i] as number) + wxi * y;
    for (let j = i; j < d; j++) a[k] = (a[k++] as number) + wxi * (x[j] as number);
  }
}

/** Ridge towards `prior`: (XᵀWX + Λ) w = XᵀWy + Λ prior, Λ = PRIOR_WEIGHT · sampleWeight · diag(scale²). */
export function ridge(a: Float64Array, off: number, prior: readonly number[], scale: readonly number[], unit: number, sampleWeight: number): number[] {
  const d = prior.length;
  const m: number[][] = Array.from({ length: d }, () => new Array<number>(d + 1).fill(0));
  let k = off + 1;
  for (let i = 0; i < d; i++) {
    for (let j = i; j < d; j++) {
      const v = a[k++] as number;
      (m[i] as number[])[j] = v;
      (m[j] as number[])[i] = v;
    }
  }
  const xy = off + 1 + tri(d);
  for (let i = 0; i < d; i++) {
    const row = m[i] as number[];
    const lambda = PRIOR_WEIGHT * sampleWeight * (scale[i] as number) ** 2;
    row[i] = (row[i] as number) + lambda;
    // Outcomes are summed in units of `unit` ms; the system is solved in ms.
    row[d] = (a[xy + i] as number) * unit + lambda * (prior[i] as number);
  }
  return solve(m, d);
}

/** Gaussian elimination with partial pivoting on an augmented d×(d+1) matrix (deterministic). */
function solve(a: number[][], d: number): number[] {
  for (let c = 0; c < d; c++) {
    let p = c;
    for (let r = c + 1; r < d; r++) if (Math.abs((a[r] as number[])[c] as number) > Math.abs((a[p] as number[])[c] as number)) p = r;
    if (p !== c) [a[c], a[p]] = [a[p] as number[], a[c] as number[]];
    const pivot = (a[c] as number[])[c] as number;
    if (pivot === 0) continue;
    for (let r = c + 1; r < d; r++) {
      const row = a[r] as number[];
      const f = (row[c] as number) / pivot;
      if (f === 0) continue;
      for (let j = c; j <= d; j++) row[j] = (row[j] as number) - f * ((a[c] as number[])[j] as number);
    }
  }
  const w = new Array<number>(d).fill(0);
  for (let r = d - 1; r >= 0; r--) {
    const row = a[r] as number[];
    let v = row[d] as number;
    for (let j = r + 1; j < d; j++) v -= (row[j] as number) * (w[j] as number);
    w[r] = row[r] === 0 ? 0 : v / (row[r] as number);
  }
  return w;
}

interface Entry {
  /** Bucket index (floor(ts / bucketMs)) -> its sums (BUCKET_LEN numbers). */
  buckets: Map<number, Float64Array>;
  /** Bumped by every sample and every eviction: fits are cached per (version, window end). */
  version: number;
  fit?: { version: number; priorVersion: number; end: number; ttft: number[]; tpot: number[]; n: number; nTpot: number };
}

/** One (model, class) fit: TTFT and TPOT coefficients over `ttftRegressors` and `tpotRegressors`. */
export interface LatencyCoefficients {
  model: string;
  podClass: string;
  samples: number;
  tpotSamples: number;
  ttft: number[];
  tpot: number[];
}

/** Samples not learned from, by reason (metrics). */
export interface LatencyRejections {
  ttftMissing: number;
  ttftAbsurd: number;
  tpotAbsurd: number;
  late: number;
  full: number;
  /** Stamped ahead of the broker's time by more than FUTURE_SLACK_MS (a gateway with a skewed clock). */
  future: number;
}

/**
 * How far ahead of the broker's clock a release's own time may be: a sample from further ahead
 * would slide every class's window past the present and reject the fleet's real samples as late.
 */
export const FUTURE_SLACK_MS = 10_000;

const dot = (w: readonly number[], x: readonly number[]) => w.reduce((s, wi, i) => s + wi * (x[i] as number), 0);
const key = (model: string, cls: string) => `${model}\u0000${cls}`;

export interface LatencyModelOptions {
  /** Bucket length (default BUCKET_MS) and buckets in the window (default WINDOW_BUCKETS). */
  bucketMs?: number;
  windowBuckets?: number;
  /** Samples one bucket of one class takes (default MAX_BUCKET_SAMPLES). */
  maxBucketSamples?: number;
}

export class LatencyModel implements LatencyReader {
  private readonly entries = new Map<string, Entry>();
  private readonly bucketMs: number;
  private readonly windowBuckets: number;
  private readonly maxBucketSamples: number;

  /**
   * The defaults are the gateways' (every replica must use the same). Replay's calibration fits a
   * whole window with one bucket (`bucketMs` beyond any time): order-dependent rounding is then
   * possible past 2^53, which a one-off fit does not mind.
   */
  constructor(o: LatencyModelOptions = {}) {
    this.bucketMs = o.bucketMs ?? BUCKET_MS;
    this.windowBuckets = o.windowBuckets ?? WINDOW_BUCKETS;
    this.maxBucketSamples = o.maxBucketSamples ?? MAX_BUCKET_SAMPLES;
  }
  private readonly classesPerModel = new Map<string, number>();
  /**
   * The newest bucket learned, over every entry: one horizon for the whole model. Buckets at or
   * before `newest - windowBuckets` are evicted everywhere and samples there are late, so the
   * state is a function of the set of samples learned, whatever their order (a horizon per entry
   * would not be: a class's sample could be late by the pooled entry's horizon in one order and
   * learned before it moved in another).
   */
  private newest = Number.NEGATIVE_INFINITY;
  readonly rejected: LatencyRejections = { ttftMissing: 0, ttftAbsurd: 0, tpotAbsurd: 0, late: 0, full: 0, future: 0 };
  learned = 0;

  /**
   * Folds one release's sample (`ts`: the release's own time; `brokerTs`: when the broker stored
   * it, 0 for a gateway's own release). Returns whether it was learned from.
   */
  learn(model: string, ts: number, s: LatencySample, brokerTs = 0): boolean {
    if (brokerTs > 0 && ts > brokerTs + FUTURE_SLACK_MS) {
      this.rejected.future++;
      return false;
    }
    const ttft = s.ttftMs;
    if (ttft === undefined) {
      this.rejected.ttftMissing++;
      return false;
    }
    if (!Number.isFinite(ttft) || ttft < 0 || ttft > MAX_TTFT_MS) {
      this.rejected.ttftAbsurd++;
      return false;
    }
    const tpot = s.tpotMs;
    const tpotOk = tpot !== undefined && Number.isFinite(tpot) && tpot >= 0 && tpot <= MAX_TPOT_MS;
    if (tpot !== undefined && !tpotOk) this.rejected.tpotAbsurd++;
    const [prompt = 0, cached = 0, prefill = 0, decoding = 0, waiting = 0, kv = 0] = s.x;
    const f: LatencyFeatures = { promptTokens: prompt, cachedTokens: cached, prefillTokens: prefill, decoding, waiting, kvPermille: kv };
    const b = Math.floor(ts / this.bucketMs);
    const cls = s.cls ?? UNCLASSED;
    // The entries first, late or not: a sample evicted later leaves them too, whatever the order.
    const own = this.entry(model, cls);
    const pooled = this.entry(model, POOLED);
    if (own !== undefined && pooled !== undefined && b <= this.newest - this.windowBuckets) {
      this.rejected.late++;
      return false;
    }
    if (own === undefined || pooled === undefined) {
      this.rejected.full++;
      return false;
    }
    const xt = ttftRegressors(f);
    const xp = tpotRegressors(f);
    for (const e of [own, pooled]) {
      if (((e.buckets.get(b)?.[T_OFF] as number | undefined) ?? 0) >= this.maxBucketSamples) {
        this.rejected.full++;
        return false;
      }
    }
    const y = Math.round(ttft);
    const w = ttftWeight(y);
    for (const e of [own, pooled]) {
      const bucket = this.bucket(e, b);
      addSample(bucket, T_OFF, xt, y, w);
      if (tpotOk) addSample(bucket, P_OFF, xp, Math.round((tpot as number) * 10), 1);
      e.version++;
    }
    this.learned++;
    if (b > this.newest) this.advance(b);
    return true;
  }

  /** Moves the horizon to bucket `b`: every entry forgets the buckets that left the window (its cached fit with them). */
  private advance(b: number): void {
    this.newest = b;
    const oldest = b - this.windowBuckets;
    for (const e of this.entries.values()) {
      let evicted = false;
      for (const k of e.buckets.keys()) {
        if (k > oldest) continue;
        e.buckets.delete(k);
        evicted = true;
      }
      if (evicted) e.version++;
    }
  }

  private entry(model: string, cls: string): Entry | undefined {
    const k = key(model, cls);
    let e = this.entries.get(k);
    if (!e) {
      const classes = this.classesPerModel.get(model) ?? 0;
      if (this.entries.size >= MAX_ENTRIES || (cls !== POOLED && classes >= MAX_CLASSES_PER_MODEL)) return undefined;
      e = { buckets: new Map(), version: 0 };
      this.entries.set(k, e);
      if (cls !== POOLED) this.classesPerModel.set(model, classes + 1);
    }
    return e;
  }

  private bucket(e: Entry, b: number): Float64Array {
    let bucket = e.buckets.get(b);
    if (!bucket) {
      bucket = new Float64Array(BUCKET_LEN);
      e.buckets.set(b, bucket);
    }
    return bucket;
  }

  /** The fit of one entry over the window ending at bucket `end`, towards `prior`. */
  private fit(e: Entry | undefined, end: number, prior: { ttft: readonly number[]; tpot: readonly number[] }, priorVersion: number) {
    if (!e) return { ttft: [...prior.ttft], tpot: [...prior.tpot], n: 0, nTpot: 0, version: 0 };
    if (e.fit && e.fit.version === e.version && e.fit.priorVersion === priorVersion && e.fit.end === end) return e.fit;
    const sum = new Float64Array(BUCKET_LEN);
    // In bucket order (the same on every replica whatever order the buckets were made in).
    for (const b of [...e.buckets.keys()].sort((x, y) => x - y)) {
      if (b > end || b <= end - this.windowBuckets) continue;
      const bucket = e.buckets.get(b) as Float64Array;
      for (let i = 0; i < BUCKET_LEN; i++) sum[i] = (sum[i] as number) + (bucket[i] as number);
    }
    const n = sum[T_OFF] as number;
    const nTpot = sum[P_OFF] as number;
    const fit = {
      version: e.version,
      priorVersion,
      end,
      ttft: n > 0 ? ridge(sum, T_OFF, prior.ttft, SCALE_T, 1, PRIOR_SAMPLE_WEIGHT) : [...prior.ttft],
      tpot: nTpot > 0 ? ridge(sum, P_OFF, prior.tpot, SCALE_P, 0.1, 1) : [...prior.tpot],
      n,
      nTpot,
    };
    e.fit = fit;
    return fit;
  }

  predict(model: string, podClass: string | undefined, f: LatencyFeatures, now: number): LatencyPrediction {
    const end = Math.floor(now / this.bucketMs);
    const pooled = this.fit(this.entries.get(key(model, POOLED)), end, DEFAULT_PRIOR, 0);
    const own = this.fit(this.entries.get(key(model, podClass ?? UNCLASSED)), end, pooled, pooled.version);
    const source = own.n > 0 ? "class" : pooled.n > 0 ? "pooled" : "prior";
    return {
      ttftMs: Math.max(0, dot(own.ttft, ttftRegressors(f))),
      tpotMs: Math.max(0, dot(own.tpot, tpotRegressors(f))),
      source,
      samples: own.n,
    };
  }

  /** Coefficients per (model, class) as of `now` (for /debug/state and replay's calibration). */
  coefficients(now: number): LatencyCoefficients[] {
    const end = Math.floor(now / this.bucketMs);
    const out: LatencyCoefficients[] = [];
    for (const k of [...this.entries.keys()].sort()) {
      const [model = "", cls = ""] = k.split("\u0000");
      if (cls === POOLED) continue;
      const pooled = this.fit(this.entries.get(key(model, POOLED)), end, DEFAULT_PRIOR, 0);
      const f = this.fit(this.entries.get(k), end, pooled, pooled.version);
      out.push({ model, podClass: cls, samples: f.n, tpotSamples: f.nTpot, ttft: f.ttft, tpot: f.tpot });
    }
    return out;
  }

  get size(): number {
    return this.entries.size;
  }

  /** A canonical description (state comparison): every entry's bucket sums, sorted. */
  dump(): Array<[string, Array<[number, number[]]>]> {
    return [...this.entries.entries()]
      .sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0))
      .map(([k, e]) => [
        k,
        [...e.buckets.entries()].sort((a, b) => a[0] - b[0]).map(([b, s]) => [b, [...s]] as [number, number[]]),
      ]);
  }
}
