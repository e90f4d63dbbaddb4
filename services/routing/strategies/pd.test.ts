import { describe, expect, it } from "vitest";
import type { Outstanding } from "../../views/charge-ledger.js";
import { LoadView } from "../../views/load-view.js";
import type { PodInfo } from "../../views/pod-set.js";
import { DEFAULT_PD_CONFIG, type PdConfig, type PdPlan, type PdStrategy, pdConfigOf, planPd, rolesetsOf } from "./pd.js";
import { parseStrategy } from "./registry.js";
import { NOW, pod } from "./testing.js";
import type { PrefixMatchInfo } from "./types.js";

const p = (name: string, role: PodInfo["role"], roleset?: string, extra: Partial<PodInfo> = {}): PodInfo => ({ ...pod(name), role, ...(roleset ? { roleset } : {}), ...extra });

function plan(pods: PodInfo[], o: { inFlight?: Record<string, number>; kv?: Record<string, number>; tokens?: number; matched?: Record<string, number>; config?: Partial<PdConfig>; random?: () => number } = {}): PdPlan {
  const load = new LoadView();
  for (const [name, kv] of Object.entries(o.kv ?? {})) {
    load.apply({ type: "load", model: "m", pod: name, ts: NOW, stale: false, load: { running: 0, waiting: 0, kvCacheUsage: kv, prefixCacheQueries: null, prefixCacheHits: null, cacheHitRate: null, promptTokens: null, generationTokens: null, genThroughput: null, preemptions: null, blockSize: null, numGpuBlocks: null, runningLoras: [], waitingLoras: [], maxLora: null, histograms: {} } });
  }
  const ledger = { outstanding: (_m: string, name: string): Outstanding => ({ requests: o.inFlight?.[name] ?? 0, promptTokens: 0, prefillRequests: 0, prefillTokens: 0 }) };
  const tokens = o.tokens ?? 1000;
  const prefix: PrefixMatchInfo | undefined = o.matched ? { queried: Math.floor(tokens / 16), blockSize: 16, matched: (name) => o.matched?.[name] ?? 0 } : undefined;
  return planPd({
    request: { model: "m", requestId: "r", promptTokens: tokens },
    pods,
    load,
    ledger,
    now: NOW,
    random: o.random ?? (() => 0),
    ...(prefix ? { prefix } : {}),
    config: { ...DEFAULT_PD_CONFIG, ...o.config },
  });
}

const names = (x: PdPlan) => (x.kind === "pd" ? `${x.roleset}:${x.prefill.pod}>${x.decode.pod}` : `combined:${x.reason}`);

describe("pd - rolesets", () => {
  it("a roleset needs a prefill and a decode pod of one engine; the rest is reported, not an error", () => {
    const sets = rolesetsOf([
      p("a-p", "prefill", "a"),
      p("a-d", "decode", "a"),
      p("b-p", "prefill", "b"),
      p("c-d", "decode", "c"),
      p("d-p", "prefill", "d"),
      p("d-d", "decode", "d", { engine: "sglang" }),
      p("x", "combined"),
    ]);
    expect(sets.usable.map((r) => r.name)).toEqual(["a"]);
    expect(sets.unusable).toEqual([
      { name: "b", reason: "no-decode" },
      { name: "c", reason: "no-prefill" },
      { name: "d", reason: "mixed-engines" },
    ]);
    expect(sets.combined.map((x) => x.pod)).toEqual(["x"]);
  });

  it("pods without a roleset label form the default roleset", () => {
    expect(names(plan([p("p1", "prefill"), p("d1", "decode")]))).toBe("default:p1>d1");
  });
});

describe("pd - combined fallback", () => {
  it("no usable roleset: combined", () => {
    expect(names(plan([p("p1", "prefill", "a"), p("x", "combined")]))).toBe("combined:no-usable-roleset");
  });
  it("a prompt under minPromptTokens goes to combined pods, but only when there are some", () => {
    const pods = [p("p1", "prefill"), p("d1", "decode"), p("x", "combined")];
    expect(names(plan(pods, { tokens: 100, config: { minPromptTokens: 512 } }))).toBe("combined:short-prompt");
    expect(names(plan(pods.slice(0, 2), { tokens: 100, config: { minPromptTokens: 512 } }))).toBe("default:p1>d1");
  });
  it("prompt-length buckets choose the roleset; none fits: combined", () => {
    const short = { labels: { "prompt-len-bucket-max-length": "2048" } };
    const long = { labels: { "prompt-len-bucket-min-length": "2048" } };
    const pods = [p("s-p", "prefill", "short", short), p("s-d", "decode", "short", short), p("l-p", "prefill", "long", long), p("l-d", "decode", "long", long)];
    expect(names(plan(pods, { tokens: 500 }))).toBe("short:s-p>s-d");
    expect(names(plan(pods, { tokens: 5000 }))).toBe("long:l-p>l-d");
    const narrow = [p("n-p", "prefill", "n", short), p("n-d", "decode", "n", short)];
    expect(names(plan(narrow, { tokens: 5000 }))).toBe("combined:no-bucket");
  });
  it("malformed bucket labels declare nothing", () => {
    const bad = { labels: { "prompt-len-bucket-max-length": "-3", "prompt-len-bucket-min-length": "1e9" } };
    expect(names(plan([p("p1", "prefill", "a", bad), p("d1", "decode", "a", bad)], { tokens: 100 }))).toBe("a:p1>d1");
  });
});

describe("pd - scoring", () => {
  const pods = [p("a-p", "prefill", "a"), p("a-d", "decode", "a"), p("b-p", "prefill", "b"), p("b-d", "decode", "b")];
  it("prefill follows the cached prefix, decode the pending decode load, both from the shared ledger", () => {
    expect(names(plan(pods, { matched: { "b-p": 50 } }))).toBe("b:b-p>b-d");
    expect(names(plan(pods, { inFlight: { "a-p": 3, "b-p": 0, "a-d": 0, "b-d": 4 } }))).toBe("a:a-p>a-d");
  });
  it("KV cache usage of decode pods counts", () => {
    expect(names(plan(pods, { kv: { "a-d": 0.9, "b-d": 0.1 } }))).toBe("b:b-p>b-d");
  });
  it("prefill imbalance over the threshold: the least loaded prefill pod wins outright", () => {
    // b-p holds the whole prompt, but a-p is idle while b-p has 20 prefills in flight.
    const x = plan(pods, { matched: { "b-p": 62 }, inFlight: { "b-p": 20 } });
    expect(names(x)).toBe("a:a-p>a-d");
    expect(x.kind === "pd" && x.fastPath).toBe("prefill-imbalance");
  });
  it("decode imbalance over the threshold: the least loaded decode pod wins outright", () => {
    const x = plan(pods, { inFlight: { "a-d": 30, "b-d": 1 }, matched: { "a-p": 62 } });
    expect(names(x)).toBe("b:b-p>b-d");
    expect(x.kind === "pd" && x.fastPath).toBe("decode-imbalance");
  });
  it("ties are broken by the injected random draw", () => {
    const picks = new Set([0, 0.99].map((r) => names(plan(pods, { random: () => r }))));
    expect(picks.size).toBe(2);
  });
});

describe("pd - decider", () => {
  const pods = [p("p1", "prefill"), p("d1", "decode"), p("d2", "decode")];
  it("skips the prefill leg on vLLM when the decode pod misses fewer tokens than the threshold", () => {
    const x = plan(pods, { tokens: 1000, matched: { d1: 60, d2: 0 }, inFlight: { d2: 0, d1: 0 }, config: { skipPrefillBelowTokens: 64 } });
    // d1 holds 960 of 1000 tokens: 40 uncached < 64.
    expect(x.kind === "pd" && x.decode.pod === "d1" ? x.skipPrefill : "decode was not d1").toBe(true);
    const y = plan(pods, { tokens: 1000, matched: { d1: 10 }, config: { skipPrefillBelowTokens: 64 }, random: () => 0 });
    expect(y.kind === "pd" && y.skipPrefill).toBe(false);
  });
  it("never skips on SGLang (its decode servers need the bootstrap handoff)", () => {
    const sg = pods.map((x) => ({ ...x, engine: "sglang" as const }));
    const x = plan(sg, { tokens: 1000, matched: { d1: 62, d2: 62 }, config: { skipPrefillBelowTokens: 64 } });
    expect(x.kind === "pd" && x.skipPrefill).toBe(false);
  });
});

describe("pd - the strategy", () => {
  it("is registered, exclusive, and takes only its own parameters", () => {
    const s = parseStrategy("pd");
    expect((s as PdStrategy).config).toEqual(DEFAULT_PD_CONFIG);
    expect(s.traits).toMatchObject({ disaggregated: true, prefixMatch: true });
    expect(s.exclusive).toBe(true);
    expect(pdConfigOf({ minPromptTokens: 256 }).minPromptTokens).toBe(256);
    expect(() => pdConfigOf({ bogus: 1 })).toThrow(/no parameter "bogus"/);
    expect(() => pdConfigOf({ minPromptTokens: -1 })).toThrow(/>= 0/);
  });
});
