/**
 * Semantic model selection end to end on a real nats-server: simulated vLLM pods of three real
 * models and an embedding model, a gateway behind the dev front. The virtual model's rules go in
 * with the real CLI (`jetroute config set`), which refuses every bad input naming the field; a
 * request for the virtual model reaches a pod of the chosen model with its body rewritten (the
 * engine answers for that model); a rule change is live on the gateway; `/debug/explain` shows
 * every decision's evaluation.
 */
import { mkdtempSync, writeFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { ModelConfig } from "../schemas/config.js";
import type { SemanticConfig } from "../schemas/semantic.js";
import { type FrontServer, startFront } from "../services/front/front.js";
import type { GatewayHandle } from "../services/gateway/gateway.js";
import { AUTO, CODER, EMBED, GENERAL, MATH } from "../services/routing/semantic/testing.js";
import { type SimFleet, startSimFleet } from "../services/sim/fleet.js";
import { runJetroute as jetroute } from "./harness/cli.js";
import { quietLog, startTestEnv, type TestEnv, waitFor } from "./harness/env.js";


const sem = AUTO.semantic as SemanticConfig;
const WITH_EMBEDDINGS: ModelConfig = {
  semantic: {
    ...sem,
    signals: { ...sem.signals, poetry: { type: "similarity", examples: ["write a poem about the sea", "a short poem about love"], threshold: 0.4 } },
    decisions: [...sem.decisions, { name: "poetry", priority: 1, when: "poetry", action: { model: GENERAL, systemPrompt: { text: "You are a poet." } } }],
    embeddingModel: EMBED,
    embeddingTimeoutMs: 500,
  },
};

describe("semantic model selection - CLI, gateway, front, simulated engines", () => {
  let env: TestEnv;
  const fleets: SimFleet[] = [];
  let gw: GatewayHandle;
  let front: FrontServer;
  let dir: string;
  const set = (model: string, config: unknown, ...extra: string[]) => {
    const file = path.join(dir, `${encodeURIComponent(model)}-${Date.now()}.json`);
    writeFileSync(file, JSON.stringify(config));
    return jetroute(["config", "set", model, "--file", file, "--nats", env.server.url, ...extra]);
  };

  beforeAll(async () => {
    env = await startTestEnv();
    dir = mkdtempSync(path.join(os.tmpdir(), "jr-semantic-"));
    for (const model of [CODER, GENERAL, MATH, EMBED]) {
      const f = await startSimFleet({ pods: 1, model, namePrefix: `${model.split("/")[1]}-`, kvEvents: false, timeScale: 50, logger: quietLog });
      fleets.push(f);
      for (const p of f.pods) await env.publishPod({ model, pod: p.name, address: p.address });
    }
    gw = await env.gateway({ id: "sem-gw", adminPort: 0 });
    await waitFor(() => [CODER, GENERAL, MATH, EMBED].every((m) => gw.views.pods.readyPods(m).length === 1), 10_000, "the pods of every model");
    front = await startFront({ port: 0, host: "127.0.0.1", gateways: [`127.0.0.1:${gw.port}`], logger: quietLog });
  }, 60_000);
  afterAll(async () => {
    await front?.close();
    for (const f of fleets) await f.close();
    await env?.stop();
  });

  it("config set refuses every bad virtual model, naming the field", async () => {
    const cases: Array<[string, unknown, RegExp]> = [
      ["auto", { semantic: { ...sem, decisions: [{ name: "x", priority: 1, when: { any: ["code", "ghost"] }, action: { model: CODER } }] } }, /\/semantic\/decisions\/0\/when\/any\/1: unknown signal "ghost"/],
      ["auto", { semantic: { ...sem, signals: { ...sem.signals, bad: { type: "regex", pattern: "(?<=a)b" } } } }, /\/semantic\/signals\/bad\/pattern: not a valid RE2 regular expression/],
      ["auto", { semantic: { ...sem, default: { model: "auto" } } }, /\/semantic\/default\/model: "auto" targets the virtual model itself \(a cycle\)/],
      ["auto", { semantic: { ...sem, default: { model: "org/nowhere" } } }, /\/semantic\/default\/model: unknown model "org\/nowhere"/],
      ["auto", { semantic: { ...sem, default: { model: GENERAL, profile: "missing" } } }, /\/semantic\/default\/profile: the model "org\/general" has no profile "missing"/],
      ["auto", { semantic: { ...sem, embeddingModel: "org/no-embedder" } }, /\/semantic\/embeddingModel: unknown model/],
    ];
    for (const [model, config, reason] of cases) {
      const r = await set(model, config);
      expect(r.code, `${reason}: ${r.stdout}`).toBe(2);
      expect(r.stderr).toMatch(reason);
    }
    // A chain of virtual models (a decision naming another virtual model) is refused too.
    expect((await set("auto2", { semantic: { ...sem, default: { model: GENERAL } } })).code).toBe(0);
    const chained = await set("auto", { semantic: { ...sem, default: { model: "auto2" } } });
    expect(chained.code).toBe(2);
    expect(chained.stderr).toMatch(/\/semantic\/default\/model: "auto2" is a virtual model/);
    // An operator may store rules for a model the fleet does not serve yet, on purpose.
    expect((await set("later", { semantic: { ...sem, default: { model: "org/tomorrow" } } }, "--allow-unknown-models")).code).toBe(0);
  }, 60_000);

  it("a virtual-model request reaches a pod of the chosen model with its body rewritten; the response names the decision", async () => {
    const ok = await set("auto", WITH_EMBEDDINGS);
    expect(ok.code, ok.stderr).toBe(0);
    await waitFor(() => gw.state.configs.get("auto")?.semantic?.embeddingModel === EMBED, 10_000, "the rules to reach the gateway");
    const ask = (content: string) =>
      fetch(`http://127.0.0.1:${front.port}/v1/chat/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ model: "auto", messages: [{ role: "user", content }], max_tokens: 4 }) });
    const code = await ask("write a python function to sort a list");
    expect(code.status).toBe(200);
    expect(code.headers.get("x-jetroute-decision")).toBe("coding");
    expect(((await code.json()) as { model: string }).model).toBe(CODER);
    const poem = await ask("please write a poem about the sea at night");
    expect(poem.headers.get("x-jetroute-decision")).toBe("poetry");
    expect(((await poem.json()) as { model: string }).model).toBe(GENERAL);
    // A rule change is live: the coding decision now goes to the math model.
    const changed = { semantic: { ...WITH_EMBEDDINGS.semantic, decisions: (WITH_EMBEDDINGS.semantic as SemanticConfig).decisions.map((d) => (d.name === "coding" ? { ...d, action: { model: MATH } } : d)) } };
    expect((await set("auto", changed)).code).toBe(0);
    await waitFor(() => gw.state.configs.get("auto")?.semantic?.decisions[0]?.action.model === MATH, 10_000, "the changed rules");
    const moved = await ask("write a python function to sort a list");
    expect(((await moved.json()) as { model: string }).model).toBe(MATH);
  }, 60_000);

  it("/debug/explain shows every decision's evaluation, the signals and the runner-up", async () => {
    const res = await fetch(`http://127.0.0.1:${gw.adminPort}/debug/explain`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ model: "auto", messages: [{ role: "user", content: "prove that this equation has no integer solution" }] }) });
    expect(res.status).toBe(200);
    const e = (await res.json()) as { model: string; semantic: { decision: string; runnerUp?: string; evaluations: Array<{ decision: string; matched: boolean }>; signals: Record<string, { value: boolean; via?: string }> } };
    expect(e.model).toBe(MATH);
    expect(e.semantic.decision).toBe("math");
    expect(e.semantic.evaluations.map((x) => [x.decision, x.matched])).toEqual([["coding", false], ["math", true], ["vip", false], ["poetry", false]]);
    expect(e.semantic.runnerUp).toBe("default");
    expect(e.semantic.signals.poetry?.via).toBe("embedding");
  });
});
