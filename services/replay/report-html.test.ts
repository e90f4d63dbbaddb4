/**
 * The replay report must open anywhere, offline, and never let a client's string into the markup.
 * The unit test checks the document itself; the browser test opens it in Debian's headless
 * Chromium with the network cut, and only passes if every chart was drawn without a single error.
 * `JETROUTE_UPDATE_SCREENSHOT=1` refreshes docs/replay-report.png from the same page.
 */
import { copyFileSync, existsSync, mkdtempSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { chromium } from "playwright-core";
import { describe, expect, it } from "vitest";
import { mulberry32 } from "../shared/seeded-random.js";
import { renderReportHtml, writeReportHtml } from "./report-html.js";
import type { Histogram, ReplayReport, TimelinePoint } from "./report-types.js";

const CHROMIUM = "/usr/bin/chromium";
const SCREENSHOT = fileURLToPath(new URL("../../docs/replay-report.png", import.meta.url));
const EVIL_ID = "req-</script><b>x</b>-0042";
const EDGES = [25, 50, 100, 200, 400, 800, 1600, 3200];

function histogram(counts: number[], p50Ms: number, p99Ms: number): Histogram {
  return { edgesMs: EDGES, counts, n: counts.reduce((a, b) => a + b, 0), p50Ms, p99Ms };
}

function sampleReport(): ReplayReport {
  const rnd = mulberry32(7);
  const fromMs = Date.UTC(2025, 2, 14, 9, 30, 0);
  const bucketMs = 30_000;
  const base: Record<string, { hit: number; spread: number }> = {
    recorded: { hit: 0.62, spread: 1.35 },
    "prefix-cache": { hit: 0.78, spread: 1.6 },
    "least-request": { hit: 0.31, spread: 1.08 },
  };
  const timeline: TimelinePoint[] = Array.from({ length: 20 }, (_, i) => ({
    t: fromMs + i * bucketMs,
    strategies: Object.fromEntries(
      Object.entries(base).map(([name, b]) => [
        name,
        { hitRate: Math.min(1, Math.max(0, b.hit + (rnd() - 0.5) * 0.2 + (i > 12 ? 0.08 : 0))), spread: b.spread + rnd() * 0.4, decisions: 40 + Math.floor(rnd() * 30) },
      ]),
    ),
  }));
  return {
    report: "jetroute-replay",
    version: 1,
    generatedAt: "2025-03-14T10:02:11.512Z",
    source: "nats://nats.jetroute.svc:4222 (stream DECISIONS, EVENTS)",
    window: { fromMs, toMs: fromMs + 20 * bucketMs },
    decisions: { read: 1184, evaluated: 1102, rejected: 3, skipped: { "no-prompt-hashes": 61, "unknown-model": 14, "other-schema-version": 4 } },
    events: { applied: 5230, skipped: { "before-window": 212 } },
    fidelity: { evaluated: 1102, reproduced: 1071, ratio: 1071 / 1102, residuals: { "load-race": 19, "missing-kv-event": 9, "tie-break": 3 } },
    strategies: [
      { name: "recorded", decisions: 1102, hitBlocks: 40112, queriedBlocks: 64590, hitRate: 40112 / 64590, meanSpread: 1.52, maxSpread: 3.25, meanRegretBlocks: 4.1 },
      { name: "prefix-cache", decisions: 1102, hitBlocks: 50993.5, queriedBlocks: 64590, hitRate: 50993.5 / 64590, meanSpread: 1.79, maxSpread: 4, meanRegretBlocks: 0.6 },
      { name: "least-request", decisions: 1102, hitBlocks: 20410, queriedBlocks: 64590, hitRate: 20410 / 64590, meanSpread: 1.21, maxSpread: 2, meanRegretBlocks: 17.9 },
    ],
    timeline,
    agreement: {
      strategies: ["recorded", "prefix-cache", "least-request"],
      matrix: [
        [1, 0.81, 0.37],
        [0.81, 1, 0.29],
        [0.37, 0.29, 1],
      ],
    },
    topRegrets: [
      { requestId: EVIL_ID, gateway: "gw-0", ts: fromMs + 101_234, model: "llama-3.1-8b & <friends>", strategy: "least-request", pick: "vllm-2", best: "vllm-0", regretBlocks: 212 },
      { requestId: "8f14e45f-ceea-467a-9b3c-2c1e0d6f7a11", gateway: "gw-1", ts: fromMs + 305_010, model: "llama-3.1-8b", strategy: "recorded", pick: 'vllm-"3"', best: "vllm-1", regretBlocks: 168 },
      { requestId: "c9f0f895-fb98-4b91-8b0f-5f1a9b1c2d33", gateway: "gw-0", ts: fromMs + 512_777, model: "qwen2.5-7b", strategy: "least-request", pick: "vllm-4", best: "vllm-2", regretBlocks: 97.5 },
    ],
    recordedTtft: histogram([12, 88, 301, 402, 190, 71, 27, 11], 142, 1420),
    simulation: [
      { strategy: "prefix-cache", requests: 1102, completed: 1102, ttft: histogram([30, 160, 390, 330, 130, 40, 15, 7], 104, 980), hitRate: 0.71, makespanMs: 601_870 },
      { strategy: "least-request", requests: 1102, completed: 1098, ttft: histogram([5, 41, 180, 370, 300, 140, 45, 17], 231, 1990), hitRate: 0.29, makespanMs: 604_112 },
    ],
    warnings: ["Decisions before 2025-03-14T09:28:00Z were purged from the stream: the window starts later than asked.", "4 decisions have schema version 2 <newer than this jetroute>; they were skipped."],
  };
}

function emptyReport(): ReplayReport {
  const empty: Histogram = { edgesMs: EDGES, counts: EDGES.map(() => 0), n: 0, p50Ms: null, p99Ms: null };
  return {
    report: "jetroute-replay",
    version: 1,
    generatedAt: "2025-03-14T10:02:11.512Z",
    source: "file:decisions.jsonl",
    window: { fromMs: Date.UTC(2025, 2, 14, 9, 30), toMs: Date.UTC(2025, 2, 14, 9, 40) },
    decisions: { read: 0, evaluated: 0, rejected: 0, skipped: {} },
    events: { applied: 0, skipped: {} },
    fidelity: { evaluated: 0, reproduced: 0, ratio: 1, residuals: {} },
    strategies: [],
    timeline: [],
    agreement: { strategies: [], matrix: [] },
    topRegrets: [],
    recordedTtft: empty,
    warnings: [],
  };
}

/** Like toContain, without printing the whole 200 kB document when it fails. */
function expectIn(html: string, s: string, present = true): void {
  expect(html.includes(s), `${present ? "expected" : "did not expect"} ${JSON.stringify(s)} in the document`).toBe(present);
}

function embeddedData(html: string): unknown {
  const m = /<script type="application\/json" id="report-data">([\s\S]*?)<\/script>/.exec(html);
  expect(m).not.toBeNull();
  return JSON.parse(m![1]!);
}

describe("renderReportHtml", () => {
  it("renders a self-contained document with every client string escaped", () => {
    const report = sampleReport();
    const html = renderReportHtml(report);
    expect(html.startsWith("<!doctype html>")).toBe(true);
    expect(html.match(/(src|href|action|poster|srcset)\s*=\s*["']?\s*(https?:)?\/\//i)?.[0]).toBeUndefined();
    expect(html.match(/url\(\s*["']?\s*(https?:)?\/\//i)?.[0]).toBeUndefined();
    expect(html.match(/@import/i)?.[0]).toBeUndefined();
    expectIn(html, "default-src 'none'");
    expectIn(html, "<b>x</b>", false);
    expectIn(html, "req-&#60;/script&#62;&#60;b&#62;x&#60;/b&#62;-0042");
    expectIn(html, "llama-3.1-8b &#38; &#60;friends&#62;");
    expectIn(html, "schema version 2 &#60;newer than this jetroute&#62;");
    // Exactly the three script elements close: the data, Chart.js and the chart builder.
    expect(html.match(/<\/script/gi)).toHaveLength(3);
    expect(embeddedData(html)).toEqual(report);
    const order = ["<h1>jetroute replay</h1>", "<h2>Summary", "<h2>Strategies", 'id="chart-hit-rate"', 'id="chart-spread"', 'id="chart-ttft"', "<h2>Agreement", "<h2>Top regrets", "<h2>Simulation"];
    const at = order.map((s) => html.indexOf(s));
    expect(at.every((i) => i >= 0)).toBe(true);
    expect([...at].sort((a, b) => a - b)).toEqual(at);
    expectIn(html, "97.19%");
  });

  it("says so instead of drawing empty charts", () => {
    const html = renderReportHtml(emptyReport());
    expectIn(html, "<canvas", false);
    expectIn(html, "no decisions in the window");
    expectIn(html, "no TTFT recorded");
    expectIn(html, "<h2>Simulation", false);
    expect(embeddedData(html)).toEqual(emptyReport());
  });
});

describe("the report in a real browser", () => {
  async function open(report: ReplayReport, charts: number, name: string) {
    if (!existsSync(CHROMIUM)) {
      throw new Error(`${CHROMIUM} not found: the report test needs Debian's chromium. Run \`bash scripts/install-deps.sh\` (as root, or: sudo apt-get install -y chromium).`);
    }
    const dir = mkdtempSync(join(tmpdir(), "jetroute-report-"));
    const file = join(dir, `${name}.html`);
    writeReportHtml(file, report);
    const browser = await chromium.launch({
      executablePath: CHROMIUM,
      args: ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
    });
    try {
      const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
      const errors: string[] = [];
      const network: string[] = [];
      page.on("console", (m) => {
        if (m.type() === "error") errors.push(`console: ${m.text()}`);
      });
      page.on("pageerror", (e) => errors.push(`pageerror: ${e.message}`));
      page.on("request", (r) => {
        if (!r.url().startsWith("file:")) network.push(r.url());
      });
      await page.route("**/*", (r) => {
        if (r.request().url().startsWith("file:")) return r.continue();
        network.push(r.request().url());
        return r.abort();
      });
      await page.goto(pathToFileURL(file).href, { waitUntil: "load" });
      await page.waitForFunction(
        `document.documentElement.dataset.report === "ready" && !!window.Chart && Object.keys(Chart.instances).length === ${charts} && [...document.querySelectorAll("canvas")].every((c) => c.dataset.drawn === "1")`,
        undefined,
        { timeout: 15_000 },
      );
      const painted = await page.evaluate<number[]>(
        `[...document.querySelectorAll("canvas")].map((c) => { const d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data; let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i] > 0) n++; return n; })`,
      );
      const shot = join(dir, `${name}.png`);
      await page.screenshot({ path: shot, fullPage: true });
      return { page, browser, errors, network, painted, shot, file };
    } catch (e) {
      await browser.close();
      throw e;
    }
  }

  it("draws every chart offline without an error", { timeout: 60_000 }, async () => {
    const { page, browser, errors, network, painted, shot, file } = await open(sampleReport(), 3, "sample");
    try {
      expect(errors).toEqual([]);
      expect(network).toEqual([]);
      expect(await page.locator("canvas").count()).toBe(3);
      expect(painted).toHaveLength(3);
      for (const n of painted) expect(n).toBeGreaterThan(1000);
      expect(await page.getByText(EVIL_ID, { exact: true }).count()).toBe(1);
      expect(await page.locator("b", { hasText: /^x$/ }).count()).toBe(0);
      expect(await page.locator("h1").textContent()).toBe("jetroute replay");
      console.log(`report: ${statSync(file).size} bytes, screenshot: ${shot}`);
      if (process.env.JETROUTE_UPDATE_SCREENSHOT === "1") copyFileSync(shot, SCREENSHOT);
    } finally {
      await browser.close();
    }
  });

  it("opens an empty report without an error", { timeout: 60_000 }, async () => {
    const { page, browser, errors, network } = await open(emptyReport(), 0, "empty");
    try {
      expect(errors).toEqual([]);
      expect(network).toEqual([]);
      expect(await page.getByText("no decisions in the window").count()).toBe(3);
    } finally {
      await browser.close();
    }
  });
});
