/**
 * The Grafana dashboard (jetroute-dashboard.json) against the metrics the code really exposes.
 *
 * Where the names come from: the registries are built in-process and rendered, as a scrape of
 * /metrics would render them, then parsed with the metrics-scraper's exposition parser.
 * - gateway: a GatewayMetrics (services/gateway/metrics.ts) with the tokenizer's gauge registered
 *   on it, as gateway.ts does. Its sources are the code's own objects where they can be built
 *   without NATS: a Director with a P/D leg client (pdStats + legs.stats), a StrictCommitter, the
 *   ext_proc connection counters of guardResetBudget. The figures gateway.ts spells out inline
 *   (ledger, prefix index, API keys) and its view names are read from its source text. One
 *   decision per strategy of the registry and per outcome of the DecisionRecord schema fills the
 *   labelled counter.
 * - pod-watcher, metrics-scraper, kv-bridge: statsRegistry (services/shared/metrics-server.ts)
 *   over their stats objects. kv-bridge: the real newStats(). pod-watcher: a real
 *   SourcePublisher's stats plus the keys each mode adds, read from the source text of
 *   pod-watcher.ts and kubernetes.ts (those objects only exist inside a running watcher, which
 *   needs NATS). metrics-scraper: likewise read from scraper.ts and command.ts.
 * - engine metrics (vllm:*, sglang:*): not jetroute's. The simulator (services/sim) renders them
 *   under vLLM V1 and SGLang names, and those names are what the metrics-scraper reads from real
 *   engines; panels marked "(engine)" may use them and nothing else outside jetroute's own.
 *
 * Every PromQL expression is tokenized (a small PromQL lexer below: strings, numbers, durations,
 * range brackets and Grafana variables skipped; functions, aggregators and keywords told apart from
 * metric names) and checked: each selected metric is a sample name the registries expose (so a
 * histogram must be named with _bucket/_sum/_count, a counter with _total), each label used in a
 * matcher or a grouping exists on it (or is one Prometheus attaches to every target), and each
 * value matched on a label whose values the code enumerates (figure, name, reason, state, view,
 * outcome, strategy) is one it emits.
 */
import { execFileSync } from "node:child_process";
import { EventEmitter } from "node:events";
import { readFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";
import { parseAllDocuments } from "yaml";
import { DecisionRecord } from "../../schemas/events.js";
import { guardResetBudget } from "../../services/extproc/reset-budget.js";
import { GatewayMetrics, type GatewayMetricsSources } from "../../services/gateway/metrics.js";
import { type StrictCommitOptions, StrictCommitter } from "../../services/gateway/strict-commit.js";
import { Tokenizer } from "../../services/gateway/tokenization.js";
import { newStats } from "../../services/kv-bridge/pod-bridge.js";
import { parsePrometheusText } from "../../services/metrics-scraper/prom-text.js";
import { SourcePublisher, type SourcePublisherOptions } from "../../services/pod-watcher/source-publisher.js";
import { Director } from "../../services/routing/director.js";
import { strategyNames } from "../../services/routing/strategies/registry.js";
import { statsRegistry } from "../../services/shared/metrics-server.js";
import type { EngineSnapshot } from "../../services/sim/engine.js";
import { createPodMetrics, ENGINE_KINDS } from "../../services/sim/metrics.js";
import { renderPdMetrics } from "../../services/sim/pd-stats.js";
import { GatewayState } from "../../services/views/gateway-state.js";

const HERE = path.dirname(fileURLToPath(import.meta.url));
const ROOT = path.resolve(HERE, "../..");
const DASHBOARD_FILE = "jetroute-dashboard.json";
const dashboardText = readFileSync(path.join(HERE, DASHBOARD_FILE), "utf8");
const dashboard = JSON.parse(dashboardText) as Dashboard;
/** Grafana interpolates the datasource variable in every reference. */
// biome-ignore lint/suspicious/noTemplateCurlyInString: Grafana's variable syntax, not a JS template
const DATASOURCE = { type: "prometheus", uid: "${datasource}" };
const source = (rel: string) => readFileSync(path.join(ROOT, rel), "utf8");

// ---------------------------------------------------------------- the dashboard's shape
interface DataSourceRef {
  type?: string;
  uid?: string;
}
interface Target {
  refId?: string;
  expr?: string;
  datasource?: DataSourceRef;
}
interface Panel {
  id?: number;
  type?: string;
  title?: string;
  datasource?: DataSourceRef;
  gridPos?: { x: number; y: number; w: number; h: number };
  targets?: Target[];
  panels?: Panel[];
  fieldConfig?: { defaults?: { unit?: string } };
}
interface Variable {
  name: string;
  type: string;
  query?: string | { query?: string };
  datasource?: DataSourceRef;
}
interface Dashboard {
  uid?: string;
  title?: string;
  schemaVersion?: number;
  panels: Panel[];
  templating: { list: Variable[] };
}

/** Every panel, those inside collapsed rows included. */
const allPanels: Panel[] = dashboard.panels.flatMap((p) => [p, ...(p.panels ?? [])]);
const queryPanels = allPanels.filter((p) => p.type !== "row");
const exprsOf = (p: Panel) => (p.targets ?? []).map((t) => t.expr ?? "");

// ---------------------------------------------------------------- what the code exposes
interface MetricInfo {
  origin: "jetroute" | "engine";
  labels: Set<string>;
  /** Values seen per label. */
  values: Map<string, Set<string>>;
}
type Catalogue = Map<string, MetricInfo>;

/** Labels whose values the code enumerates, so a matcher on them can be checked value by value. */
const ENUMERATED_LABELS = new Set(["figure", "name", "reason", "state", "view", "outcome", "strategy"]);

function addExposition(cat: Catalogue, text: string, origin: MetricInfo["origin"], keep: (name: string) => boolean = () => true): void {
  const parsed = parsePrometheusText(text);
  expect(parsed.errors, `${origin} exposition parses`).toEqual([]);
  for (const family of parsed.families.values()) {
    for (const s of family.samples) {
      if (!keep(s.name)) continue;
      let info = cat.get(s.name);
      if (!info) cat.set(s.name, (info = { origin, labels: new Set(), values: new Map() }));
      for (const [k, v] of Object.entries(s.labels)) {
        info.labels.add(k);
        let vs = info.values.get(k);
        if (!vs) info.values.set(k, (vs = new Set()));
        vs.add(v);
      }
    }
  }
}

/** Keys of the object literals that follow `pattern` in a source file (flat literals only). */
function literalKeys(rel: string, pattern: RegExp): string[] {
  const text = source(rel);
  const keys: string[] = [];
  for (const m of text.matchAll(new RegExp(pattern.source, "g"))) {
    const start = (m.index ?? 0) + m[0].length;
    const end = text.indexOf("}", start);
    for (const k of text.slice(start, end).matchAll(/(?:^|[{,])\s*(\w+)\s*:/g)) keys.push(k[1] as string);
  }
  expect(keys.length, `${rel}: no object literal after ${pattern} (did the code move?)`).toBeGreaterThan(0);
  return keys;
}
const zeros = (keys: readonly string[]) => Object.fromEntries(keys.map((k) => [k, 0]));

async function gatewayExposition(): Promise<string> {
  const gatewayTs = "services/gateway/gateway.ts";
  const followersTs = "services/gateway/followers.ts";
  const viewNames = [...(/views: \[([^\]]*)\]/.exec(source(followersTs))?.[1] ?? "").matchAll(/"([^"]+)"/g)].map((m) => m[1] as string);
  expect(viewNames, `${followersTs} names its views`).toContain("pods");
  type Sources = GatewayMetricsSources;
  const ledger = zeros(literalKeys(gatewayTs, /ledger: \(\) => \(\{/)) as ReturnType<Sources["ledger"]>;
  const prefixIndex = zeros(literalKeys(gatewayTs, /prefixIndex: \(\) => \{[^}]*?return \{/)) as ReturnType<Sources["prefixIndex"]>;
  const apiKeys = zeros(literalKeys(gatewayTs, /apiKeys: \(\) => \(\{/)) as ReturnType<NonNullable<Sources["apiKeys"]>>;
  const director = new Director({
    gatewayId: "gw",
    defaultStrategy: "pd",
    chargeTtlMs: 60_000,
    state: new GatewayState({ self: "gw" }),
    sink: { charge() {}, release() {}, decision() {} },
    pdLegClient: { post: () => Promise.reject(new Error("not called")) },
  });
  const strict = new StrictCommitter({ director } as StrictCommitOptions);
  // guardResetBudget counts the sessions of the grpc server's HTTP/2 servers: one that never gets any.
  const connections = guardResetBudget({ http2Servers: new Map([[new EventEmitter(), null]]) } as unknown as Parameters<typeof guardResetBudget>[0]);
  expect(connections, "guardResetBudget found the HTTP/2 server").toBeDefined();
  const sources: Sources = {
    followers: () => viewNames.map((view) => ({ view, lastSeq: 1, applied: 1, invalid: 0, deadLetterPublishFailures: 0, reopens: 0, pending: 0, delayMs: 0 })),
    ledger: () => ledger,
    prefixIndex: () => prefixIndex,
    strict: () => strict.stats,
    inFlight: () => 0,
    ready: () => true,
    apiKeys: () => apiKeys,
    connections: () => connections,
    // As gateway.ts merges them.
    pd: () => ({ ...director.pdStats, ...director.legs?.stats }),
    // These three are turned into labels by metrics.ts itself, whatever the keys.
    outboxDrops: () => ({ closed: 0, tooLarge: 0, failed: 0 }),
    podSources: () => [{ silent: false }],
    usage: () => ({ foreignGateways: 0, foreignEntries: 0, foreignEvicted: 0, sent: 0, truncatedUsers: 0 }),
  };
  expect(Object.keys(sources.pd?.() ?? {}), "the director has P/D legs").toContain("prefillAttempts");
  // A pool, so the series carry every default label a pooled replica adds.
  const metrics = new GatewayMetrics("gw", sources, "pool-a");
  new Tokenizer().registerMetrics(metrics.registry);
  const outcomes = schemaLiterals(DecisionRecord.properties.outcome);
  expect(outcomes).toContain("rejected");
  for (const strategy of [...strategyNames(), "least-request:1,random:1", "no-such-strategy"]) {
    metrics.pick(strategy, 0.0001);
    for (const outcome of outcomes) metrics.decision({ strategy, outcome, status: 200 } as unknown as DecisionRecord);
  }
  return metrics.render();
}

/** The `const` values of a TypeBox union of literals (nested unions flattened). */
function schemaLiterals(schema: unknown): string[] {
  const s = schema as { const?: unknown; anyOf?: unknown[] };
  if (typeof s.const === "string") return [s.const];
  return (s.anyOf ?? []).flatMap(schemaLiterals);
}

async function publisherExpositions(): Promise<string[]> {
  const publisher = new SourcePublisher({} as SourcePublisherOptions);
  const podWatcher = {
    ...zeros(literalKeys("services/pod-watcher/pod-watcher.ts", /const own = \{/)),
    ...zeros(literalKeys("services/pod-watcher/kubernetes.ts", /const own = \{/)),
    ...publisher.stats,
    ...zeros(literalKeys("services/pod-watcher/pod-watcher.ts", /get stats\(\) \{\s*return \{/)),
    ...zeros(literalKeys("services/pod-watcher/kubernetes.ts", /get stats\(\) \{\s*return \{/)),
  };
  const scraper = {
    ...zeros(literalKeys("services/metrics-scraper/scraper.ts", /const stats = \{/)),
    ...zeros(literalKeys("services/metrics-scraper/command.ts", /statsRegistry\("metrics-scraper", \(\) => \(\{/)),
  };
  return Promise.all([statsRegistry("pod-watcher", () => podWatcher).metrics(), statsRegistry("metrics-scraper", () => scraper).metrics(), statsRegistry("kv-bridge", () => newStats()).metrics()]);
}

function engineExpositions(): string[] {
  const snapshot = {
    nowMs: 0,
    waiting: 0,
    running: 0,
    usedBlocks: 0,
    cachedBlocks: 0,
    totalBlocks: 16,
    kvUsage: 0,
    heldRequests: 0,
    totals: { requests: 0, finished: { stop: 0, length: 0, abort: 0 }, promptTokens: 0, generationTokens: 0, preemptions: 0, prefixCacheQueries: 0, prefixCacheHits: 0 },
  } satisfies EngineSnapshot;
  const ctx = { model: "m", maxModelLen: 4096, blockSize: 16, numGpuBlocks: 16, prefixCaching: true };
  const pd = { reads: 0, misses: 0, localPrefills: 0, failures: { refused: 0, timeout: 0, unknown_request: 0, bad_response: 0 }, leaks: 0, heldRequests: 0, decodePreallocQueue: 0, prefillBootstrapQueue: 0 };
  return ENGINE_KINDS.flatMap((kind) => [createPodMetrics(kind, ctx).render(snapshot), renderPdMetrics(kind, "m", pd)]);
}

async function buildCatalogue(): Promise<Catalogue> {
  const cat: Catalogue = new Map();
  addExposition(cat, await gatewayExposition(), "jetroute");
  for (const text of await publisherExpositions()) addExposition(cat, text, "jetroute");
  // Only the engines' own names: the simulator's jetroute_sim_* extras exist on no real engine.
  for (const text of engineExpositions()) addExposition(cat, text, "engine", (n) => n.startsWith("vllm:") || n.startsWith("sglang:"));
  return cat;
}

/**
 * Labels Prometheus puts on every series it scrapes through a ServiceMonitor or PodMonitor, plus
 * the targetLabels of the ServiceMonitors here (sanitized as Prometheus does).
 */
function targetLabels(): Set<string> {
  const labels = new Set(["job", "instance", "namespace", "service", "pod", "container", "endpoint"]);
  for (const doc of parseAllDocuments(readFileSync(path.join(HERE, "service-monitors.yaml"), "utf8"))) {
    const v = doc.toJS() as { spec?: { targetLabels?: string[] } } | null;
    for (const l of v?.spec?.targetLabels ?? []) labels.add(l.replace(/[^a-zA-Z0-9_]/g, "_"));
  }
  return labels;
}

// ---------------------------------------------------------------- a small PromQL lexer and reader
type TokenKind = "ident" | "string" | "number" | "variable" | "punct";
interface Token {
  kind: TokenKind;
  text: string;
  /** Strings: the unquoted value. */
  value?: string;
}

const PUNCT = ["=~", "!~", "!=", "==", "<=", ">=", "{", "}", "(", ")", "[", "]", ",", "=", "<", ">", "+", "-", "*", "/", "%", "^", "@", ":"];

function lexPromql(expr: string): Token[] {
  const out: Token[] = [];
  let i = 0;
  while (i < expr.length) {
    const c = expr[i] as string;
    if (/\s/.test(c)) {
      i++;
    } else if (c === "#") {
      while (i < expr.length && expr[i] !== "\n") i++;
    } else if (c === '"' || c === "'" || c === "`") {
      let j = i + 1;
      let value = "";
      while (j < expr.length && expr[j] !== c) {
        if (expr[j] === "\\" && c !== "`") j++;
        value += expr[j] ?? "";
        j++;
      }
      if (j >= expr.length) throw new Error(`unterminated string in ${JSON.stringify(expr)}`);
      out.push({ kind: "string", text: expr.slice(i, j + 1), value });
      i = j + 1;
    } else if (c === "$") {
      // Grafana variables: $name, ${name}, ${name:format}.
      const m = /^\$(\{[^}]*\}|\w+)/.exec(expr.slice(i));
      if (!m) throw new Error(`a lone $ in ${JSON.stringify(expr)}`);
      out.push({ kind: "variable", text: m[0] });
      i += m[0].length;
    } else if (/[0-9.]/.test(c)) {
      // Numbers and durations (0.99, 1e3, 5m, 1h30m): letters included.
      const m = /^[0-9.][0-9a-zA-Z_.]*/.exec(expr.slice(i)) as RegExpExecArray;
      out.push({ kind: "number", text: m[0] });
      i += m[0].length;
    } else if (/[a-zA-Z_]/.test(c)) {
      const m = /^[a-zA-Z_][a-zA-Z0-9_:]*/.exec(expr.slice(i)) as RegExpExecArray;
      out.push({ kind: "ident", text: m[0] });
      i += m[0].length;
    } else {
      const p = PUNCT.find((q) => expr.startsWith(q, i));
      if (!p) throw new Error(`unexpected ${JSON.stringify(c)} in ${JSON.stringify(expr)}`);
      out.push({ kind: "punct", text: p });
      i += p.length;
    }
  }
  return out;
}

const FUNCTIONS = new Set(
  (
    "abs absent absent_over_time acos acosh asin asinh atan atanh avg_over_time ceil changes clamp clamp_max clamp_min cos cosh " +
    "count_over_time day_of_month day_of_week day_of_year days_in_month deg delta deriv double_exponential_smoothing exp floor " +
    "histogram_avg histogram_count histogram_fraction histogram_quantile histogram_stddev histogram_stdvar histogram_sum holt_winters " +
    "hour idelta increase irate last_over_time ln log10 log2 mad_over_time max_over_time min_over_time minute month pi predict_linear " +
    "present_over_time quantile_over_time rad rate resets round scalar sgn sin sinh sort sort_by_label sort_by_label_desc sort_desc " +
    "sqrt stddev_over_time stdvar_over_time sum_over_time tan tanh time timestamp vector year"
  ).split(" "),
);
/** Functions that make up labels: the label checks below would have to follow them. */
const LABEL_MAKERS = new Set(["label_replace", "label_join", "count_values", "info"]);
const AGGREGATORS = new Set(["sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "bottomk", "topk", "quantile", "limitk", "limit_ratio"]);
const GROUPING = new Set(["by", "without", "on", "ignoring", "group_left", "group_right"]);
const KEYWORDS = new Set(["and", "or", "unless", "bool", "offset", "atan2", "inf", "nan", "start", "end"]);

interface Matcher {
  label: string;
  op: string;
  value: string;
}
interface Selector {
  metric: string;
  matchers: Matcher[];
}
interface ReadExpr {
  selectors: Selector[];
  /** Label names in by / without / on / ignoring / group_left / group_right. */
  grouping: string[];
  functions: string[];
  variables: string[];
}

/** Metric names, matchers, grouping labels, functions and variables of one PromQL expression. */
function readPromql(expr: string): ReadExpr {
  const toks = lexPromql(expr);
  const r: ReadExpr = { selectors: [], grouping: [], functions: [], variables: [] };
  const at = (i: number) => toks[i];
  const isPunct = (t: Token | undefined, p: string) => t?.kind === "punct" && t.text === p;
  let i = 0;
  const readMatchers = (): Matcher[] => {
    // toks[i] is "{".
    const ms: Matcher[] = [];
    i++;
    while (!isPunct(at(i), "}")) {
      const label = at(i);
      const op = at(i + 1);
      const value = at(i + 2);
      if (label?.kind !== "ident" || op?.kind !== "punct" || !["=", "!=", "=~", "!~"].includes(op.text) || value?.kind !== "string") {
        throw new Error(`cannot read the label matchers of ${JSON.stringify(expr)}`);
      }
      ms.push({ label: label.text, op: op.text, value: value.value ?? "" });
      i += 3;
      if (isPunct(at(i), ",")) i++;
      else if (!isPunct(at(i), "}")) throw new Error(`expected , or } in the matchers of ${JSON.stringify(expr)}`);
    }
    i++;
    return ms;
  };
  while (i < toks.length) {
    const t = toks[i] as Token;
    if (t.kind === "variable") {
      r.variables.push(t.text);
      i++;
    } else if (isPunct(t, "[")) {
      // A range or subquery: durations, a colon, variables such as $__rate_interval.
      i++;
      while (i < toks.length && !isPunct(at(i), "]")) {
        const u = at(i) as Token;
        if (u.kind === "variable") r.variables.push(u.text);
        else if (u.kind !== "number" && !isPunct(u, ":")) throw new Error(`unexpected ${u.text} in a range of ${JSON.stringify(expr)}`);
        i++;
      }
      i++;
    } else if (isPunct(t, "{")) {
      // A selector without a metric name: its name, if any, is in __name__.
      const ms = readMatchers();
      const name = ms.find((m) => m.label === "__name__");
      const rest = ms.filter((m) => m !== name);
      if (!name || (name.op !== "=" && name.op !== "=~")) throw new Error(`a selector without a metric name in ${JSON.stringify(expr)}`);
      for (const metric of alternatives(name.value) ?? [`(regex) ${name.value}`]) r.selectors.push({ metric, matchers: rest });
    } else if (t.kind === "ident") {
      const next = at(i + 1);
      if (GROUPING.has(t.text)) {
        i++;
        if (isPunct(at(i), "(")) {
          i++;
          while (!isPunct(at(i), ")")) {
            const u = at(i);
            if (u?.kind === "ident") r.grouping.push(u.text);
            else if (!isPunct(u, ",")) throw new Error(`unexpected ${u?.text} in a grouping of ${JSON.stringify(expr)}`);
            i++;
          }
          i++;
        }
      } else if (AGGREGATORS.has(t.text) || KEYWORDS.has(t.text)) {
        i++;
      } else if (isPunct(next, "(")) {
        if (LABEL_MAKERS.has(t.text)) throw new Error(`${t.text}() makes labels up, which this checker does not follow`);
        if (!FUNCTIONS.has(t.text)) throw new Error(`unknown function ${t.text}() in ${JSON.stringify(expr)}`);
        r.functions.push(t.text);
        i++;
      } else {
        i++;
        r.selectors.push({ metric: t.text, matchers: isPunct(at(i), "{") ? readMatchers() : [] });
      }
    } else {
      i++;
    }
  }
  return r;
}

/** The literal alternatives of a regex that is nothing but `a|b|c`; undefined for any other regex. */
function alternatives(regex: string): string[] | undefined {
  return /^[\w.:-]+(\|[\w.:-]+)*$/.test(regex) ? regex.split("|") : undefined;
}

/** What is wrong with one expression against the catalogue (empty: nothing). */
function problems(expr: string, cat: Catalogue, extraLabels: ReadonlySet<string>): string[] {
  let r: ReadExpr;
  try {
    r = readPromql(expr);
  } catch (err) {
    return [(err as Error).message];
  }
  const out: string[] = [];
  if (r.selectors.length === 0) out.push(`selects no metric: ${expr}`);
  const known = new Set(extraLabels);
  for (const s of r.selectors) {
    const info = cat.get(s.metric);
    if (!info) {
      out.push(`${s.metric} is not exposed by the code`);
      continue;
    }
    for (const l of info.labels) known.add(l);
    for (const m of s.matchers) {
      if (!info.labels.has(m.label) && !extraLabels.has(m.label)) {
        out.push(`${s.metric} has no label ${m.label}`);
        continue;
      }
      if (!ENUMERATED_LABELS.has(m.label) || m.value.includes("$")) continue;
      const values = m.op === "=" || m.op === "!=" ? [m.value] : alternatives(m.value);
      if (!values) {
        out.push(`${s.metric}{${m.label}${m.op}"${m.value}"}: only a plain alternation can be checked against the values the code emits`);
        continue;
      }
      const emitted = info.values.get(m.label) ?? new Set<string>();
      for (const v of values) if (!emitted.has(v)) out.push(`${s.metric} never has ${m.label}="${v}" (it has: ${[...emitted].sort().join(", ")})`);
    }
  }
  for (const l of r.grouping) if (l !== "le" && !known.has(l)) out.push(`grouping by ${l}, a label none of the selected metrics has`);
  if (r.grouping.includes("le") && !r.selectors.some((s) => s.metric.endsWith("_bucket"))) out.push("grouping by le without a _bucket series");
  if (r.functions.includes("histogram_quantile")) {
    if (!r.selectors.every((s) => s.metric.endsWith("_bucket"))) out.push("histogram_quantile over something other than _bucket series");
    if (!r.grouping.includes("le")) out.push("histogram_quantile without keeping le");
  }
  return out;
}

/** `label_values(selector, label)` or `label_values(label)` (Grafana's variable query). */
function labelValuesProblems(query: string, cat: Catalogue, extraLabels: ReadonlySet<string>): string[] {
  const m = /^label_values\((?:(.*),\s*)?(\w+)\s*\)$/s.exec(query.trim());
  if (!m) return [`not a label_values() query: ${query}`];
  const [, selector, label] = m as unknown as [string, string | undefined, string];
  if (selector === undefined) return extraLabels.has(label) || [...cat.values()].some((i) => i.labels.has(label)) ? [] : [`no metric has label ${label}`];
  const out = problems(selector, cat, extraLabels);
  const metrics = readPromql(selector).selectors.map((s) => cat.get(s.metric));
  if (!extraLabels.has(label) && !metrics.some((i) => i?.labels.has(label))) out.push(`${selector} has no label ${label}`);
  return out;
}

// ---------------------------------------------------------------- the tests
describe("the PromQL reader", () => {
  it("finds metric names, matchers and grouping labels, and skips functions, keywords, strings, ranges and variables", () => {
    const r = readPromql(
      `histogram_quantile(0.99, sum by (le, strategy) (rate(a_bucket{x="{b}", y=~"c|d", z!~"sum(e)"}[$__rate_interval] offset 5m))) / on(gateway) group_left() (b_total > bool 0) or max without (f) ({__name__=~"vllm:g|sglang:h", m="$model"})`,
    );
    expect(r.selectors.map((s) => s.metric)).toEqual(["a_bucket", "b_total", "vllm:g", "sglang:h"]);
    expect(r.selectors[0]?.matchers).toEqual([
      { label: "x", op: "=", value: "{b}" },
      { label: "y", op: "=~", value: "c|d" },
      { label: "z", op: "!~", value: "sum(e)" },
    ]);
    expect(r.grouping).toEqual(["le", "strategy", "gateway", "f"]);
    expect(r.functions).toEqual(["histogram_quantile", "rate"]);
    expect(r.variables).toEqual(["$__rate_interval"]); // $model sits in a string
    expect(readPromql("rate(x[5m:30s])").selectors.map((s) => s.metric)).toEqual(["x"]);
    expect(() => readPromql("made_up_function(x)")).toThrow(/unknown function/);
    expect(() => readPromql('label_replace(x, "a", "$1", "b", "(.*)")')).toThrow(/makes labels up/);
    expect(() => readPromql('x{a="b"')).toThrow();
  });
});

describe("Grafana dashboard (deploy/monitoring/jetroute-dashboard.json)", () => {
  let catalogue: Promise<Catalogue> | undefined;
  const cat = () => (catalogue ??= buildCatalogue());
  const extra = targetLabels();

  it("is a dashboard with a uid, a title, a Prometheus datasource variable and unique panel ids", () => {
    expect(dashboard.uid).toMatch(/^[\w-]{1,40}$/);
    expect(dashboard.title).toBeTruthy();
    expect(dashboard.schemaVersion).toBeGreaterThanOrEqual(36);
    const ds = dashboard.templating.list.find((v) => v.name === "datasource");
    expect(ds).toMatchObject({ type: "datasource", query: "prometheus" });
    const ids = allPanels.map((p) => p.id);
    for (const id of ids) expect(Number.isInteger(id), `panel id ${id}`).toBe(true);
    expect(new Set(ids).size, "panel ids are unique").toBe(ids.length);
  });

  it("every panel has a title, the datasource variable, a unit and queries; every query the datasource too", () => {
    expect(queryPanels.length).toBeGreaterThan(20);
    for (const p of allPanels) expect(p.title?.trim(), `panel ${p.id} has a title`).toBeTruthy();
    for (const p of queryPanels) {
      const where = `panel ${p.id} "${p.title}"`;
      expect(p.datasource, `${where}: datasource`).toEqual(DATASOURCE);
      expect(p.fieldConfig?.defaults?.unit, `${where}: unit`).toBeTruthy();
      expect(p.targets?.length, `${where}: queries`).toBeGreaterThan(0);
      const refIds = (p.targets ?? []).map((t) => t.refId);
      expect(new Set(refIds).size, `${where}: refIds unique`).toBe(refIds.length);
      for (const t of p.targets ?? []) {
        expect(t.expr?.trim(), `${where} ${t.refId}: expr`).toBeTruthy();
        expect(t.datasource ?? p.datasource, `${where} ${t.refId}: datasource`).toEqual(DATASOURCE);
      }
    }
  });

  it("panels sit on the 24-column grid without overlapping", () => {
    const taken = new Map<string, number | undefined>();
    const clashes: string[] = [];
    for (const p of dashboard.panels) {
      const g = p.gridPos;
      expect(g, `panel ${p.id} gridPos`).toBeDefined();
      if (!g) continue;
      expect(g.x >= 0 && g.w > 0 && g.h > 0 && g.x + g.w <= 24, `panel ${p.id} fits in 24 columns`).toBe(true);
      for (let x = g.x; x < g.x + g.w; x++) {
        for (let y = g.y; y < g.y + g.h; y++) {
          const other = taken.get(`${x},${y}`);
          if (other !== undefined) clashes.push(`panel ${p.id} overlaps panel ${other}`);
          taken.set(`${x},${y}`, p.id);
        }
      }
    }
    expect([...new Set(clashes)]).toEqual([]);
  });

  it("every panel query names only metrics, labels and label values the code exposes", async () => {
    const c = await cat();
    const found: string[] = [];
    for (const p of queryPanels) {
      for (const t of p.targets ?? []) for (const problem of problems(t.expr ?? "", c, extra)) found.push(`panel ${p.id} "${p.title}" ${t.refId}: ${problem}`);
    }
    expect(found).toEqual([]);
  });

  it("metrics from outside jetroute appear only in panels marked (engine)", async () => {
    const c = await cat();
    for (const p of queryPanels) {
      const origins = new Set(exprsOf(p).flatMap((e) => readPromql(e).selectors.map((s) => c.get(s.metric)?.origin)));
      expect(origins.has("engine") && !/\(engine\)/.test(p.title ?? ""), `panel "${p.title}" reads engine metrics`).toBe(false);
    }
  });

  it("the template variables query metrics and labels that exist; queries use only defined variables", async () => {
    const c = await cat();
    const vars = dashboard.templating.list;
    for (const v of vars.filter((x) => x.type === "query")) {
      expect(v.datasource, `variable ${v.name}`).toEqual(DATASOURCE);
      const q = typeof v.query === "string" ? v.query : (v.query?.query ?? "");
      expect(labelValuesProblems(q, c, extra), `variable ${v.name}`).toEqual([]);
    }
    const defined = new Set(vars.map((v) => v.name));
    const builtIn = new Set(["__rate_interval", "__interval", "__range", "__range_s", "__interval_ms"]);
    const queries = [...queryPanels.flatMap(exprsOf), ...vars.map((v) => (typeof v.query === "string" ? v.query : (v.query?.query ?? "")))];
    for (const e of queries) {
      for (const ref of e.matchAll(/\$\{?(\w+)/g)) expect(defined.has(ref[1] as string) || builtIn.has(ref[1] as string), `$${ref[1]} in ${e}`).toBe(true);
    }
  });

  it("the checker rejects what the code does not expose (it can fail)", async () => {
    const c = await cat();
    const bad: Array<[string, RegExp]> = [
      ["sum(rate(jetroute_gateway_routed_requests_total[5m]))", /jetroute_gateway_routed_requests_total is not exposed/],
      ["histogram_quantile(0.99, sum by (le) (rate(jetroute_gateway_pick_seconds[5m])))", /jetroute_gateway_pick_seconds is not exposed/],
      ["rate(jetroute_gateway_requests[5m])", /jetroute_gateway_requests is not exposed/],
      ["jetroute_gateway_ttft_seconds_bucket", /not exposed/],
      ['jetroute_gateway_pd{figure="prefill_retries"}', /never has figure="prefill_retries"/],
      ['jetroute_kv_bridge_stat{name=~"deadLetters|dead_letters"}', /never has name="dead_letters"/],
      ['jetroute_gateway_ledger{figure=~"charge.*"}', /only a plain alternation/],
      ["sum by (model) (rate(jetroute_gateway_requests_total[5m]))", /grouping by model/],
      ['jetroute_gateway_in_flight{model="m"}', /has no label model/],
      ["histogram_quantile(0.9, rate(vllm:time_to_first_token_seconds_bucket[5m]))", /without keeping le/],
      ["vllm:gpu_cache_usage_percent", /not exposed/],
      ["up", /up is not exposed/],
    ];
    for (const [expr, why] of bad) expect(problems(expr, c, extra).join("\n"), expr).toMatch(why);
    // The same checker passes the real names, so the rejections above are about the names.
    for (const expr of ['jetroute_gateway_pd{figure="prefillRetries"}', "sum by (le) (rate(jetroute_gateway_pick_seconds_bucket[5m]))", "vllm:kv_cache_usage_perc"]) {
      expect(problems(expr, c, extra), expr).toEqual([]);
    }
    expect(labelValuesProblems("label_values(jetroute_gateway_ready, model_name)", c, extra).join("\n")).toMatch(/has no label model_name/);
  });

  it("has a panel for each topic the dashboard is for", async () => {
    const c = await cat();
    const reads = (p: Panel) => exprsOf(p).map((e) => readPromql(e));
    const uses = (p: Panel, metric: string, label?: string, value?: string) =>
      reads(p).some((r) =>
        r.selectors.some((s) => s.metric === metric && (label === undefined || s.matchers.some((m) => m.label === label && (alternatives(m.value) ?? [m.value]).includes(value ?? "")))),
      );
    const groups = (p: Panel, label: string) => reads(p).some((r) => r.grouping.includes(label));
    const topics: Record<string, (p: Panel) => boolean> = {
      "routed request rate by strategy and outcome": (p) => uses(p, "jetroute_gateway_requests_total") && groups(p, "strategy") && groups(p, "outcome"),
      "errors by status code": (p) => uses(p, "jetroute_gateway_requests_total") && groups(p, "status"),
      "routing latency added": (p) => uses(p, "jetroute_gateway_pick_seconds_bucket"),
      TTFT: (p) => uses(p, "vllm:time_to_first_token_seconds_bucket") || uses(p, "sglang:time_to_first_token_seconds_bucket"),
      "per-pod load": (p) => uses(p, "vllm:num_requests_running") && groups(p, "pod"),
      "KV cache usage": (p) => uses(p, "vllm:kv_cache_usage_perc") && groups(p, "pod"),
      "charges in the ledger": (p) => uses(p, "jetroute_gateway_ledger", "figure", "charges"),
      "prefix cache hit rate": (p) => uses(p, "vllm:prefix_cache_hits_total") && uses(p, "vllm:prefix_cache_queries_total"),
      "followers' lag": (p) => uses(p, "jetroute_gateway_view_pending") || uses(p, "jetroute_gateway_view_delay_seconds"),
      "dead letters": (p) => uses(p, "jetroute_gateway_dead_letters"),
      "publish failures": (p) => uses(p, "jetroute_gateway_outbox_dropped") && uses(p, "jetroute_pod_watcher_stat", "name", "publishFailures"),
      "pod-watcher": (p) => uses(p, "jetroute_pod_watcher_stat"),
      "metrics-scraper": (p) => uses(p, "jetroute_metrics_scraper_stat"),
      "kv-bridge": (p) => uses(p, "jetroute_kv_bridge_stat"),
      "P/D prefill legs": (p) => uses(p, "jetroute_gateway_pd", "figure", "prefillAttempts") && uses(p, "jetroute_gateway_pd", "figure", "prefillFailures"),
    };
    for (const [topic, covers] of Object.entries(topics)) expect(queryPanels.some(covers), `a panel for ${topic}`).toBe(true);
    // Every metric named above is itself one the code exposes (a topic cannot be satisfied by a typo).
    for (const m of ["jetroute_gateway_requests_total", "jetroute_gateway_pick_seconds_bucket", "vllm:time_to_first_token_seconds_bucket", "jetroute_gateway_ledger", "jetroute_gateway_pd", "jetroute_pod_watcher_stat"]) {
      expect(c.has(m), m).toBe(true);
    }
  });

  it("ships as a ConfigMap the Grafana sidecar picks up (kubectl kustomize deploy/monitoring)", () => {
    const out = execFileSync("kubectl", ["kustomize", HERE], { encoding: "utf8", timeout: 60_000, stdio: ["ignore", "pipe", "pipe"] });
    const objects = parseAllDocuments(out).map((d) => d.toJS() as { kind?: string; metadata?: { name?: string; namespace?: string; labels?: Record<string, string> }; data?: Record<string, string> });
    const maps = objects.filter((o) => o.kind === "ConfigMap" && o.metadata?.labels?.grafana_dashboard === "1");
    expect(maps).toHaveLength(1);
    const cm = maps[0];
    expect(cm?.metadata?.name).toBe("jetroute-grafana-dashboard");
    expect(cm?.metadata?.namespace).toBe("jetroute");
    expect(Object.keys(cm?.data ?? {})).toEqual([DASHBOARD_FILE]);
    expect(cm?.data?.[DASHBOARD_FILE]).toBe(dashboardText);
    // kubectl apply (client side) keeps the whole object in an annotation limited to 256 KiB.
    expect(Buffer.byteLength(dashboardText)).toBeLessThan(200 * 1024);
    // One per scraped service: gateway, pod-watcher, metrics-scraper, kv-bridge, autoscaler.
    expect(objects.filter((o) => o.kind === "ServiceMonitor").map((o) => o.metadata?.name).sort()).toEqual(["jetroute-autoscaler", "jetroute-gateway", "jetroute-kv-bridge", "jetroute-metrics-scraper", "jetroute-pod-watcher"]);
  });
});
