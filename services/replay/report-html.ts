/**
 * The HTML report of `jetroute replay`: one self-contained file an operator can open from a
 * laptop, a CI artifact or an air-gapped bastion. Nothing is fetched — Chart.js is inlined from
 * node_modules and a Content-Security-Policy forbids any request — and the report itself travels
 * as JSON in the page, so the charts are drawn from exactly the data the tables show.
 *
 * Every string of the report (request ids, model and pod names, warnings) comes from clients or
 * operators: it reaches the markup only through `esc`, and the embedded JSON has `<` escaped so
 * it can never close its script element.
 */
import { mkdirSync, readFileSync, existsSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import type { Histogram, ReplayReport } from "./report-types.js";

const CHART_BUNDLES = ["chart.umd.min.js", "chart.umd.js"];

let chartJs: string | undefined;

/** The UMD build of Chart.js (it registers every chart type and sets `window.Chart`). */
function chartJsSource(): string {
  if (chartJs !== undefined) return chartJs;
  const require = createRequire(import.meta.url);
  // chart.js's `exports` map hides dist/*.umd*.js from resolve(): find its dist from the main entry.
  let entry: string;
  try {
    entry = require.resolve("chart.js");
  } catch (e) {
    throw new Error(`chart.js is not installed: cannot resolve it from ${fileURLToPath(import.meta.url)} (${(e as Error).message})`);
  }
  const dist = dirname(entry);
  const candidates = CHART_BUNDLES.map((f) => join(dist, f));
  const file = candidates.find((p) => existsSync(p));
  if (!file) throw new Error(`Chart.js UMD bundle not found: looked for ${candidates.join(" and ")} (is the chart.js dependency installed?)`);
  chartJs = readFileSync(file, "utf8").replace(/<\/(script)/gi, "<\\/$1");
  return chartJs;
}

function esc(s: string): string {
  return s.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

function pct(x: number, digits = 2): string {
  return Number.isFinite(x) ? `${(x * 100).toFixed(digits)}%` : "—";
}

function num(x: number, digits = 2): string {
  return Number.isFinite(x) ? x.toFixed(digits) : "—";
}

function int(x: number): string {
  return Number.isFinite(x) ? Math.round(x).toLocaleString("en-US") : "—";
}

/** Block counts are tier-weighted, so they can be fractional. */
function blocks(x: number): string {
  return Number.isFinite(x) ? x.toLocaleString("en-US", { maximumFractionDigits: 1 }) : "—";
}

function ms(x: number | null): string {
  if (x === null || !Number.isFinite(x)) return "—";
  return x < 1000 ? `${Math.round(x)} ms` : `${(x / 1000).toFixed(2)} s`;
}

function iso(t: number): string {
  return Number.isFinite(t) ? new Date(t).toISOString() : "—";
}

function counters(c: Record<string, number>): string {
  const rows = Object.entries(c).sort((a, b) => b[1] - a[1]);
  if (rows.length === 0) return `<p class="muted">none</p>`;
  return `<ul class="counters">${rows.map(([k, v]) => `<li><span>${esc(k)}</span><b>${int(v)}</b></li>`).join("")}</ul>`;
}

function card(title: string, body: string): string {
  return `<div class="card"><h3>${esc(title)}</h3>${body}</div>`;
}

function table(head: string[], rows: string[][], numericFrom = 1): string {
  const th = head.map((h, i) => `<th${i >= numericFrom ? ` class="n"` : ""}>${esc(h)}</th>`).join("");
  const tr = rows.map((r) => `<tr>${r.map((c, i) => `<td${i >= numericFrom ? ` class="n"` : ""}>${c}</td>`).join("")}</tr>`).join("");
  return `<table><thead><tr>${th}</tr></thead><tbody>${tr}</tbody></table>`;
}

interface TtftSeries {
  label: string;
  hist: Histogram;
  charted: boolean;
}

/** Series sharing the bucket edges of the first non-empty one are charted together; the browser script applies the same rule. */
function ttftSeries(report: ReplayReport): TtftSeries[] {
  const all = [{ label: "recorded", hist: report.recordedTtft }, ...(report.simulation ?? []).map((s) => ({ label: `simulated ${s.strategy}`, hist: s.ttft }))];
  const base = all.find((s) => s.hist.n > 0)?.hist.edgesMs;
  return all.map((s) => ({ ...s, charted: base !== undefined && s.hist.n > 0 && s.hist.edgesMs.join(",") === base.join(",") }));
}

function header(report: ReplayReport): string {
  const { fromMs, toMs } = report.window;
  const minutes = (toMs - fromMs) / 60_000;
  const warnings = report.warnings.length === 0 ? "" : `<div class="warnings"><h2>Warnings</h2><ul>${report.warnings.map((w) => `<li>${esc(w)}</li>`).join("")}</ul></div>`;
  return `<header>
<h1>jetroute replay</h1>
<dl>
<dt>window</dt><dd>${esc(iso(fromMs))} → ${esc(iso(toMs))}${Number.isFinite(minutes) ? ` <span class="muted">(${num(minutes, 1)} min)</span>` : ""}</dd>
<dt>source</dt><dd>${esc(report.source)}</dd>
<dt>generated</dt><dd>${esc(report.generatedAt)}</dd>
</dl>
${warnings}
</header>`;
}

function summary(report: ReplayReport): string {
  const d = report.decisions;
  const f = report.fidelity;
  return `<section><h2>Summary</h2><div class="cards">
${card("Decisions", `<ul class="counters"><li><span>read</span><b>${int(d.read)}</b></li><li><span>evaluated</span><b>${int(d.evaluated)}</b></li><li><span>rejected</span><b>${int(d.rejected)}</b></li></ul>`)}
${card("Fidelity", `<p class="big">${pct(f.ratio)}</p><p class="muted">${int(f.reproduced)} of ${int(f.evaluated)} recorded picks reproduced</p>`)}
${card("Skipped decisions", counters(d.skipped))}
${card("Residuals (not reproduced)", counters(f.residuals))}
${card("Events", `<ul class="counters"><li><span>applied</span><b>${int(report.events.applied)}</b></li></ul>${Object.keys(report.events.skipped).length ? `<p class="muted">skipped:</p>${counters(report.events.skipped)}` : ""}`)}
</div></section>`;
}

function strategies(report: ReplayReport): string {
  if (report.strategies.length === 0) return `<section><h2>Strategies</h2><p class="empty">no decisions in the window</p></section>`;
  const rows = report.strategies.map((s) => [
    `<code>${esc(s.name)}</code>`,
    int(s.decisions),
    pct(s.hitRate),
    `${blocks(s.hitBlocks)} / ${blocks(s.queriedBlocks)}`,
    num(s.meanSpread),
    num(s.maxSpread),
    num(s.meanRegretBlocks),
  ]);
  return `<section><h2>Strategies</h2>${table(["strategy", "decisions", "hit rate", "hit blocks / queried", "mean spread", "max spread", "mean regret (blocks)"], rows)}</section>`;
}

function timelineCharts(report: ReplayReport): string {
  const chart = (id: string, title: string, note: string) =>
    `<section><h2>${esc(title)}</h2><p class="muted">${esc(note)}</p>${report.timeline.length === 0 ? `<p class="empty">no decisions in the window</p>` : `<div class="chart"><canvas id="${id}"></canvas></div>`}</section>`;
  return (
    chart("chart-hit-rate", "Prefix-cache hit rate over time", "Prompt blocks the pick held over blocks queried, per time bucket (UTC).") +
    chart("chart-spread", "Load spread over time", "Busiest pod's in-flight requests over the mean, per time bucket (UTC); 1 is perfectly even.")
  );
}

function ttft(report: ReplayReport): string {
  const series = ttftSeries(report);
  const body = series.some((s) => s.charted) ? `<div class="chart"><canvas id="chart-ttft"></canvas></div>` : `<p class="empty">no TTFT recorded</p>`;
  const rows = series.map((s) => [
    esc(s.label) + (s.hist.n > 0 && !s.charted ? ` <span class="muted">(other buckets, not charted)</span>` : ""),
    int(s.hist.n),
    ms(s.hist.p50Ms),
    ms(s.hist.p99Ms),
  ]);
  return `<section><h2>Time to first token</h2>${body}${table(["series", "requests", "p50", "p99"], rows)}</section>`;
}

function agreement(report: ReplayReport): string {
  const { strategies: names, matrix } = report.agreement;
  if (names.length === 0) return `<section><h2>Agreement</h2><p class="empty">no strategies to compare</p></section>`;
  const head = `<tr><th></th>${names.map((n) => `<th class="n"><code>${esc(n)}</code></th>`).join("")}</tr>`;
  const body = names
    .map((n, i) => {
      const cells = names.map((_, j) => {
        const v = matrix[i]?.[j];
        if (v === undefined || !Number.isFinite(v)) return `<td class="n">—</td>`;
        const a = Math.min(1, Math.max(0, v));
        return `<td class="n cell" style="background:rgba(37,99,235,${(a * 0.85).toFixed(3)});color:${a > 0.55 ? "#fff" : "#111"}">${pct(v, 1)}</td>`;
      });
      return `<tr><th><code>${esc(n)}</code></th>${cells.join("")}</tr>`;
    })
    .join("");
  return `<section><h2>Agreement</h2><p class="muted">Share of decisions on which the row and column strategies picked the same pod.</p><table class="matrix"><thead>${head}</thead><tbody>${body}</tbody></table></section>`;
}

function regrets(report: ReplayReport): string {
  if (report.topRegrets.length === 0) return `<section><h2>Top regrets</h2><p class="empty">no regrets: every pick held the best prefix</p></section>`;
  const rows = report.topRegrets.map((r) => [
    `<code>${esc(r.requestId)}</code>`,
    esc(r.gateway),
    esc(iso(r.ts)),
    esc(r.model),
    `<code>${esc(r.strategy)}</code>`,
    esc(r.pick),
    esc(r.best),
    blocks(r.regretBlocks),
  ]);
  return `<section><h2>Top regrets</h2><p class="muted">Decisions that lost the most prompt blocks against the best-matching candidate.</p>${table(["request id", "gateway", "time", "model", "strategy", "pick", "best", "regret (blocks)"], rows, 7)}</section>`;
}

function simulation(report: ReplayReport): string {
  const sims = report.simulation;
  if (!sims) return "";
  if (sims.length === 0) return `<section><h2>Simulation</h2><p class="empty">no strategies simulated</p></section>`;
  const rows = sims.map((s) => [`<code>${esc(s.strategy)}</code>`, int(s.requests), int(s.completed), ms(s.ttft.p50Ms), ms(s.ttft.p99Ms), pct(s.hitRate), ms(s.makespanMs)]);
  return `<section><h2>Simulation</h2>${table(["strategy", "requests", "completed", "TTFT p50", "TTFT p99", "hit rate", "makespan"], rows)}</section>`;
}

const CSS = `
:root { color-scheme: light; --fg: #111827; --muted: #6b7280; --line: #e5e7eb; --bg: #f9fafb; }
* { box-sizing: border-box; }
body { margin: 0; padding: 24px 32px 48px; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; color: var(--fg); background: #fff; max-width: 1280px; }
h1 { margin: 0 0 8px; font-size: 24px; }
h2 { margin: 28px 0 8px; font-size: 17px; }
h3 { margin: 0 0 6px; font-size: 13px; color: var(--muted); font-weight: 600; text-transform: uppercase; letter-spacing: .03em; }
dl { display: grid; grid-template-columns: max-content 1fr; gap: 2px 12px; margin: 0; }
dt { color: var(--muted); }
dd { margin: 0; }
code { font: 12.5px ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; }
.muted { color: var(--muted); margin: 2px 0 8px; }
.empty { padding: 16px; border: 1px dashed var(--line); border-radius: 6px; color: var(--muted); text-align: center; }
.warnings { margin-top: 12px; padding: 8px 16px; border: 1px solid #f59e0b; border-radius: 6px; background: #fffbeb; }
.warnings h2 { margin: 4px 0; font-size: 14px; }
.warnings ul { margin: 4px 0; padding-left: 18px; }
.cards { display: grid; grid-template-columns: repeat(auto-fill, minmax(220px, 1fr)); gap: 12px; }
.card { border: 1px solid var(--line); border-radius: 8px; padding: 12px 14px; background: var(--bg); }
.big { font-size: 26px; font-weight: 600; margin: 0; }
.counters { list-style: none; margin: 0; padding: 0; }
.counters li { display: flex; justify-content: space-between; gap: 12px; }
.counters span { overflow-wrap: anywhere; }
table { border-collapse: collapse; margin: 4px 0; }
th, td { padding: 4px 10px; border-bottom: 1px solid var(--line); text-align: left; vertical-align: top; }
th { font-weight: 600; background: var(--bg); }
td { overflow-wrap: anywhere; max-width: 360px; }
.n { text-align: right; font-variant-numeric: tabular-nums; }
.matrix td.cell { min-width: 72px; }
.chart { position: relative; height: 300px; margin: 4px 0 8px; }
`;

/** Builds the charts from #report-data. Kept free of template literals and `</` so it can sit in a script element. */
const BROWSER_SCRIPT = `
(function () {
  "use strict";
  var report = JSON.parse(document.getElementById("report-data").textContent);
  var done = function () { document.documentElement.setAttribute("data-report", "ready"); };
  if (typeof Chart === "undefined") { done(); return; }
  var palette = ["#2563eb", "#dc2626", "#16a34a", "#d97706", "#7c3aed", "#0891b2", "#db2777", "#4b5563"];
  var color = function (i) { return palette[i % palette.length]; };
  var names = report.strategies.map(function (s) { return s.name; });
  report.timeline.forEach(function (p) {
    Object.keys(p.strategies).forEach(function (n) { if (names.indexOf(n) < 0) names.push(n); });
  });
  var colorOf = function (name, i) { var k = names.indexOf(name); return color(k < 0 ? names.length + i : k); };
  var pad = function (n) { return (n < 10 ? "0" : "") + n; };
  var hms = function (t) { var d = new Date(t); return pad(d.getUTCHours()) + ":" + pad(d.getUTCMinutes()) + ":" + pad(d.getUTCSeconds()); };
  var fmtMs = function (v) { return v < 1000 ? v + " ms" : (v / 1000) + " s"; };

  Chart.defaults.animation = false;
  Chart.defaults.maintainAspectRatio = false;
  Chart.defaults.font.family = 'system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif';
  Chart.defaults.plugins.legend.position = "bottom";
  Chart.register({ id: "jetrouteDrawn", afterRender: function (chart) { chart.canvas.setAttribute("data-drawn", "1"); } });

  var labels = report.timeline.map(function (p) { return hms(p.t); });
  var series = function (field) {
    return names.map(function (name, i) {
      return {
        label: name,
        data: report.timeline.map(function (p) { var s = p.strategies[name]; return s ? s[field] : null; }),
        borderColor: color(i),
        backgroundColor: color(i),
        borderWidth: name === "recorded" ? 3 : 2,
        pointRadius: 2,
        spanGaps: true
      };
    });
  };
  var xAxis = { title: { display: true, text: "time (UTC)" }, ticks: { autoSkip: true, maxRotation: 0 } };

  var hit = document.getElementById("chart-hit-rate");
  if (hit) {
    new Chart(hit, {
      type: "line",
      data: { labels: labels, datasets: series("hitRate") },
      options: {
        interaction: { mode: "index", intersect: false },
        scales: {
          x: xAxis,
          y: { min: 0, max: 1, title: { display: true, text: "hit rate" }, ticks: { callback: function (v) { return Math.round(v * 100) + "%"; } } }
        },
        plugins: { tooltip: { callbacks: { label: function (c) { return c.dataset.label + ": " + (c.parsed.y * 100).toFixed(2) + "%"; } } } }
      }
    });
  }

  var spread = document.getElementById("chart-spread");
  if (spread) {
    new Chart(spread, {
      type: "line",
      data: { labels: labels, datasets: series("spread") },
      options: {
        interaction: { mode: "index", intersect: false },
        scales: { x: xAxis, y: { beginAtZero: true, title: { display: true, text: "max / mean in-flight" } } }
      }
    });
  }

  var ttft = document.getElementById("chart-ttft");
  if (ttft) {
    var all = [{ label: "recorded", strategy: "recorded", hist: report.recordedTtft }].concat((report.simulation || []).map(function (s) {
      return { label: "simulated " + s.strategy, strategy: s.strategy, hist: s.ttft };
    }));
    var base = null;
    all.forEach(function (s) { if (base === null && s.hist.n > 0) base = s.hist.edgesMs; });
    var charted = all.filter(function (s) { return base !== null && s.hist.n > 0 && s.hist.edgesMs.join(",") === base.join(","); });
    var width = charted.reduce(function (m, s) { return Math.max(m, s.hist.counts.length); }, 0);
    var bucketLabels = [];
    for (var i = 0; i < width; i++) {
      if (i < base.length - 1 || (i === base.length - 1 && width > base.length)) bucketLabels.push("\\u2264 " + fmtMs(base[i]));
      else if (i === base.length - 1) bucketLabels.push(base.length > 1 ? "> " + fmtMs(base[i - 1]) : "all");
      else bucketLabels.push("> " + fmtMs(base[base.length - 1]));
    }
    new Chart(ttft, {
      type: "bar",
      data: {
        labels: bucketLabels,
        datasets: charted.map(function (s, i) {
          return { label: s.label, data: s.hist.counts, backgroundColor: colorOf(s.strategy, i), borderWidth: 0 };
        })
      },
      options: {
        scales: {
          x: { title: { display: true, text: "time to first token" } },
          y: { beginAtZero: true, title: { display: true, text: "requests" } }
        }
      }
    });
  }
  done();
})();
`;

export function renderReportHtml(report: ReplayReport): string {
  const data = JSON.stringify(report).replace(/</g, "\\u003c");
  return `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:">
<title>jetroute replay — ${esc(iso(report.window.fromMs))}</title>
<style>${CSS}</style>
</head>
<body>
${header(report)}
<main>
${summary(report)}
${strategies(report)}
${timelineCharts(report)}
${ttft(report)}
${agreement(report)}
${regrets(report)}
${simulation(report)}
</main>
<script type="application/json" id="report-data">${data}</script>
<script>${chartJsSource()}</script>
<script>${BROWSER_SCRIPT}</script>
</body>
</html>
`;
}

export function writeReportHtml(path: string, report: ReplayReport): void {
  mkdirSync(dirname(path), { recursive: true });
  writeFileSync(path, renderReportHtml(report));
}
