/**
 * `jetroute replay --rules <file>`: re-decides the recorded requests of virtual models under a
 * changed rule set, from the signal values their decision records kept (no prompt text is ever
 * recorded, so nothing is re-measured), and counts the requests that would have gone to another
 * model. A signal the new rules read that was not recorded — new, or measured differently (other
 * keywords, another pattern, other examples) — is named, and reads false. Pure.
 */
import type { DecisionRecord } from "../../schemas/events.js";
import { validateModelConfig, decide, type CompiledRules, compileRules, applyGroups, judgeRecorded } from "../routing/mod.js";
import type { ModelConfig } from "../../schemas/config.js";

/** A rules file: virtual model name -> its model config (with `semantic`). */
export type RulesFile = Record<string, ModelConfig>;

export interface RulesReplayReport {
  virtualModels: string[];
  /** Recorded requests of those virtual models (rejections included: they may match now). */
  requests: number;
  /** Requests whose model would change. */
  moved: number;
  /** Requests whose decision would change but not their model. */
  sameModelOtherDecision: number;
  /** Requests no decision would match, with no default (they would get 400). */
  unmatched: number;
  /** The most common moves, `virtual: decision (model) -> decision (model)`. */
  moves: Array<{ virtualModel: string; from: string; to: string; count: number }>;
  /** Signals the new rules read that the records do not hold, per virtual model, with how many requests lacked them. */
  unrecorded: Array<{ virtualModel: string; signal: string; requests: number }>;
  /** Records of a virtual model from before it had rules recorded (no `semantic` field): not re-decided. */
  withoutSignals: number;
}

/** Parses and checks a rules file; throws naming the virtual model and the field. */
export function readRulesFile(value: unknown): Map<string, CompiledRules> {
  if (!value || typeof value !== "object" || Array.isArray(value)) throw new Error("a rules file is a JSON object: virtual model name -> its config with `semantic`");
  const out = new Map<string, CompiledRules>();
  for (const [name, config] of Object.entries(value as RulesFile)) {
    const err = validateModelConfig(config, name);
    if (err) throw new Error(`${name}: ${err}`);
    if (!config.semantic) throw new Error(`${name}: /semantic: the config has no rules`);
    out.set(name, compileRules(name, config.semantic));
  }
  if (out.size === 0) throw new Error("the rules file names no virtual model");
  return out;
}

const MAX_MOVES = 50;
/** Distinct moves counted (decisions x models is small; the bound is a guard). */
const MAX_MOVE_KINDS = 10_000;

/** Re-decides every record of the rules' virtual models. */
export function replayRules(records: Iterable<DecisionRecord>, rules: ReadonlyMap<string, CompiledRules>): RulesReplayReport {
  const r = new RulesReplay(rules);
  for (const rec of records) r.offer(rec);
  return r.finish();
}

/** Re-decides records one at a time (a window is streamed, never held). */
export class RulesReplay {
  private readonly report: RulesReplayReport;
  private readonly moves = new Map<string, { virtualModel: string; from: string; to: string; count: number }>();
  private readonly unrecorded = new Map<string, { virtualModel: string; signal: string; requests: number }>();

  constructor(private readonly rules: ReadonlyMap<string, CompiledRules>) {
    this.report = { virtualModels: [...rules.keys()], requests: 0, moved: 0, sameModelOtherDecision: 0, unmatched: 0, moves: [], unrecorded: [], withoutSignals: 0 };
  }

  offer(rec: DecisionRecord): void {
    const report = this.report;
    if (rec.pd?.leg === "prefill") return;
    const sem = rec.semantic;
    const vm = sem?.virtualModel ?? rec.model;
    const r = this.rules.get(vm);
    if (!r) return;
    report.requests++;
    if (!sem) {
      report.withoutSignals++;
      return;
    }
    const values: Record<string, { value: boolean; measure?: number | string }> = {};
    for (const s of r.signals) {
      const recorded = sem.signals[s.name];
      const v = judgeRecorded(s, recorded);
      if (v === undefined) {
        const key = `${vm}\0${s.name}`;
        const u = this.unrecorded.get(key) ?? { virtualModel: vm, signal: s.name, requests: 0 };
        u.requests++;
        this.unrecorded.set(key, u);
      }
      values[s.name] = { value: v === true, ...(v !== undefined && recorded?.measure !== undefined ? { measure: recorded.measure } : {}) };
    }
    if (r.groups) applyGroups(r.signals, values);
    const { winner } = decide(r, values);
    const recordedModel = rec.outcome === "rejected" ? "(rejected)" : rec.model;
    const from = `${sem.decision} (${recordedModel})`;
    if (!winner) {
      report.unmatched++;
      if (rec.outcome !== "rejected") this.move(vm, from, "(none) (400)");
      return;
    }
    if (winner.action.model !== recordedModel) this.move(vm, from, `${winner.name} (${winner.action.model})`);
    else if (winner.name !== sem.decision) report.sameModelOtherDecision++;
  }

  private move(vm: string, from: string, to: string): void {
    this.report.moved++;
    const key = `${vm}\0${from}\0${to}`;
    const m = this.moves.get(key) ?? { virtualModel: vm, from, to, count: 0 };
    m.count++;
    if (this.moves.size < MAX_MOVE_KINDS || this.moves.has(key)) this.moves.set(key, m);
  }

  finish(): RulesReplayReport {
    return { ...this.report, moves: [...this.moves.values()].sort((a, b) => b.count - a.count).slice(0, MAX_MOVES), unrecorded: [...this.unrecorded.values()].sort((a, b) => b.requests - a.requests) };
  }
}
