/**
 * The request body's `priority` over HTTP: validated as the engines validate it, carried into the
 * engine's queue on a pod with priority scheduling, refused by an SGLang pod run with
 * `--abort-on-priority-when-disabled`, and reported as the pod's `schedulingPolicy`.
 */
import { afterEach, describe, expect, it } from "vitest";
import { type SimFleet, startSimFleet, type SimFleetOptions } from "./fleet.js";
import { json, postJson } from "./testing.js";

const MODEL = "demo/llama-3.1-8b";
let fleet: SimFleet | undefined;
afterEach(async () => {
  await fleet?.close();
  fleet = undefined;
});

async function start(o: Partial<SimFleetOptions>): Promise<SimFleet> {
  fleet = await startSimFleet({ pods: 1, model: MODEL, kvEvents: false, maxModelLen: 256, ...o });
  return fleet;
}

async function waitFor(check: () => Promise<boolean>): Promise<void> {
  for (let i = 0; i < 500; i++) {
    if (await check()) return;
    await new Promise((r) => setTimeout(r, 10));
  }
  throw new Error("condition not met in 5 s");
}

describe("priority in the request body", () => {
  it.each([
    ["high", /valid integer/],
    [1.5, /valid integer/],
    [true, /valid integer/],
    [2 ** 64, /less than or equal/],
    [-(2 ** 64), /greater than or equal/],
  ])("answers 400 naming the field for priority %j", async (priority, message) => {
    const f = await start({ schedulingPolicy: "priority" });
    const res = await postJson(f.pods[0]?.address ?? "", "/v1/completions", { prompt: "hello", max_tokens: 2, priority });
    expect(res.status).toBe(400);
    const body = await json(res);
    expect(body.error).toMatchObject({ type: "BadRequestError", param: "priority", code: 400 });
    expect(body.error.message).toMatch(message);
  });

  it("is accepted and ignored by a vLLM pod under FCFS, as vLLM V1 does", async () => {
    const f = await start({});
    const res = await postJson(f.pods[0]?.address ?? "", "/v1/completions", { prompt: "hello", max_tokens: 2, priority: -5 });
    expect(res.status).toBe(200);
    expect(f.pods[0]).not.toHaveProperty("schedulingPolicy");
  });

  it("puts an urgent request ahead of queued batch requests on a vLLM pod with priority scheduling", async () => {
    const f = await start({ schedulingPolicy: "priority", maxBatch: 1, maxModelLen: 4096 });
    const address = f.pods[0]?.address ?? "";
    expect(f.pods[0]?.schedulingPolicy).toBe("priority");
    // A long request holds the only slot until its client leaves.
    const hold = new AbortController();
    const holding = postJson(address, "/v1/completions", { prompt: "hold the slot", max_tokens: 4_000 }, { signal: hold.signal }).catch(() => undefined);
    await waitFor(async () => (await json(fetch(`http://${address}/debug/state`))).running === 1);
    const finished: string[] = [];
    const send = (name: string, priority: number) =>
      json(postJson(address, "/v1/completions", { prompt: `request ${name}`, max_tokens: 3, priority })).then(() => finished.push(name));
    const done = [send("batch-1", 0), send("batch-2", 0), send("batch-3", 0)];
    await waitFor(async () => (await json(fetch(`http://${address}/debug/state`))).waiting === 3);
    done.push(send("urgent", -10));
    await waitFor(async () => (await json(fetch(`http://${address}/debug/state`))).waiting === 4);
    hold.abort();
    await holding;
    await Promise.all(done);
    expect(finished).toEqual(["urgent", "batch-1", "batch-2", "batch-3"]);
  });

  it("is a 503 on an SGLang pod run with --abort-on-priority-when-disabled, and fine without the field", async () => {
    const f = await start({ engine: "sglang", abortOnPriorityWhenDisabled: true });
    const address = f.pods[0]?.address ?? "";
    const res = await postJson(address, "/v1/chat/completions", { messages: [{ role: "user", content: "hi" }], max_tokens: 2, priority: 1 });
    expect(res.status).toBe(503);
    expect((await json(res)).error.message).toMatch(/Using priority is disabled for this server/);
    expect((await postJson(address, "/v1/chat/completions", { messages: [{ role: "user", content: "hi" }], max_tokens: 2 })).status).toBe(200);
  });

  it("reports SGLang's sign: priority, or priority-low-values-first", async () => {
    const f = await start({ pods: 3, engine: "sglang", schedulingPolicy: ["priority", "fcfs"], scheduleLowPriorityValuesFirst: true });
    expect(f.pods.map((p) => p.schedulingPolicy)).toEqual(["priority-low-values-first", undefined, "priority-low-values-first"]);
    const state = await json(fetch(`http://${f.pods[0]?.address}/debug/state`));
    expect(state.schedulingPolicy).toBe("priority-low-values-first");
    expect(state.config.scheduling).toEqual({ flavour: "sglang", lowValuesFirst: true, preemption: true, preemptionThreshold: 10 });
  });
});
