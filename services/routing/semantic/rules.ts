/**
 * A virtual model's rules (schemas/semantic.ts) checked beyond their schema and compiled for the
 * request path. Pure: regexes compile with RE2 (re2-wasm), whose matching time is linear in the
 * text, so no rule can backtrack catastrophically; a pattern RE2 refuses (backreferences,
 * lookaround) is refused by `config set` naming the signal.
 */
import { createHash } from "node:crypto";
import { type Re2Constructor, languageDetector, re2Class } from "./lazy-libs.js";

type RE2 = InstanceType<Re2Constructor>;
import type { Rule, SemanticAction, SemanticConfig, Signal } from "../../../schemas/semantic.js";
import { parseStrategy } from "../strategies/registry.js";

const SIGNAL_NAME = /^[A-Za-z0-9._-]{1,64}$/;

/** Deepest `all` / `any` / `not` nesting accepted in a rule. */
export const MAX_RULE_DEPTH = 8;
/** Characters of text a text signal reads by default (the start of its text). */
export const DEFAULT_MAX_CLASSIFIED_CHARS = 4096;
export const DEFAULT_EMBEDDING_TIMEOUT_MS = 50;
/** Characters a regex signal reads by default (RE2 compiled to WebAssembly costs ~40 ns a character). */
export const DEFAULT_REGEX_MAX_CHARS = 1024;

export type Scope = "last-user" | "conversation";

export type CompiledSignal =
  | { kind: "keywords"; name: string; def: string; scope: Scope; keywords: string[]; all: boolean; caseSensitive: boolean }
  | { kind: "regex"; name: string; def: string; scope: Scope; re: RE2; maxChars: number }
  | { kind: "prompt-tokens"; name: string; def: string; gte?: number; lt?: number }
  | { kind: "language"; name: string; def: string; scope: Scope; languages: Set<string> }
  | { kind: "header"; name: string; def: string; header: string; values?: Set<string> }
  | { kind: "user"; name: string; def: string; users?: Set<string>; classes?: Set<string> }
  | { kind: "similarity"; name: string; def: string; scope: Scope; examples: string[]; threshold: number; lexicalThreshold: number; group?: string };

export interface CompiledDecision {
  name: string;
  priority: number;
  /** Position in the config's list (equal priorities: the first listed wins). */
  index: number;
  when: Rule;
  action: SemanticAction;
}

export interface CompiledRules {
  /** The virtual model's name. */
  model: string;
  signals: CompiledSignal[];
  /** Highest priority first, then list order. */
  decisions: CompiledDecision[];
  default?: SemanticAction;
  embeddingModel?: string;
  embeddingTimeoutMs: number;
  maxChars: number;
  /** Scopes some text signal reads (the stage extracts only these). */
  scopes: ReadonlySet<Scope>;
  /** Some similarity signal belongs to a group (signals.ts applyGroups). */
  groups: boolean;
  /** Every keywords signal's words, scanned once per text (one scanner per scope and case mode). */
  keywordScans: KeywordScan[];
}

/** One pass over a text that finds every keyword of every keywords signal reading it. */
export interface KeywordScan {
  scope: Scope;
  caseSensitive: boolean;
  /**
   * Global regexes of whole-word keyword alternations. A keyword contained in another goes to a
   * later layer, so that the longer one matching does not hide it (matches never overlap).
   */
  layers: RegExp[];
}

/**
 * Compiled regexes by pattern and flags. RE2 objects live in WebAssembly memory that re2-wasm
 * never frees, so they are shared and bounded: a gateway re-checking configs as they change
 * compiles each distinct pattern once.
 */
const REGEXES = new Map<string, RE2>();
const MAX_REGEXES = 4096;

function compileRegex(pattern: string, caseSensitive: boolean): RE2 {
  const flags = caseSensitive ? "u" : "iu";
  const key = `${flags}/${pattern}`;
  let re = REGEXES.get(key);
  if (!re) {
    re = new (re2Class())(pattern, flags);
    if (REGEXES.size >= MAX_REGEXES) REGEXES.clear();
    REGEXES.set(key, re);
  }
  return re;
}

/**
 * The part of a signal's definition that decides what is *measured* (replay re-uses a recorded
 * measure only under the same measurement; thresholds and lists that judge it may change).
 */
function measurementOf(s: Signal): unknown {
  switch (s.type) {
    case "prompt-tokens":
      return { type: s.type };
    case "language":
      return { type: s.type, scope: s.scope ?? "last-user" };
    case "similarity":
      return { type: s.type, scope: s.scope ?? "last-user", examples: s.examples };
    default:
      return s;
  }
}

/** A short hash of a signal's measurement (recorded with its value). */
export function signalDef(s: Signal): string {
  return createHash("sha256").update(JSON.stringify(measurementOf(s))).digest("hex").slice(0, 12);
}

/** The signal names a rule reads, with their JSON-pointer paths; throws (with the path) past MAX_RULE_DEPTH. */
function ruleRefs(rule: Rule, path: string, depth: number, out: Array<[string, string]>): void {
  if (depth > MAX_RULE_DEPTH) throw new Error(`${path}: rules nest at most ${MAX_RULE_DEPTH} levels`);
  if (typeof rule === "string") out.push([rule, path]);
  else if ("all" in rule) {
    for (const [i, r] of rule.all.entries()) ruleRefs(r, `${path}/all/${i}`, depth + 1, out);
  } else if ("any" in rule) {
    for (const [i, r] of rule.any.entries()) ruleRefs(r, `${path}/any/${i}`, depth + 1, out);
  } else ruleRefs(rule.not, `${path}/not`, depth + 1, out);
}

/** The signal names a rule reads. */
export function signalsOfRule(rule: Rule): string[] {
  const out: Array<[string, string]> = [];
  ruleRefs(rule, "", 0, out);
  return out.map(([n]) => n);
}

function checkAction(a: SemanticAction, where: string, self: string): string | undefined {
  if (a.model === self) return `${where}/model: ${JSON.stringify(self)} targets the virtual model itself (a cycle)`;
  if (a.routingStrategy) {
    try {
      parseStrategy(a.routingStrategy);
    } catch (e) {
      return `${where}/routingStrategy: ${(e as Error).message}`;
    }
  }
  return undefined;
}

/**
 * What a schema cannot check in a virtual model's `semantic` config: every rule names defined
 * signals and nests at most MAX_RULE_DEPTH, every regex compiles under RE2, no decision targets
 * the virtual model itself, decision names are unique, every strategy parses. Returns the first
 * error, prefixed with its JSON pointer (`/semantic/...`), or undefined.
 */
export function semanticConfigError(model: string, c: SemanticConfig): string | undefined {
  for (const [name, s] of Object.entries(c.signals)) {
    if (!SIGNAL_NAME.test(name)) return `/semantic/signals/${name.slice(0, 64)}: signal names are 1-64 characters of A-Z a-z 0-9 . _ -`;
    if (s.type === "regex") {
      try {
        compileRegex(s.pattern, s.caseSensitive === true);
      } catch (e) {
        return `/semantic/signals/${name}/pattern: not a valid RE2 regular expression (${(e as Error).message.slice(0, 200)})`;
      }
    }
    // Loads the detector when the config is checked (as it arrives), not on its first request.
    if (s.type === "language") languageDetector();
    if (s.type === "prompt-tokens" && s.gte === undefined && s.lt === undefined) return `/semantic/signals/${name}: give gte, lt or both`;
    if (s.type === "prompt-tokens" && s.gte !== undefined && s.lt !== undefined && s.lt <= s.gte) return `/semantic/signals/${name}/lt: must be greater than gte`;
    if (s.type === "user" && !s.users && !s.classes) return `/semantic/signals/${name}: give users, classes or both`;
  }
  const names = new Set<string>();
  for (const [i, d] of c.decisions.entries()) {
    if (names.has(d.name)) return `/semantic/decisions/${i}/name: ${JSON.stringify(d.name)} is used by an earlier decision`;
    names.add(d.name);
    const refs: Array<[string, string]> = [];
    try {
      ruleRefs(d.when, `/semantic/decisions/${i}/when`, 0, refs);
    } catch (e) {
      return (e as Error).message;
    }
    for (const [ref, path] of refs) {
      if (!Object.hasOwn(c.signals, ref)) return `${path}: unknown signal ${JSON.stringify(ref)}; defined: ${Object.keys(c.signals).join(", ") || "(none)"}`;
    }
    const e = checkAction(d.action, `/semantic/decisions/${i}/action`, model);
    if (e) return e;
  }
  if (c.default) {
    const e = checkAction(c.default, "/semantic/default", model);
    if (e) return e;
  }
  if (c.embeddingModel === model) return `/semantic/embeddingModel: ${JSON.stringify(model)} is the virtual model itself`;
  return undefined;
}

/** The models a virtual model's actions target (and its embedding model), with their paths: `config set` checks each is served. */
export function targetModels(c: SemanticConfig): Array<{ model: string; path: string; profile?: string }> {
  const out = c.decisions.map((d, i) => ({ model: d.action.model, path: `/semantic/decisions/${i}/action/model`, ...(d.action.profile ? { profile: d.action.profile } : {}) }));
  if (c.default) out.push({ model: c.default.model, path: "/semantic/default/model", ...(c.default.profile ? { profile: c.default.profile } : {}) });
  if (c.embeddingModel) out.push({ model: c.embeddingModel, path: "/semantic/embeddingModel" });
  return out;
}

function compileSignal(name: string, s: Signal): CompiledSignal {
  const def = signalDef(s);
  switch (s.type) {
    case "keywords": {
      const cs = s.caseSensitive === true;
      return { kind: "keywords", name, def, scope: s.scope ?? "last-user", keywords: s.keywords.map((k) => (cs ? k : k.toLowerCase())), all: s.match === "all", caseSensitive: cs };
    }
    case "regex":
      return { kind: "regex", name, def, scope: s.scope ?? "last-user", re: compileRegex(s.pattern, s.caseSensitive === true), maxChars: s.maxChars ?? DEFAULT_REGEX_MAX_CHARS };
    case "prompt-tokens":
      return { kind: "prompt-tokens", name, def, ...(s.gte !== undefined ? { gte: s.gte } : {}), ...(s.lt !== undefined ? { lt: s.lt } : {}) };
    case "language":
      return { kind: "language", name, def, scope: s.scope ?? "last-user", languages: new Set(s.languages) };
    case "header":
      return { kind: "header", name, def, header: s.name, ...(s.values ? { values: new Set(s.values) } : {}) };
    case "user":
      return { kind: "user", name, def, ...(s.users ? { users: new Set(s.users) } : {}), ...(s.classes ? { classes: new Set(s.classes) } : {}) };
    case "similarity":
      return { kind: "similarity", name, def, scope: s.scope ?? "last-user", examples: s.examples, threshold: s.threshold, lexicalThreshold: s.lexicalThreshold ?? Math.max(0, s.threshold), ...(s.group ? { group: s.group } : {}) };
  }
}

const WORD_START = /^[\p{L}\p{N}_]/u;
const WORD_END = /[\p{L}\p{N}_]$/u;

/**
 * One regular expression for "any of these keywords, as whole words": an alternation of escaped
 * literals, each bounded by "no word character" on a side where the keyword itself starts or ends
 * with one. Only literals and single-character lookarounds: its matching time is bounded by the
 * text's length times the keywords' total length, with no backtracking to explode.
 */
export function keywordsRegex(keywords: readonly string[], caseSensitive: boolean, global = false): RegExp {
  const alts = [...keywords].sort((a, b) => b.length - a.length).map((k) => {
    const lit = k.replace(/[.*+?^${}()|[\]\\/]/g, "\\$&");
    return `${WORD_START.test(k) ? "(?<![\\p{L}\\p{N}_])" : ""}${lit}${WORD_END.test(k) ? "(?![\\p{L}\\p{N}_])" : ""}`;
  });
  return new RegExp(alts.join("|"), `${global ? "g" : ""}${caseSensitive ? "u" : "iu"}`);
}

/** Keyword scanners for the rules' keywords signals: per scope and case mode, keywords layered so none hides another. */
function keywordScansOf(signals: readonly CompiledSignal[]): KeywordScan[] {
  const byMode = new Map<string, { scope: Scope; caseSensitive: boolean; words: Set<string> }>();
  for (const s of signals) {
    if (s.kind !== "keywords") continue;
    const key = `${s.scope}/${s.caseSensitive}`;
    const m = byMode.get(key) ?? { scope: s.scope, caseSensitive: s.caseSensitive, words: new Set<string>() };
    for (const k of s.keywords) m.words.add(k);
    byMode.set(key, m);
  }
  return [...byMode.values()].map(({ scope, caseSensitive, words }) => {
    const layers: RegExp[] = [];
    let left = [...words];
    while (left.length > 0) {
      // A word inside another still-unplaced word waits for a later layer.
      const layer = left.filter((w) => !left.some((o) => o !== w && o.includes(w)));
      layers.push(keywordsRegex(layer, caseSensitive, true));
      left = left.filter((w) => !layer.includes(w));
    }
    return { scope, caseSensitive, layers };
  });
}

/** Compiles a checked config (semanticConfigError returned undefined for it). */
export function compileRules(model: string, c: SemanticConfig): CompiledRules {
  const signals = Object.entries(c.signals).map(([n, s]) => compileSignal(n, s));
  const decisions = c.decisions.map((d, index) => ({ name: d.name, priority: d.priority, index, when: d.when, action: d.action })).sort((a, b) => b.priority - a.priority || a.index - b.index);
  const scopes = new Set<Scope>();
  for (const s of signals) if ("scope" in s) scopes.add(s.scope);
  return {
    model,
    signals,
    decisions,
    ...(c.default ? { default: c.default } : {}),
    ...(c.embeddingModel ? { embeddingModel: c.embeddingModel } : {}),
    embeddingTimeoutMs: c.embeddingTimeoutMs ?? DEFAULT_EMBEDDING_TIMEOUT_MS,
    maxChars: c.maxClassifiedChars ?? DEFAULT_MAX_CLASSIFIED_CHARS,
    scopes,
    groups: signals.some((s) => s.kind === "similarity" && s.group !== undefined),
    keywordScans: keywordScansOf(signals),
  };
}

/** Compiled rules per config object: a config is compiled once, when first used after it changed. */
const COMPILED = new WeakMap<SemanticConfig, CompiledRules>();

export function compiledRulesFor(model: string, c: SemanticConfig): CompiledRules {
  let r = COMPILED.get(c);
  if (!r || r.model !== model) {
    r = compileRules(model, c);
    COMPILED.set(c, r);
  }
  return r;
}
