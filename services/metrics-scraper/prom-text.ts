/**
 * Parser for the Prometheus text exposition format 0.0.4, which also reads OpenMetrics 1.0 text as
 * inference engines serve it (prometheus_client answers with OpenMetrics when the Accept header asks).
 *
 * We keep our own parser because the maintained npm one drops histograms, and the scraper needs
 * bucket data. It is lenient on purpose: one engine printing a bad line must not blind the router to
 * the rest of the pod's load, so a malformed line lands in `errors` and parsing carries on.
 *
 * Pure: no I/O. The scraper runs it on every pod's /metrics every 100 ms, so the hot path scans
 * characters by hand instead of running a regular expression per line.
 */

export type MetricType = "counter" | "gauge" | "histogram" | "summary" | "untyped" | "info";

/**
 * Label name to value. Nothing is inherited (the prototype is an empty object with no prototype of
 * its own), so a missing label reads as `undefined` even for names like `constructor`; test
 * presence with `in` or `Object.hasOwn`, as `labels.hasOwnProperty` does not exist.
 */
export type Labels = Record<string, string>;

export interface Sample {
  /** The name as written on the line, suffix included: `vllm:prompt_tokens_total`, `x_bucket`. */
  name: string;
  labels: Labels;
  value: number;
  /** Milliseconds since the epoch. OpenMetrics writes seconds; those are converted. */
  timestampMs?: number;
}

export interface MetricFamily {
  /**
   * The name from `# TYPE`/`# HELP`, or the sample name for samples with no metadata. The two
   * formats name counters differently: 0.0.4 declares `x_total` (and prometheus_client adds a
   * separate gauge family `x_created`), OpenMetrics declares `x` holding `x_total` and `x_created`.
   * `samplesNamed` hides that difference.
   */
  name: string;
  type: MetricType;
  help?: string;
  unit?: string;
  samples: Sample[];
}

export interface ParseError {
  /** 1-based line number in the input. */
  line: number;
  text: string;
  reason: string;
}

export interface MetricFamilies {
  /** In order of first appearance. */
  families: Map<string, MetricFamily>;
  errors: ParseError[];
}

export interface HistogramSeries {
  /** The series' labels without `le`. */
  labels: Labels;
  /** Cumulative counts by upper bound, ascending; the last bound is `Infinity` when the engine sent `+Inf`. */
  buckets: [le: number, cumulativeCount: number][];
  sum: number | null;
  /** `_count`, or the `+Inf` bucket when `_count` is absent. */
  count: number | null;
}

/** Sample-name suffixes each family type may carry ("" = the family name itself). */
const SUFFIXES: Readonly<Record<MetricType, readonly string[]>> = {
  counter: ["_total", "_created", ""],
  gauge: [""],
  histogram: ["_bucket", "_count", "_sum", "_created"],
  summary: ["", "_count", "_sum", "_created"],
  info: ["_info", ""],
  untyped: [""],
};

const KNOWN_SUFFIXES = ["_total", "_created", "_bucket", "_count", "_sum", "_info"] as const;

const TYPE_WORDS: ReadonlyMap<string, MetricType> = new Map<string, MetricType>([
  ["counter", "counter"],
  ["gauge", "gauge"],
  ["histogram", "histogram"],
  ["summary", "summary"],
  ["untyped", "untyped"],
  ["info", "info"],
  // OpenMetrics' name for untyped.
  ["unknown", "untyped"],
]);

// Object.create(null) would give the same isolation, but V8 makes such objects dictionary-mode:
// measured ~10x slower to fill and enumerate, which dominated parsing. Instances of a constructor
// whose prototype is a bare null-prototype object keep fast properties.
const LabelSet = function LabelSet() {} as unknown as new () => Labels;
LabelSet.prototype = Object.create(null);

const SPACE = 0x20;
const TAB = 0x09;
const CR = 0x0d;
const HASH = 0x23;
const QUOTE = 0x22;
const BACKSLASH = 0x5c;
const EQUALS = 0x3d;
const COMMA = 0x2c;
const LBRACE = 0x7b;
const RBRACE = 0x7d;

/**
 * Parses an exposition. Never throws on content: lines it cannot read are reported in `errors`
 * (with their 1-based line number) and skipped.
 */
export function parsePrometheusText(text: string): MetricFamilies {
  return new ExpositionParser().parse(text);
}

/**
 * All samples named exactly `sampleName`, whichever format filed them: `vllm:prompt_tokens_total`
 * is found under the 0.0.4 family `vllm:prompt_tokens_total` and under the OpenMetrics family
 * `vllm:prompt_tokens` alike. Returns a new array; empty when absent.
 */
export function samplesNamed(families: MetricFamilies, sampleName: string): Sample[] {
  const exact = families.families.get(sampleName);
  if (exact !== undefined) return exact.samples.filter((s) => s.name === sampleName);
  for (const suffix of KNOWN_SUFFIXES) {
    if (!sampleName.endsWith(suffix)) continue;
    const base = families.families.get(sampleName.slice(0, -suffix.length));
    if (base !== undefined) return base.samples.filter((s) => s.name === sampleName);
  }
  return [];
}

/**
 * The histogram `name` split into one series per label set (ignoring `le`), in order of first
 * appearance. Works from sample names, so it also assembles a histogram whose `# TYPE` line is
 * missing. Buckets whose `le` is not a number are skipped.
 */
export function histogramSeries(families: MetricFamilies, name: string): HistogramSeries[] {
  const byKey = new Map<string, HistogramSeries>();
  let last: HistogramSeries | undefined;
  let lastSize = 0;
  const seriesFor = (labels: Labels): HistogramSeries => {
    // A series' samples are adjacent in every exposition we have seen; skip the key for those.
    if (last !== undefined && sameSeries(last.labels, lastSize, labels)) return last;
    const key = seriesKey(labels);
    let series = byKey.get(key);
    if (series === undefined) {
      const own = new LabelSet();
      for (const k in labels) if (k !== "le") own[k] = labels[k] as string;
      series = { labels: own, buckets: [], sum: null, count: null };
      byKey.set(key, series);
    }
    last = series;
    lastSize = 0;
    for (const _ in series.labels) lastSize++;
    return series;
  };
  for (const s of samplesNamed(families, `${name}_bucket`)) {
    const le = s.labels.le === undefined ? undefined : parseFloatToken(s.labels.le);
    if (le === undefined || Number.isNaN(le)) continue;
    seriesFor(s.labels).buckets.push([le, s.value]);
  }
  for (const s of samplesNamed(families, `${name}_sum`)) seriesFor(s.labels).sum = s.value;
  for (const s of samplesNamed(families, `${name}_count`)) seriesFor(s.labels).count = s.value;
  for (const series of byKey.values()) {
    series.buckets.sort((a, b) => a[0] - b[0]);
    const top = series.buckets[series.buckets.length - 1];
    if (series.count === null && top !== undefined && top[0] === Infinity) series.count = top[1];
  }
  return [...byKey.values()];
}

/** Whether `labels` minus `le` equals a series' labels, which hold `size` entries. */
function sameSeries(seriesLabels: Labels, size: number, labels: Labels): boolean {
  let n = 0;
  for (const k in labels) {
    if (k === "le") continue;
    if (seriesLabels[k] !== labels[k]) return false;
    n++;
  }
  return n === size;
}

/** Identity of a label set minus `le`, independent of the order labels were written in. */
function seriesKey(labels: Labels): string {
  const names: string[] = [];
  for (const k in labels) if (k !== "le") names.push(k);
  names.sort();
  let key = "";
  // Length-prefixing the value keeps values that contain separators from colliding.
  for (const k of names) {
    const v = labels[k] as string;
    key += `${k}=${v.length}:${v},`;
  }
  return key;
}

/** Go's ParseFloat spellings that engines use: decimal and exponent forms, NaN, ±Inf. */
function parseFloatToken(token: string): number | undefined {
  if (token.length === 0) return undefined;
  const value = Number(token);
  if (!Number.isNaN(value)) {
    // Number() also reads hex, octal and binary literals, which are not exposition syntax.
    const second = token.charCodeAt(1) | 0x20;
    if (token.charCodeAt(0) === 0x30 && (second === 0x78 || second === 0x6f || second === 0x62)) return undefined;
    return value;
  }
  switch (token.toLowerCase()) {
    case "nan":
      return Number.NaN;
    case "inf":
    case "+inf":
    case "+infinity":
    case "infinity":
      return Number.POSITIVE_INFINITY;
    case "-inf":
    case "-infinity":
      return Number.NEGATIVE_INFINITY;
    default:
      return undefined;
  }
}

function isBlank(c: number): boolean {
  return c === SPACE || c === TAB;
}

function skipBlanks(line: string, pos: number): number {
  while (pos < line.length && isBlank(line.charCodeAt(pos))) pos++;
  return pos;
}

/** End of a metric name starting at `pos` (`[a-zA-Z_:][a-zA-Z0-9_:]*`); `pos` when there is none. */
function scanMetricName(line: string, pos: number): number {
  let i = pos;
  for (; i < line.length; i++) {
    const c = line.charCodeAt(i);
    const ok =
      (c >= 0x61 && c <= 0x7a) || (c >= 0x41 && c <= 0x5a) || c === 0x5f || c === 0x3a || (i > pos && c >= 0x30 && c <= 0x39);
    if (!ok) break;
  }
  return i;
}

/** End of a label name starting at `pos` (`[a-zA-Z_][a-zA-Z0-9_]*`); `pos` when there is none. */
function scanLabelName(line: string, pos: number): number {
  let i = pos;
  for (; i < line.length; i++) {
    const c = line.charCodeAt(i);
    const ok = (c >= 0x61 && c <= 0x7a) || (c >= 0x41 && c <= 0x5a) || c === 0x5f || (i > pos && c >= 0x30 && c <= 0x39);
    if (!ok) break;
  }
  return i;
}

/** End of the blank-delimited token starting at `pos`. */
function scanToken(line: string, pos: number): number {
  let i = pos;
  while (i < line.length && !isBlank(line.charCodeAt(i))) i++;
  return i;
}

/** HELP text escapes: `\\` and `\n` in both formats, `\"` in OpenMetrics. Unknown escapes stay verbatim. */
function unescapeHelp(raw: string): string {
  if (!raw.includes("\\")) return raw;
  return raw.replace(/\\([\\n"])/g, (_, c: string) => (c === "n" ? "\n" : c));
}

class LineError extends Error {}

class ExpositionParser {
  private readonly families = new Map<string, MetricFamily>();
  private readonly errors: ParseError[] = [];
  /** Families whose type came from a `# TYPE` line (the rest are untyped by default). */
  private readonly typed = new Set<string>();
  private readonly timestamped: Sample[] = [];
  private current: MetricFamily | undefined;
  private sawEof = false;

  parse(text: string): MetricFamilies {
    const lines = text.split("\n");
    for (let i = 0; i < lines.length; i++) {
      let line = lines[i] as string;
      if (line.charCodeAt(line.length - 1) === CR) line = line.slice(0, -1);
      if (line.length === 0) continue;
      if (isBlank(line.charCodeAt(0))) {
        line = line.trimStart();
        if (line.length === 0) continue;
      }
      if (this.sawEof) {
        // OpenMetrics ends at # EOF; whatever follows is not part of this exposition.
        this.errors.push({ line: i + 1, text: line, reason: "content after # EOF" });
        break;
      }
      try {
        if (line.charCodeAt(0) === HASH) this.metadataLine(line);
        else this.sampleLine(line);
      } catch (err) {
        if (!(err instanceof LineError)) throw err;
        this.errors.push({ line: i + 1, text: line, reason: err.message });
      }
    }
    if (this.sawEof) {
      // A # EOF marks OpenMetrics, whose timestamps are seconds; 0.0.4 writes milliseconds.
      for (const s of this.timestamped) s.timestampMs = (s.timestampMs as number) * 1000;
    }
    return { families: this.families, errors: this.errors };
  }

  private metadataLine(line: string): void {
    let pos = skipBlanks(line, 1);
    const wordEnd = scanToken(line, pos);
    const word = line.slice(pos, wordEnd);
    if (word !== "HELP" && word !== "TYPE" && word !== "UNIT") {
      if (word === "EOF" && skipBlanks(line, wordEnd) === line.length) this.sawEof = true;
      // Anything else after '#' is a comment.
      return;
    }
    pos = skipBlanks(line, wordEnd);
    const nameEnd = scanMetricName(line, pos);
    if (nameEnd === pos) throw new LineError(`# ${word} without a metric name`);
    if (nameEnd < line.length && !isBlank(line.charCodeAt(nameEnd))) {
      throw new LineError(`invalid metric name in # ${word}`);
    }
    const name = line.slice(pos, nameEnd);
    const rest = line.slice(skipBlanks(line, nameEnd));

    if (word === "TYPE") {
      const typeWord = rest.trimEnd();
      const type = TYPE_WORDS.get(typeWord);
      const unsupported = typeWord === "gaugehistogram" || typeWord === "stateset";
      if (type === undefined && !unsupported) throw new LineError(`unknown metric type "${typeWord}"`);
      const family = this.familyNamed(name);
      this.current = family;
      if (this.typed.has(name)) throw new LineError(`duplicate # TYPE for ${name}`);
      if (family.samples.length > 0) throw new LineError(`# TYPE for ${name} after its samples`);
      this.typed.add(name);
      if (type === undefined) throw new LineError(`unsupported metric type ${typeWord}; ${name} read as untyped`);
      family.type = type;
      return;
    }

    const family = this.familyNamed(name);
    this.current = family;
    if (word === "HELP") {
      if (family.help !== undefined) throw new LineError(`duplicate # HELP for ${name}`);
      family.help = unescapeHelp(rest);
    } else {
      if (family.unit !== undefined) throw new LineError(`duplicate # UNIT for ${name}`);
      family.unit = rest;
    }
  }

  private sampleLine(line: string): void {
    const nameEnd = scanMetricName(line, 0);
    if (nameEnd === 0) throw new LineError("expected a metric name");
    const name = line.slice(0, nameEnd);
    const labels = new LabelSet();
    let pos = skipBlanks(line, nameEnd);
    if (line.charCodeAt(pos) === LBRACE) {
      pos = parseLabels(line, pos + 1, labels);
      pos = skipBlanks(line, pos);
    } else if (pos === nameEnd && pos < line.length) {
      throw new LineError(`unexpected character after metric name ${name}`);
    }

    const valueEnd = scanToken(line, pos);
    if (valueEnd === pos) throw new LineError("missing value");
    const value = parseFloatToken(line.slice(pos, valueEnd));
    if (value === undefined) throw new LineError(`invalid value "${line.slice(pos, valueEnd)}"`);
    pos = skipBlanks(line, valueEnd);

    let timestamp: number | undefined;
    if (pos < line.length && line.charCodeAt(pos) !== HASH) {
      const tsEnd = scanToken(line, pos);
      timestamp = parseFloatToken(line.slice(pos, tsEnd));
      if (timestamp === undefined || !Number.isFinite(timestamp)) {
        throw new LineError(`invalid timestamp "${line.slice(pos, tsEnd)}"`);
      }
      pos = skipBlanks(line, tsEnd);
    }
    // An OpenMetrics exemplar (`# {trace_id="..."} 0.5`) may follow; the router has no use for it.
    if (pos < line.length && line.charCodeAt(pos) !== HASH) throw new LineError("unexpected text after the value");

    const family = this.familyForSample(name);
    if (family.type === "histogram" && name.endsWith("_bucket")) {
      const le = labels.le === undefined ? undefined : parseFloatToken(labels.le);
      if (le === undefined || Number.isNaN(le)) throw new LineError("histogram bucket without a numeric le label");
    }
    const sample: Sample = { name, labels, value };
    if (timestamp !== undefined) {
      sample.timestampMs = timestamp;
      this.timestamped.push(sample);
    }
    family.samples.push(sample);
  }

  /** Family for metadata lines: found by exact name or created (untyped until a # TYPE). */
  private familyNamed(name: string): MetricFamily {
    let family = this.families.get(name);
    if (family === undefined) {
      family = { name, type: "untyped", samples: [] };
      this.families.set(name, family);
    }
    return family;
  }

  /**
   * The family a sample belongs to: normally the one whose metadata came just before, else any
   * earlier family it fits (engines in multiprocess mode do not always keep families contiguous),
   * else a new untyped family named after the sample.
   */
  private familyForSample(name: string): MetricFamily {
    const current = this.current;
    if (current !== undefined && fits(current, name)) return current;
    const exact = this.families.get(name);
    if (exact !== undefined && fits(exact, name)) return (this.current = exact);
    for (const suffix of KNOWN_SUFFIXES) {
      if (!name.endsWith(suffix)) continue;
      const base = this.families.get(name.slice(0, -suffix.length));
      if (base !== undefined && fits(base, name)) return (this.current = base);
    }
    if (exact !== undefined) throw new LineError(`sample ${name} does not fit the ${exact.type} family ${name}`);
    const created: MetricFamily = { name, type: "untyped", samples: [] };
    this.families.set(name, created);
    return (this.current = created);
  }
}

function fits(family: MetricFamily, sampleName: string): boolean {
  if (!sampleName.startsWith(family.name)) return false;
  return SUFFIXES[family.type].includes(sampleName.slice(family.name.length));
}

/**
 * Reads `name="value",...}` starting just after `{` into `labels`; returns the position after `}`.
 * Values may hold commas, braces and `#` inside the quotes, and the escapes `\"`, `\\`, `\n`.
 */
function parseLabels(line: string, pos: number, labels: Labels): number {
  let nextBackslash = line.indexOf("\\", pos);
  for (;;) {
    pos = skipBlanks(line, pos);
    if (pos >= line.length) throw new LineError("unterminated label set");
    if (line.charCodeAt(pos) === RBRACE) return pos + 1;

    const nameEnd = scanLabelName(line, pos);
    if (nameEnd === pos) throw new LineError("invalid label name");
    const labelName = line.slice(pos, nameEnd);
    pos = skipBlanks(line, nameEnd);
    if (line.charCodeAt(pos) !== EQUALS) throw new LineError(`expected = after label ${labelName}`);
    pos = skipBlanks(line, pos + 1);
    if (line.charCodeAt(pos) !== QUOTE) throw new LineError(`expected a quoted value for label ${labelName}`);
    pos++;

    const close = line.indexOf('"', pos);
    if (close === -1) throw new LineError(`unterminated value for label ${labelName}`);
    let value: string;
    if (nextBackslash === -1 || nextBackslash > close) {
      value = line.slice(pos, close);
      pos = close + 1;
    } else {
      [value, pos] = readEscapedValue(line, pos, labelName);
      nextBackslash = line.indexOf("\\", pos);
    }
    if (labels[labelName] !== undefined) throw new LineError(`duplicate label ${labelName}`);
    labels[labelName] = value;

    pos = skipBlanks(line, pos);
    const c = line.charCodeAt(pos);
    if (c === COMMA) pos++;
    else if (c !== RBRACE) throw new LineError(`expected , or } after label ${labelName}`);
  }
}

/** Slow path for a label value containing backslashes; returns the value and the position after its closing quote. */
function readEscapedValue(line: string, pos: number, labelName: string): [string, number] {
  let value = "";
  let runStart = pos;
  while (pos < line.length) {
    const c = line.charCodeAt(pos);
    if (c === QUOTE) return [value + line.slice(runStart, pos), pos + 1];
    if (c !== BACKSLASH) {
      pos++;
      continue;
    }
    value += line.slice(runStart, pos);
    const next = line[pos + 1];
    if (next === undefined) break;
    value += next === "n" ? "\n" : next === "\\" || next === '"' ? next : `\\${next}`;
    pos += 2;
    runStart = pos;
  }
  throw new LineError(`unterminated value for label ${labelName}`);
}
