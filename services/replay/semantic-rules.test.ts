/**
 * `jetroute replay --rules`: decision records written by a real Director for a virtual model,
 * re-decided under a changed rule set from their recorded signals — in the pure core, and through
 * the built CLI on an export file.
 */
import { mkdtempSync, writeFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { runJetroute as run } from "../../test/harness/cli.js";
import { describe, expect, it } from "vitest";
import type { ModelConfig } from "../../schemas/config.js";
import type { DecisionRecord } from "../../schemas/events.js";
import type { SemanticConfig } from "../../schemas/semantic.js";
import { Director } from "../routing/director.js";
import { AUTO, CODER, GENERAL, MATH, putModelConfig, semanticState } from "../routing/semantic/testing.js";
import { FakeClock, MemorySink } from "../routing/stages/testing.js";
import { readRulesFile, replayRules } from "./semantic-rules.js";
import { EXPORT_FORMAT, EXPORT_VERSION, writeExport } from "./sources.js";

const sem = AUTO.semantic as SemanticConfig;

/** Routes and finishes one request per prompt through a Director; returns the decision records. */
function recordsOf(prompts: Array<[string, string, Record<string, string>?]>): DecisionRecord[] {
  const clock = new FakeClock(1_700_000_000_000);
  const state = semanticState();
  putModelConfig(state, "auto", AUTO, 100);
  putModelConfig(state, "strict-auto", { semantic: { ...sem, default: undefined } as SemanticConfig }, 101);
  const sink = new MemorySink();
  const d = new Director({ gatewayId: "gw", defaultStrategy: "least-request", chargeTtlMs: 60_000, state, sink, config: state.configs, clock, now: clock.now });
  for (const [model, content, headers] of prompts) {
    const input = { headers: { "x-request-id": `${model}:${content.slice(0, 20)}`, ...headers }, body: Buffer.from(JSON.stringify({ model, messages: [{ role: "user", content }] })) };
    try {
      const r = d.route(input);
      if (r instanceof Promise) throw new Error("unexpected async route");
      d.finish(r, "completed", { status: 200 });
    } catch (err) {
      d.reject(input.headers, model, err as never);
    }
    clock.advance(10);
  }
  return sink.decisions;
}

const PROMPTS: Array<[string, string, Record<string, string>?]> = [
  ["auto", "write a python function"],
  ["auto", "what is the derivative of x^3"],
  ["auto", "prove that the equation has a solution"],
  ["auto", "tell me about the weather"],
  ["auto", "hello", { user: "vip-user" }],
  ["strict-auto", "good morning"],
];

describe("replay --rules (pure core)", () => {
  const records = recordsOf(PROMPTS);

  it("the same rules move nothing", () => {
    const r = replayRules(records, readRulesFile({ auto: AUTO }));
    expect(r).toMatchObject({ requests: 5, moved: 0, unmatched: 0, unrecorded: [], withoutSignals: 0 });
  });

  it("a changed target, a changed threshold and a new signal: the moves counted, the unrecorded signal named", () => {
    const changed: ModelConfig = {
      semantic: {
        ...sem,
        signals: { ...sem.signals, long: { type: "prompt-tokens", gte: 1 }, legal: { type: "keywords", keywords: ["contract"] } },
        decisions: [
          sem.decisions[0] as SemanticConfig["decisions"][number],
          { ...(sem.decisions[1] as SemanticConfig["decisions"][number]), action: { model: GENERAL } },
          sem.decisions[2] as SemanticConfig["decisions"][number],
          { name: "legal", priority: 30, when: "legal", action: { model: CODER } },
        ],
      },
    };
    const r = replayRules(records, readRulesFile({ auto: changed }));
    // The two math requests go to general; the vip one now has a "long" prompt (>= 1 token) and falls to the default.
    expect(r.moved).toBe(3);
    expect(r.sameModelOtherDecision).toBe(0);
    expect(r.moves).toEqual(
      expect.arrayContaining([
        { virtualModel: "auto", from: `math (${MATH})`, to: `math (${GENERAL})`, count: 2 },
        { virtualModel: "auto", from: `vip (${MATH})`, to: `default (${GENERAL})`, count: 1 },
      ]),
    );
    expect(r.unrecorded).toEqual([{ virtualModel: "auto", signal: "legal", requests: 5 }]);
  });

  it("a rejected request (no decision, no default) is recorded with its signals, and a rule set with a default moves it", () => {
    const rej = records.find((d) => d.model === "strict-auto");
    expect(rej).toMatchObject({ outcome: "rejected", errorCode: "no_matching_decision", semantic: { virtualModel: "strict-auto", decision: "(none)" } });
    const r = replayRules(records, readRulesFile({ "strict-auto": AUTO }));
    expect(r).toMatchObject({ requests: 1, moved: 1, moves: [{ from: "(none) ((rejected))", to: `default (${GENERAL})`, count: 1 }] });
  });

  it("a bad rules file is refused naming the virtual model and the field", () => {
    expect(() => readRulesFile({ auto: { semantic: { ...sem, decisions: [{ name: "x", priority: 1, when: "nope", action: { model: CODER } }] } } })).toThrow(/^auto: \/semantic\/decisions\/0\/when: unknown signal "nope"/);
    expect(() => readRulesFile({ auto: {} })).toThrow(/auto: \/semantic: the config has no rules/);
    expect(() => readRulesFile([])).toThrow(/JSON object/);
  });
});


describe("jetroute replay --rules (the built CLI, on an export file)", () => {
  it("prints how many requests move, and refuses a bad rules file", async () => {
    const records = recordsOf(PROMPTS);
    const dir = mkdtempSync(path.join(os.tmpdir(), "jr-rules-"));
    const file = path.join(dir, "window.jsonl.gz");
    const ts = records.map((r) => r.ts);
    async function* batches() {
      yield records.map((data, i) => ({ stream: "decisions" as const, subject: `jr.decisions.${i}`, seq: i + 1, serverTs: data.ts, data }));
    }
    await writeExport(file, { format: EXPORT_FORMAT, version: EXPORT_VERSION, prefix: "jr", window: { fromMs: Math.min(...ts), toMs: Math.max(...ts) }, createdAt: new Date().toISOString() }, batches());
    const rules = path.join(dir, "rules.json");
    writeFileSync(rules, JSON.stringify({ auto: { semantic: { ...sem, default: { model: CODER } } } }));
    const ok = await run(["replay", "--file", file, "--rules", rules, "--no-progress"]);
    expect(ok.code, ok.stderr).toBe(0);
    const line = JSON.parse(ok.stdout.trim().split("\n").at(-1) as string);
    // The default changed: the one request that fell to it moves.
    expect(line).toMatchObject({ rules, requests: 5, moved: 1, moves: [{ from: `default (${GENERAL})`, to: `default (${CODER})`, count: 1 }] });
    writeFileSync(rules, JSON.stringify({ auto: { semantic: { ...sem, signals: { ...sem.signals, bad: { type: "regex", pattern: "(x)\\1" } } } } }));
    const bad = await run(["replay", "--file", file, "--rules", rules, "--no-progress"]);
    expect(bad.code).not.toBe(0);
    expect(bad.stderr).toMatch(/auto: \/semantic\/signals\/bad\/pattern/);
  }, 30_000);
});
