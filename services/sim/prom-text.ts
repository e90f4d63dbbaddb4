/**
 * Just enough of the Prometheus text format (0.0.4) to imitate what Python's prometheus_client
 * prints for vLLM and SGLang: values and `le` bounds as floats ("1.0", "+Inf"), `# TYPE` on the
 * full sample name of counters (`..._total`). Hand-written rather than prom-client so the output
 * matches the engines byte for byte in those details and rendering stays synchronous.
 */
export type Labels = Readonly<Record<string, string>>;

export function formatValue(v: number): string {
  if (v === Number.POSITIVE_INFINITY) return "+Inf";
  if (v === Number.NEGATIVE_INFINITY) return "-Inf";
  if (Number.isNaN(v)) return "NaN";
  return Number.isInteger(v) && Math.abs(v) < 1e16 ? `${v}.0` : String(v);
}

function escapeLabel(v: string): string {
  return v.replace(/\\/g, "\\\\").replace(/\n/g, "\\n").replace(/"/g, '\\"');
}

export function formatLabels(labels: Labels): string {
  const parts = Object.entries(labels).map(([k, v]) => `${k}="${escapeLabel(v)}"`);
  return parts.length > 0 ? `{${parts.join(",")}}` : "";
}

export class Histogram {
  private readonly counts: number[];
  private sum = 0;
  private count = 0;

  constructor(readonly buckets: readonly number[]) {
    this.counts = buckets.map(() => 0);
  }

  observe(v: number): void {
    this.sum += v;
    this.count++;
    for (const [i, le] of this.buckets.entries()) {
      if (v <= le) this.counts[i] = (this.counts[i] ?? 0) + 1;
    }
  }

  render(name: string, labels: Labels): string[] {
    const lines: string[] = [];
    for (const [i, le] of this.buckets.entries()) {
      lines.push(`${name}_bucket${formatLabels({ ...labels, le: formatValue(le) })} ${formatValue(this.counts[i] ?? 0)}`);
    }
    lines.push(`${name}_bucket${formatLabels({ ...labels, le: "+Inf" })} ${formatValue(this.count)}`);
    lines.push(`${name}_count${formatLabels(labels)} ${formatValue(this.count)}`);
    lines.push(`${name}_sum${formatLabels(labels)} ${formatValue(this.sum)}`);
    return lines;
  }
}

/** Accumulates metric families in order and joins them into one exposition. */
export class Exposition {
  private readonly lines: string[] = [];

  private header(name: string, type: string, help: string): void {
    this.lines.push(`# HELP ${name} ${help}`, `# TYPE ${name} ${type}`);
  }

  gauge(name: string, help: string, samples: ReadonlyArray<[Labels, number]>): this {
    this.header(name, "gauge", help);
    for (const [labels, v] of samples) this.lines.push(`${name}${formatLabels(labels)} ${formatValue(v)}`);
    return this;
  }

  counter(name: string, help: string, samples: ReadonlyArray<[Labels, number]>): this {
    this.header(name, "counter", help);
    for (const [labels, v] of samples) this.lines.push(`${name}${formatLabels(labels)} ${formatValue(v)}`);
    return this;
  }

  histogram(name: string, help: string, labels: Labels, h: Histogram): this {
    this.header(name, "histogram", help);
    this.lines.push(...h.render(name, labels));
    return this;
  }

  toString(): string {
    return `${this.lines.join("\n")}\n`;
  }
}

/** vLLM's 1-2-5 series up to a maximum (used for its token-count histograms). */
export function buckets125(max: number): number[] {
  const out: number[] = [];
  for (let exp = 1; ; exp *= 10) {
    for (const m of [1, 2, 5]) {
      if (m * exp > max) return out;
      out.push(m * exp);
    }
  }
}
