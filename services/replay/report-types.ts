/**
 * The result of `jetroute replay`: printed as the final JSON line and rendered as the HTML report.
 * Plain data only (JSON-safe: no bigint, no Map), so the report can be re-rendered from the line.
 */

/** A latency distribution: fixed bucket edges (ms) and the count in each bucket. */
export interface Histogram {
  /** Upper edges of the buckets, ascending; the last bucket also takes everything above. */
  edgesMs: number[];
  counts: number[];
  n: number;
  p50Ms: number | null;
  p99Ms: number | null;
}

export interface StrategySummary {
  /** `recorded` for what the gateways really picked; else a strategy spec. */
  name: string;
  /** Decisions this strategy was evaluated on. */
  decisions: number;
  /** Prompt blocks the pick held (engine index, tier-weighted, as of the decision), summed. */
  hitBlocks: number;
  /** Prompt blocks queried (the recorded hashes), summed. */
  queriedBlocks: number;
  /** hitBlocks / queriedBlocks (0 when nothing was queried). */
  hitRate: number;
  /** Load spread: the busiest pod's in-flight requests over the mean, averaged over decisions (counterfactual ledger). */
  meanSpread: number;
  maxSpread: number;
  /** Blocks lost against the best-matching candidate, averaged over decisions. */
  meanRegretBlocks: number;
}

export interface TimelinePoint {
  /** Start of the bucket (epoch ms). */
  t: number;
  /** Per strategy name: hit rate and mean load spread of the decisions in the bucket. */
  strategies: Record<string, { hitRate: number; spread: number; decisions: number }>;
}

export interface RegretEntry {
  requestId: string;
  gateway: string;
  /** Decision time (epoch ms). */
  ts: number;
  model: string;
  strategy: string;
  pick: string;
  best: string;
  regretBlocks: number;
}

export interface SimulationSummary {
  strategy: string;
  requests: number;
  completed: number;
  ttft: Histogram;
  /** Engine prefix-cache hit rate (hit tokens / queried tokens) in the simulated fleet. */
  hitRate: number;
  /** Simulated span from the first arrival to the last completion (ms). */
  makespanMs: number;
}

/** Mean absolute percentage errors (0.1 = 10 %) of recorded predictions against recorded outcomes. */
export interface PredictionFigures {
  decisions: number;
  /** Of those, predictions made from the prior alone (no outcome seen yet). */
  fromPrior: number;
  ttftMape: number | null;
  tpotMape: number | null;
}

export interface PredictionErrorSummary extends PredictionFigures {
  byClass: Array<PredictionFigures & { model: string; podClass: string }>;
}

/**
 * The calibrated what-if: engine parameters fitted to the window's recorded outcomes per pod
 * class, and the recorded strategy simulated with them beside what was recorded.
 */
export interface CalibrationSummary {
  strategy: string;
  recordedTtftP50Ms: number | null;
  simulatedTtftP50Ms: number | null;
  /** simulated / recorded TTFT p50 (1 = exact). */
  ttftP50Ratio: number | null;
  classes: Array<{ model: string; podClass: string; pods: number; samples: number; prefillMsPerToken: number; decodeMsPerStep: number; decodeBatchSlope: number; ttftOffsetMs: number }>;
}

export interface FidelityExample {
  id: string;
  gateway: string;
  ts: number;
  strategy: string;
  residual: string;
  recorded: { pick: string; candidates: Array<{ pod: string; score?: number }> };
  /** Absent when the re-decision threw (no candidates). */
  replayed?: { pick: string; candidates: Array<{ pod: string; score: number }> };
}

export interface ReplayReport {
  report: "jetroute-replay";
  version: 1;
  generatedAt: string;
  source: string;
  window: { fromMs: number; toMs: number };
  /** Counters of what was read and what could not be used, by reason. */
  decisions: {
    read: number;
    evaluated: number;
    rejected: number;
    skipped: Record<string, number>;
  };
  events: { applied: number; skipped: Record<string, number> };
  fidelity: {
    evaluated: number;
    reproduced: number;
    /** reproduced / evaluated (1 when nothing was evaluated). */
    ratio: number;
    /** Picks not reproduced, by explained cause. */
    residuals: Record<string, number>;
    /**
     * The first picks not reproduced (at most 20), to follow up with `/debug/explain` or a bug
     * report: the recorded pick and scores beside the re-decided ones.
     */
    examples?: FidelityExample[];
    /** Model rewrites (InferenceModelRewrite) re-decided from the pool policies at the record's config cursor, and how many chose the recorded model. */
    rewrites?: { evaluated: number; reproduced: number };
    /** Engine priorities (decision records' `enginePriority`) derived again from the band, the picked pod and the config at the record's cursors, and how many gave the recorded value. */
    enginePriority?: { evaluated: number; reproduced: number };
  };
  /** `recorded` first, then each counterfactual strategy in the order asked. */
  strategies: StrategySummary[];
  timeline: TimelinePoint[];
  agreement: { strategies: string[]; matrix: number[][] };
  topRegrets: RegretEntry[];
  /** Recorded TTFT of the replayed requests (from their decision records). */
  recordedTtft: Histogram;
  simulation?: SimulationSummary[];
  /** The latency model's recorded predictions against the recorded outcomes (absent: no record carried one). */
  prediction?: PredictionErrorSummary;
  /** `--simulate`: the calibrated what-if (absent: no release carried a latency sample). */
  calibration?: CalibrationSummary;
  /**
   * Flow control: per priority band, highest first, the recorded requests that passed the flow
   * gate, how many were held (waited > 0) and their wait (ms) as recorded. Absent: no
   * flow-controlled request in the window. The picks of held requests are re-decided at their
   * dispatch (the record's `ts` and cursors), as live.
   */
  flow?: Array<{ band: number; requests: number; held: number; wait: Histogram }>;
  /** Human-readable warnings (purged history, other schema versions, ...). */
  warnings: string[];
}
