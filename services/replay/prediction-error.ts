/**
 * Prediction error over a replay window: the latency model's predictions that decision records
 * carry (for the picked pod, when it was picked) against the outcomes they recorded. Mean absolute
 * percentage error per model and pod class, and over the whole window. Pure.
 */
import type { DecisionRecord } from "../../schemas/events.js";
import type { PredictionErrorSummary } from "./report-types.js";

const MAX_KEYS = 256;

interface Sums {
  model: string;
  podClass: string;
  n: number;
  ttft: number;
  nTpot: number;
  tpot: number;
  prior: number;
}

export class PredictionError {
  private readonly byKey = new Map<string, Sums>();
  private readonly all: Sums = { model: "", podClass: "", n: 0, ttft: 0, nTpot: 0, tpot: 0, prior: 0 };

  get decisions(): number {
    return this.all.n;
  }

  record(d: Pick<DecisionRecord, "model" | "prediction" | "ttftMs" | "tpotMs" | "outcome">): void {
    const p = d.prediction;
    if (!p || d.outcome !== "completed" || d.ttftMs === undefined || !(d.ttftMs >= 1)) return;
    const podClass = p.podClass ?? "_";
    const k = `${d.model}\u0000${podClass}`;
    let s = this.byKey.get(k);
    if (!s && this.byKey.size < MAX_KEYS) {
      s = { model: d.model, podClass, n: 0, ttft: 0, nTpot: 0, tpot: 0, prior: 0 };
      this.byKey.set(k, s);
    }
    for (const x of s ? [s, this.all] : [this.all]) {
      x.n++;
      x.ttft += Math.abs(p.ttftMs - d.ttftMs) / d.ttftMs;
      if (p.source === "prior") x.prior++;
      if (d.tpotMs !== undefined && d.tpotMs > 0.01) {
        x.nTpot++;
        x.tpot += Math.abs(p.tpotMs - d.tpotMs) / d.tpotMs;
      }
    }
  }

  summary(): PredictionErrorSummary {
    const figures = (s: Sums) => ({ decisions: s.n, fromPrior: s.prior, ttftMape: s.n > 0 ? s.ttft / s.n : null, tpotMape: s.nTpot > 0 ? s.tpot / s.nTpot : null });
    return {
      ...figures(this.all),
      byClass: [...this.byKey.values()].sort((a, b) => (a.model + a.podClass < b.model + b.podClass ? -1 : 1)).map((s) => ({ model: s.model, podClass: s.podClass, ...figures(s) })),
    };
  }
}
