/**
 * `jetroute replay --autoscale` through the built CLI: a recorded window (the replay fixtures'
 * synthetic recording — real Directors of two gateways on four pods — exported to a file) re-run
 * under a policy stored with `jetroute config set-autoscale` on a real nats-server, and under a
 * policy file; a policy `config set-autoscale` would refuse is refused the same way, naming the field.
 */
import { mkdtempSync, writeFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { EXPORT_FORMAT, EXPORT_VERSION, writeExport } from "../services/replay/sources.js";
import { MODEL, synthRecording } from "../services/replay/testing.js";
import { runJetroute as run } from "./harness/cli.js";
import { startTestEnv, type TestEnv } from "./harness/env.js";

describe("jetroute replay --autoscale (the built CLI, a real nats-server)", () => {
  let env: TestEnv;
  let dir: string;
  let file: string;
  const N = 600;
  const policy = { model: MODEL, algorithm: "kpa", metric: "ledger.inFlight", target: 2, minReplicas: 1, maxReplicas: 4, intervalMs: 1000, scrapeIntervalMs: 1000, stableWindowMs: 6_000, panicWindowMs: 2_000, scaleDownDelayMs: 2_000 };

  beforeAll(async () => {
    env = await startTestEnv();
    dir = mkdtempSync(path.join(os.tmpdir(), "jr-autoscale-replay-"));
    file = path.join(dir, "window.jsonl.gz");
    // 600 requests over about 30 s on 4 recorded pods: far less than 4 pods need.
    const rec = synthRecording({ requests: N, pods: 4, gapMs: [20, 80], seed: 7 });
    async function* batches() {
      yield rec.messages;
    }
    await writeExport(file, { format: EXPORT_FORMAT, version: EXPORT_VERSION, prefix: "jr", window: { fromMs: rec.fromMs, toMs: rec.toMs }, createdAt: new Date().toISOString() }, batches());
  }, 60_000);
  afterAll(async () => {
    await env?.stop();
  });

  it("a policy from the config bucket: both fleets side by side as one JSON line; a policy file as a table", async () => {
    const set = await run(["config", "set-autoscale", "chat", "--nats", env.server.url, "--json", JSON.stringify(policy)]);
    expect(set.code, set.stderr).toBe(0);
    const r = await run(["replay", "--file", file, "--nats", env.server.url, "--autoscale", "chat", "--startup-ms", "2000", "--ttft-target-ms", "500", "--json", "--no-progress"]);
    expect(r.code, r.stderr).toBe(0);
    const line = JSON.parse(r.stdout.trim().split("\n").at(-1) as string);
    expect(line).toMatchObject({ autoscale: "chat", policyFrom: "the config bucket (autoscale.chat)", model: MODEL, algorithm: "kpa", metric: "ledger.inFlight", ttftTargetMs: 500, startupMs: 2000, drain: true });
    expect(line.static).toMatchObject({ requests: N, completed: N, pods: { initial: 4, peak: 4 } });
    expect(line.autoscaled).toMatchObject({ requests: N, completed: N, aborted: 0 });
    // The recorded 4 pods are more than this load needs: the policy shrinks the fleet.
    expect(line.autoscaled.scaleEvents).toBeGreaterThan(0);
    expect(line.autoscaled.podSeconds).toBeLessThan(line.static.podSeconds);
    expect(line.ratios.podSeconds).toBeLessThan(1);
    expect(line.autoscaled.evaluations).toBeGreaterThan(10);
    console.error(`replay --autoscale: ${JSON.stringify({ static: line.static, autoscaled: { ...line.autoscaled, events: line.autoscaled.events.length }, ratios: line.ratios })}`);

    const policyFile = path.join(dir, "tighter.json");
    writeFileSync(policyFile, JSON.stringify({ ...policy, target: 4 }));
    const t = await run(["replay", "--file", file, "--autoscale", policyFile, "--startup-ms", "2000"]);
    expect(t.code, t.stderr).toBe(0);
    expect(t.stdout).toMatch(/policy tighter: kpa on ledger.inFlight, target 4 per pod/);
    expect(t.stdout).toMatch(/pod-seconds\s+[\d.]+\s+[\d.]+ \(0\.\d\dx\)/);
    expect(t.stdout).toMatch(/cut by scale-down\s+0\s+0/);
    // The progress bar goes to stderr, the table to stdout.
    expect(t.stderr).toMatch(/what-if autoscaled/);
  }, 120_000);

  it("refuses a policy `config set-autoscale` refuses, naming the field, and a name the bucket does not hold", async () => {
    const bad = path.join(dir, "bad.json");
    writeFileSync(bad, JSON.stringify({ ...policy, minReplicas: 5 }));
    const r = await run(["replay", "--file", file, "--autoscale", bad, "--no-progress"]);
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/invalid autoscaling policy bad: \/minReplicas: 5 is above \/maxReplicas 4/);
    writeFileSync(bad, JSON.stringify({ ...policy, metric: "load.nope" }));
    const m = await run(["replay", "--file", file, "--autoscale", bad, "--no-progress"]);
    expect(m.code).toBe(2);
    expect(m.stderr).toMatch(/\/metric: unknown metric "load.nope"/);
    const missing = await run(["replay", "--file", file, "--nats", env.server.url, "--autoscale", "nope", "--no-progress"]);
    expect(missing.code).toBe(2);
    expect(missing.stderr).toMatch(/no autoscaling policy nope in the config bucket/);
    const other = path.join(dir, "other.json");
    writeFileSync(other, JSON.stringify({ ...policy, model: "another/model" }));
    const o = await run(["replay", "--file", file, "--autoscale", other, "--no-progress"]);
    expect(o.code).toBe(2);
    expect(o.stderr).toMatch(/no routed request of model "another\/model"/);
  }, 60_000);
});
