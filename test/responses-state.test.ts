/**
 * The Responses API's state held by the fleet, end to end with the official `openai` client:
 * three simulated pods, three gateway replicas (`--auth required`) behind the dev front, a real
 * nats-server. A conversation continued by `previous_response_id` goes to the pod holding each
 * turn whichever replica routes it; retrieve, input_items and delete work (the last two from the
 * store, which the engines lack); a pod killed mid-conversation and a pod that lost its memory
 * (restarted) both leave the next turn answered, from the response store; another tenant's key
 * gets 404 for every id of the first (never 403).
 */
import { Kvm } from "@nats-io/kv";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { ApiKeyRecord } from "../schemas/config.js";
import type { DecisionRecord } from "../schemas/events.js";
import { type FrontServer, startFront } from "../services/front/front.js";
import { apiKeyBucketKey, generateApiKey, hashApiKey } from "../services/gateway/auth.js";
import type { GatewayHandle } from "../services/gateway/gateway.js";
import { type SimFleet, startSimFleet } from "../services/sim/fleet.js";
import { acked } from "../services/shared/publish.js";
import { configBucketName } from "../streams/definitions.js";
import { MODEL, quietLog, startTestEnv, type TestEnv, waitFor } from "./harness/env.js";

describe("Responses API state - 3 gateway replicas behind the dev front, official openai client", () => {
  let env: TestEnv;
  let fleet: SimFleet;
  let front: FrontServer;
  const gws: GatewayHandle[] = [];
  const keys = { alice: "", bob: "" };
  const decisions = new Map<string, DecisionRecord>();
  let alice: OpenAI;
  let bob: OpenAI;

  beforeAll(async () => {
    env = await startTestEnv();
    fleet = await startSimFleet({ pods: 3, model: MODEL, timeScale: 50, logger: quietLog });
    for (const p of fleet.pods) await env.publishPod({ pod: p.name, address: p.address });
    const kv = await new Kvm(env.nats.nc).open(configBucketName("jr"));
    for (const user of ["alice", "bob"] as const) {
      const key = generateApiKey();
      const rec: ApiKeyRecord = { user, createdAt: Date.now() };
      await kv.create(apiKeyBucketKey(hashApiKey(key)), JSON.stringify(rec));
      keys[user] = key;
    }
    for (const id of ["resp-gw-1", "resp-gw-2", "resp-gw-3"]) gws.push(await env.gateway({ id, auth: "required", defaultStrategy: "least-request" }));
    await waitFor(() => gws.every((g) => g.apiKeys.size === 2), 5_000, "the keys to reach every gateway");
    front = await startFront({ port: 0, host: "127.0.0.1", gateways: gws.map((g) => `127.0.0.1:${g.port}`), logger: quietLog });
    env.nats.nc.subscribe(env.subjects.all("decisions"), {
      callback: (_e, m) => {
        const d = m.json<DecisionRecord>();
        decisions.set(d.id, d);
      },
    });
    await env.nats.nc.flush();
    const client = (apiKey: string) => new OpenAI({ baseURL: `http://127.0.0.1:${front.port}/v1`, apiKey, maxRetries: 0, timeout: 30_000 });
    alice = client(keys.alice);
    bob = client(keys.bob);
  }, 60_000);
  afterAll(async () => {
    await front?.close();
    await fleet?.close();
    await env?.stop();
  });

  /** Every replica has folded where `id` lives. */
  const everywhere = (id: string) => waitFor(() => gws.every((g) => g.state.responses.get(id, Date.now()) !== undefined), 10_000, `every replica to fold the location of ${id}`);
  /** The decision record of the request `x-request-id` named. */
  const decisionOf = async (requestId: string) => {
    await waitFor(() => decisions.has(requestId), 10_000, `the decision record of ${requestId}`);
    return decisions.get(requestId) as DecisionRecord & { pick: string };
  };
  const turn = (id: string, input: string, previous?: string, o: Record<string, unknown> = {}) =>
    alice.responses.create({ model: MODEL, input, max_output_tokens: 6, ...(previous ? { previous_response_id: previous } : {}), ...o }, { headers: { "x-request-id": id } });

  let first = "";
  let last = "";
  let ownerOfLast = "";

  it("a conversation continued by previous_response_id goes to the pod holding each turn, whichever replica routes it", async () => {
    const r1 = await turn("conv-1", "Hello there, how are you?", undefined, { instructions: "Answer briefly." });
    expect(r1.id).toMatch(/^resp/);
    expect(r1.status).toBe("completed");
    first = r1.id;
    let prev = r1.id;
    let owner = (await decisionOf("conv-1")).pick;
    for (let i = 2; i <= 7; i++) {
      await everywhere(prev);
      const r = await turn(`conv-${i}`, `And then, number ${i}?`, prev);
      expect(r.status).toBe("completed");
      const d = await decisionOf(`conv-${i}`);
      expect(d.responseAffinity).toEqual({ action: "pin", reason: "owner", owner });
      expect(d.pick).toBe(owner);
      prev = r.id;
      owner = d.pick;
    }
    // The three replicas each routed some of the turns (the front spreads requests over them).
    const routedBy = new Set([...decisions.values()].filter((d) => d.id.startsWith("conv-")).map((d) => d.gateway));
    expect(routedBy.size).toBeGreaterThan(1);
    last = prev;
    ownerOfLast = owner;
    // Every turn recorded once (by the replica that routed it) and stored.
    const sum = (k: string) => gws.reduce((n, g) => n + (g.responses?.figures()[k] ?? 0), 0);
    await waitFor(() => sum("recorded") >= 7, 5_000, "7 turns recorded");
    // Every replica folds the 7 locations from the stream: the last one may still be on its way.
    const locations = () => gws.map((g) => g.responses?.figures().locations);
    await waitFor(() => locations().every((n) => n !== undefined && n >= 7), 10_000, () => `every replica to fold 7 locations (${locations().join(", ")})`);
    expect(sum("recorded")).toBe(7);
    expect(sum("stored")).toBe(7);
    expect(locations()).toEqual([7, 7, 7]);
  });

  it("a streamed turn is recorded too; retrieve and cancel go to its pod", async () => {
    await everywhere(last);
    const stream = await alice.responses.create({ model: MODEL, input: "Stream it please.", previous_response_id: last, max_output_tokens: 6, stream: true }, { headers: { "x-request-id": "conv-stream" } });
    let completedId = "";
    for await (const ev of stream) if (ev.type === "response.completed") completedId = ev.response.id;
    expect(completedId).toMatch(/^resp/);
    await everywhere(completedId);
    const forwarded = () => gws.reduce((n, g) => n + (g.responses?.counters.forwarded ?? 0), 0);
    const before = forwarded();
    const got = await alice.responses.retrieve(completedId);
    expect(got.id).toBe(completedId);
    expect(got.previous_response_id).toBe(last);
    // cancel goes to the pod too, which answers as vLLM does for a finished response.
    await expect(alice.responses.cancel(completedId)).rejects.toMatchObject({ status: 400 });
    expect(forwarded()).toBe(before + 2);
    last = completedId;
  });

  it("a turn sent the moment its predecessor's stream ended is continued (no wait for the record)", async () => {
    let prev = last;
    for (let i = 0; i < 4; i++) {
      const stream = await alice.responses.create({ model: MODEL, input: `Quick ${i}.`, previous_response_id: prev, max_output_tokens: 4, stream: true }, { headers: { "x-request-id": `quick-${i}` } });
      let id = "";
      for await (const ev of stream) if (ev.type === "response.completed") id = ev.response.id;
      expect(id).toMatch(/^resp/);
      prev = id;
    }
    last = prev;
  });

  it("input_items and delete are answered from the store (the engines have neither)", async () => {
    const page = await alice.responses.inputItems.list(first, { order: "asc" });
    expect(page.data.length).toBe(1);
    expect(JSON.stringify(page.data[0])).toContain("Hello there");
    const r = await turn("conv-del", "A turn to delete.", last);
    await everywhere(r.id);
    await alice.responses.delete(r.id);
    await expect(alice.responses.inputItems.list(r.id)).rejects.toMatchObject({ status: 404 });
    await waitFor(() => gws.every((g) => g.state.responses.get(r.id, Date.now()) === undefined), 10_000, "every replica to forget the deleted response");
    await expect(turn("conv-after-del", "Continue the deleted one.", r.id)).rejects.toMatchObject({ status: 404 });
  });

  it("another tenant's key can neither continue nor read a response: 404, not 403", async () => {
    await expect(bob.responses.create({ model: MODEL, input: "Let me in.", previous_response_id: last, max_output_tokens: 4 })).rejects.toMatchObject({ status: 404 });
    await expect(bob.responses.retrieve(last)).rejects.toMatchObject({ status: 404 });
    await expect(bob.responses.inputItems.list(first)).rejects.toMatchObject({ status: 404 });
    await expect(bob.responses.delete(first)).rejects.toMatchObject({ status: 404 });
    // Alice still has all of it.
    expect((await alice.responses.retrieve(last)).id).toBe(last);
  });

  it("a pod that lost its memory (restarted) answers the next turn through the store", async () => {
    const owner = (await decisionOf("conv-stream")).pick;
    fleet.restart(owner);
    const before = gws.reduce((n, g) => n + (g.responses?.counters.recoveries ?? 0), 0);
    const r = await turn("conv-restarted", "Do you still remember?", last);
    expect(r.status).toBe("completed");
    expect(gws.reduce((n, g) => n + (g.responses?.counters.recoveries ?? 0), 0)).toBe(before + 1);
    last = r.id;
    ownerOfLast = (await decisionOf("conv-restarted")).pick;
  });

  it("a pod killed mid-conversation: the next turn is expanded from the store and answered by another pod", async () => {
    await everywhere(last);
    const victim = ownerOfLast;
    const pod = fleet.pods.find((p) => p.name === victim);
    if (!pod) throw new Error(`no pod ${victim}`);
    await fleet.stop(victim);
    await acked(env.nats.js, env.subjects.pod(MODEL, victim), { type: "pod", action: "remove", model: MODEL, pod: victim, address: pod.address, ready: false, engine: "vllm", ts: Date.now() });
    await waitFor(() => gws.every((g) => g.state.pods.readyPods(MODEL).every((p) => p.pod !== victim)), 10_000, "every replica to drop the killed pod");
    const r = await turn("conv-killed", "Still there?", last);
    expect(r.status).toBe("completed");
    const d = await decisionOf("conv-killed");
    expect(d.pick).not.toBe(victim);
    expect(d.responseAffinity).toMatchObject({ action: "expand", reason: "owner-gone", owner: victim });
    expect(d.responseAffinity?.turns).toBeGreaterThanOrEqual(8);
    // And the conversation goes on from the new pod.
    await everywhere(r.id);
    const next = await turn("conv-after-kill", "Good.", r.id);
    expect((await decisionOf("conv-after-kill")).responseAffinity).toMatchObject({ action: "pin", reason: "owner", owner: d.pick });
    expect(next.status).toBe("completed");
  });
});
