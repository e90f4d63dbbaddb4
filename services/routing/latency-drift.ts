/**
 * Drift of the latency model: how far the predictions decision records carry (for the picked pod,
 * when it was picked) were from what the request then saw. A rolling absolute percentage error per
 * model and pod class over the last `WINDOW` requests. Pure: the gateway's metrics and `jetroute
 * replay` both feed it decision records.
 */
import type { DecisionRecord } from "../../schemas/events.js";

/** Requests per (model, class) the rolling error spans. */
export const DRIFT_WINDOW = 256;
/** (model, class) pairs tracked; records of further pairs are counted, not tracked (labels stay bounded). */
export const MAX_DRIFT_KEYS = 256;
/** An actual below this (ms) makes a percentage meaningless: not counted. */
const MIN_ACTUAL_MS = 1;

interface Ring {
  model: string;
  podClass: string;
  ttft: Float64Array;
  tpot: Float64Array;
  nTtft: number;
  nTpot: number;
  /** By prediction source. */
  sources: Record<"class" | "pooled" | "prior", number>;
}

export interface DriftFigures {
  model: string;
  podClass: string;
  /** Mean absolute percentage error (0.1 = 10 %) over the window; null before the first sample. */
  ttftApe: number | null;
  tpotApe: number | null;
  samples: number;
  sources: Readonly<Record<"class" | "pooled" | "prior", number>>;
}

export class PredictionDrift {
  private readonly rings = new Map<string, Ring>();
  untracked = 0;

  constructor(private readonly window = DRIFT_WINDOW) {}

  /** Folds one record: counted when it carries a prediction and a positive actual TTFT. */
  record(rec: Pick<DecisionRecord, "model" | "prediction" | "ttftMs" | "tpotMs" | "outcome">): boolean {
    const p = rec.prediction;
    if (!p || rec.outcome !== "completed" || rec.ttftMs === undefined || !(rec.ttftMs >= MIN_ACTUAL_MS)) return false;
    const podClass = p.podClass ?? "_";
    const k = `${rec.model}\u0000${podClass}`;
    let r = this.rings.get(k);
    if (!r) {
      if (this.rings.size >= MAX_DRIFT_KEYS) {
        this.untracked++;
        return false;
      }
      r = { model: rec.model, podClass, ttft: new Float64Array(this.window), tpot: new Float64Array(this.window), nTtft: 0, nTpot: 0, sources: { class: 0, pooled: 0, prior: 0 } };
      this.rings.set(k, r);
    }
    r.ttft[r.nTtft++ % this.window] = Math.abs(p.ttftMs - rec.ttftMs) / rec.ttftMs;
    if (rec.tpotMs !== undefined && rec.tpotMs >= MIN_ACTUAL_MS / 100) r.tpot[r.nTpot++ % this.window] = Math.abs(p.tpotMs - rec.tpotMs) / rec.tpotMs;
    r.sources[p.source]++;
    return true;
  }

  figures(): DriftFigures[] {
    const mean = (a: Float64Array, n: number) => {
      const m = Math.min(n, this.window);
      if (m === 0) return null;
      let s = 0;
      for (let i = 0; i < m; i++) s += a[i] as number;
      return s / m;
    };
    return [...this.rings.values()]
      .map((r) => ({ model: r.model, podClass: r.podClass, ttftApe: mean(r.ttft, r.nTtft), tpotApe: mean(r.tpot, r.nTpot), samples: r.nTtft, sources: { ...r.sources } }))
      .sort((a, b) => (a.model + a.podClass < b.model + b.podClass ? -1 : 1));
  }
}
